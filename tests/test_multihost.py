"""Two processes on localhost (jax.distributed, CPU, gloo) give the one-process metrics."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

# Its long-tier tests time their processes: they run alone (`serial`, tests/conftest.py).

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = 'from tests.shared import tiny_config\n\ndef get_config():\n  return tiny_config(rounds=2)\n'
# Compared columns: everything that is computed (accuracies, losses, bytes,
# counts), never timings.
SKIP = ('round_time_s', 'compile_s')   # timings


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict:
  return dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu',
              XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')


def _cmd(cfg, workdir, *extra):
  return [sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}', f'--workdir={workdir}',
          '--noprogress', *extra]


def _rows(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def _launch(cfg, workdir, n_proc, devices, *extra, timeout=240):
  """Runs ``n_proc`` processes of one job; returns their CompletedProcess-like results."""
  port = _free_port()
  procs = [subprocess.Popen(
      _cmd(cfg, workdir, f'--coordinator_address=127.0.0.1:{port}',
           f'--num_processes={n_proc}', f'--process_id={i}', *extra),
      cwd=REPO, env=_env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(n_proc)]
  outs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=timeout)
      outs.append((p.returncode, out))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  return outs


def _assert_same_rows(got, want):
  assert [r['round'] for r in got] == [r['round'] for r in want]
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for k in w:
      if k in SKIP:
        continue
      if isinstance(w[k], float):
        np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-6, err_msg=k)
      else:
        assert g[k] == w[k], k


@pytest.mark.slow
@pytest.mark.serial
def test_two_processes_match_one_process(tmp_path):
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(CONFIG)
  # One process with 2 devices vs 2 processes with 1 device each: the same mesh size.
  one = tmp_path / 'one'
  r = subprocess.run(_cmd(cfg, one), cwd=REPO, env=_env(2), capture_output=True, text=True,
                     timeout=240)
  assert r.returncode == 0, r.stdout + r.stderr
  two = tmp_path / 'two'
  outs = _launch(cfg, two, 2, 1)
  for i, (rc, out) in enumerate(outs):
    assert rc == 0, f'process {i}:\n{out[-3000:]}'
  _assert_same_rows(_rows(two), _rows(one))
  assert os.path.exists(two / 'summary.json')
  # The checkpoint at the last round was written jointly (orbax commits it from process 0).
  assert sorted(os.listdir(two / 'checkpoints')) == ['2']


@pytest.mark.parametrize('flags,named', [
    (['--num_processes=2', '--process_id=0'], '--coordinator_address'),
    (['--coordinator_address=127.0.0.1:1', '--num_processes=2', '--process_id=2'],
     '--process_id'),
])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, flags, named):
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(CONFIG)
  r = subprocess.run(_cmd(cfg, tmp_path / 'run', *flags), cwd=REPO, env=_env(1),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stdout + r.stderr
  assert f'error: {named}=' in r.stderr, r.stderr
  assert not os.path.exists(tmp_path / 'run' / 'metrics.jsonl')


def test_check_flags_in_process():
  from fedjax_kd.running import distributed
  from fedjax_kd.errors import ConfigError
  assert distributed.check_flags(None, None, None) is False
  assert distributed.check_flags('h:1', 2, 1) is True
  with pytest.raises(ConfigError, match='--process_id'):
    distributed.check_flags('h:1', 2, 5)
  with pytest.raises(ConfigError, match='--num_processes'):
    distributed.check_flags('h:1', 0, 0)
  with pytest.raises(ConfigError, match='--coordinator_address'):
    distributed.check_flags('localhost', 2, 0)
  # A single-process run never touches jax.distributed.
  assert distributed.initialize() == (0, 1)
