"""Nothing lost: orbax checkpoints, SIGKILL/SIGTERM and resume, the NaN guard,
crash-safe metrics files, TensorBoard scalars and the closing table."""

import glob
import json
import os
import signal
import struct
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import algorithms
from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.algorithms import base
from fedjax_kd.errors import ConfigError, DataError, DivergenceError
from fedjax_kd.running import results
from fedjax_kd.running import session as session_lib
from fedjax_kd.running import workdir as workdir_lib
from tests.shared import TINY_FILE, tiny_config
from tests.test_main import REPO


def _run(c, workdir, **kw):
  return runner.run(config_lib.validate(c), str(workdir), progress=False, **kw)


def _deterministic(rows):
  """Every column but timings."""
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


def _steps(workdir):
  d = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(d):
    return []
  return sorted(int(n) for n in os.listdir(d) if n.isdigit())


def _cli(cfg, workdir):
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')
  return subprocess.Popen([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                           f'--workdir={workdir}'], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(pred, proc, timeout=240):
  t0 = time.time()
  while not pred():
    if proc.poll() is not None:
      raise AssertionError(f'the run ended before it could be stopped:\n{proc.stderr.read()}')
    if time.time() - t0 > timeout:
      proc.kill()
      raise AssertionError('timed out')
    time.sleep(0.02)


ROUNDS = 14


def _kill_config():
  c = tiny_config(rounds=ROUNDS)
  c.checkpoint.every = 2
  return c


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path):
  reference = tmp_path / 'reference'
  _run(_kill_config(), reference)
  cfg = tmp_path / 'cfg.py'
  cfg.write_text('from tests.test_reliability import _kill_config\n\n'
                 'def get_config():\n  return _kill_config()\n')
  work = tmp_path / 'killed'
  # SIGKILL as soon as the first checkpoint is complete: no chance to clean up.
  proc = _cli(cfg, work)
  _wait_for(lambda: _steps(work), proc)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (work / 'summary.json').exists()         # it really died mid-way
  killed_at = _steps(work)[-1]
  assert killed_at < ROUNDS
  workdir_lib.read_metrics(str(work))                  # readable whatever the kill hit
  # Resume (the runner behind the same command) and finish.
  logs = []
  summary = runner.run(config_lib.validate(_kill_config()), str(work), progress=True,
                       log=logs.append)
  # The header says what runs; the first line after it that is not round 1's compile
  # progress says where it resumed.
  assert logs[0].startswith('fedjax_kd ') and ' | dsfl | ' in logs[0], logs[0]
  assert [m for m in logs[1:] if ': compil' not in m][0] == (
      f'resumed from {work}/checkpoints after round {killed_at}')
  assert summary['rounds_run_this_call'] == ROUNDS - killed_at
  a = workdir_lib.read_metrics(str(reference))
  b = workdir_lib.read_metrics(str(work))
  assert [r['round'] for r in b] == list(range(1, ROUNDS + 1))
  assert _deterministic(a) == _deterministic(b)
  sa = json.loads((reference / 'summary.json').read_text())
  for key in ('final_acc', 'top_acc', 'top_round', 'cum_bytes', 'cum_up_bytes',
              'cum_down_bytes', 'setup_bytes'):
    assert sa[key] == summary[key], key
  assert _steps(work) == [ROUNDS - 2, ROUNDS]          # checkpoint.keep = 2
  # TensorBoard is rebuilt from metrics.jsonl on resume: every round once, equal to the rows
  # (the killed process's unflushed events and its rows after the checkpoint are gone).
  acc = [(step, v) for tag, step, v in _events(work / 'tensorboard') if tag == 'test_acc']
  assert [step for step, _ in acc] == list(range(1, ROUNDS + 1))
  assert [v for _, v in acc] == pytest.approx([r['test_acc'] for r in b])


@pytest.mark.slow
def test_sigterm_finishes_the_round_checkpoints_and_stops(tmp_path):
  c = tiny_config(rounds=5)
  c.checkpoint.every = 0 + 3     # the stop saves round 2 although 2 is not a multiple

  def log(line):
    if line.startswith('round    2/5'):
      os.kill(os.getpid(), signal.SIGTERM)   # preemption arrives after round 2

  previous = signal.getsignal(signal.SIGTERM)
  summary = runner.run(config_lib.validate(c), str(tmp_path), log=log)
  assert signal.getsignal(signal.SIGTERM) is previous   # handler restored
  assert summary['stopped_by'] == 'SIGTERM' and summary['rounds'] == 2
  assert _steps(tmp_path) == [2]
  summary = _run(c, tmp_path)
  assert summary['rounds_run_this_call'] == 3 and 'stopped_by' not in summary
  assert _steps(tmp_path) == [3, 5]


@pytest.mark.slow
def test_checkpoint_holds_the_whole_state_bit_for_bit(tmp_path):
  from fedjax_kd.running import checkpoint
  from fedjax_kd.running import experiment
  c = tiny_config('scarlet', rounds=2)
  c.train.momentum = 0.9   # a non-empty optimizer state
  spec = config_lib.validate(c)
  algo = experiment.build(spec).algorithm
  state, _ = base.play_round(algo, algo.init(), 1, np.ones(spec.clients.num_clients, bool))
  ck = checkpoint.Checkpointer(str(tmp_path))
  meta = {'round': 1, 'cum_bytes': {'up': 3, 'down': 4, 'total': 7}}
  ck.save(1, state, meta)
  restored, got = checkpoint.Checkpointer(str(tmp_path)).restore(algo.init())
  assert got == meta
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert x.dtype == y.dtype
  # Client and server models, optimizer states and SCARLET's cache with its stamps.
  assert state.extra.cache_labels is not None and state.extra.cache_stamp is not None
  assert len(jax.tree.leaves(state.clients[0].opt_state)) > 0


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_checkpoint_of_another_experiment_is_a_clear_error(tmp_path):
  c = tiny_config(rounds=1)
  c.checkpoint.every = 1
  _run(c, tmp_path)
  with pytest.raises(ConfigError, match='--workdir'):
    c2 = tiny_config(rounds=1)
    c2.clients.models = ['mlp@1.0']
    _run(c2, tmp_path)
  # With config.json gone, what the checkpoints belong to is unknown: refused.
  os.remove(tmp_path / 'config.json')
  c2 = tiny_config(rounds=1)
  c2.clients.models = ['mlp@1.0']
  with pytest.raises(ConfigError, match='has checkpoints but no config.json'):
    _run(c2, tmp_path)
  # A config.json that claims the new config: the shapes still do not fit, a DataError,
  # not a crash.
  (tmp_path / 'config.json').write_text(session_lib.config_json(config_lib.validate(c2)))
  with pytest.raises(DataError, match='checkpoint'):
    _run(c2, tmp_path)


def _poison_round(monkeypatch, at: int):
  """Makes DS-FL's round ``at`` write NaN into the first row of cohort 1."""
  cls = algorithms.ALGORITHMS['dsfl']
  original = cls.round

  def poisoned(self, state, r):
    state, out = original(self, state, r)
    if r.t == at:
      bad = state.clients[1].replace(params=jax.tree.map(
          lambda x: x.at[0].set(jnp.nan), state.clients[1].params))
      state = state.replace(clients=(state.clients[0], bad) + tuple(state.clients[2:]))
    return state, out

  monkeypatch.setattr(cls, 'round', poisoned)


@pytest.mark.slow
def test_nan_round_stops_names_round_cohort_and_array_and_keeps_checkpoint(
    tmp_path, monkeypatch):
  c = tiny_config(rounds=4)
  c.checkpoint.every = 1
  _poison_round(monkeypatch, at=3)
  with pytest.raises(DivergenceError) as e:
    _run(c, tmp_path)
  msg = str(e.value)
  assert e.value.round == 3 and e.value.cohort == [0, 1, 2, 3]
  assert msg.startswith('round 3 produced NaN or Inf in clients[1].params')
  # Cohort 1 holds the 'mlp@0.5' clients 1 and 3; row 0 is client 1.
  assert '(clients 1)' in msg and 'clients[0]' not in msg
  assert 'the last good checkpoint (round 2)' in msg
  assert _steps(tmp_path) == [1, 2]
  assert [r['round'] for r in workdir_lib.read_metrics(str(tmp_path))] == [1, 2]
  # Fixed (here: un-poisoned), the same command resumes from round 2.
  monkeypatch.undo()
  summary = _run(c, tmp_path)
  assert summary['rounds_run_this_call'] == 2 and summary['rounds'] == 4


@pytest.mark.slow
def test_a_diverging_learning_rate_is_caught_in_round_one(tmp_path):
  c = tiny_config(rounds=3)
  c.train.learning_rate = 1e30
  with pytest.raises(DivergenceError, match='round 1 produced NaN or Inf') as e:
    _run(c, tmp_path)
  assert 'train.learning_rate' in str(e.value) and 'starts over' in str(e.value)
  assert not (tmp_path / 'summary.json').exists()


def test_the_guard_names_the_phase_that_went_non_finite_first():
  """Local training, then the server's arrays, then distillation: the first phase whose
  own output is non-finite decides the advice."""
  params = ["clients[0].params: 6 of 6 arrays, e.g. ['Dense_0']['bias'] (clients 0)"]
  labels = ["extra.prev_server_labels: 1 of 1 arrays"]
  msg = session_lib._first_nonfinite(params + labels, ['train_loss', 'distill_loss'])
  assert msg.startswith('It went non-finite first in local training (train_loss)')
  msg = session_lib._first_nonfinite(params + labels, ['distill_loss'])   # an ERA at T = 1e-30
  assert "the server's arrays went non-finite first (extra.prev_server_labels)" in msg
  assert 'temperature' in msg and 'before the learning rates' in msg
  msg = session_lib._first_nonfinite(params, ['distill_loss', 'server_distill_loss'])
  assert 'it went non-finite in distill_loss, server_distill_loss: lower distill.' in msg
  assert session_lib._first_nonfinite(params, []).startswith('Lower train.learning_rate')


def test_nonfinite_arrays_is_empty_for_finite_states_and_ignores_integers():
  state = {'a': jnp.ones((3, 2)), 'n': jnp.array([1, 2], jnp.int32)}
  assert session_lib.nonfinite_arrays(state) == []
  state['b'] = jnp.array([1.0, jnp.inf])
  assert session_lib.nonfinite_arrays(state) == ["['b']: 1 of 1 arrays"]


# ------------------------------------------------------------ metrics files
def test_torn_last_metrics_row_is_skipped_and_dropped_on_resume(tmp_path):
  w = workdir_lib.MetricsWriter(str(tmp_path))
  w.write({'round': 1, 'test_acc': 0.5, 'loss': float('nan')})
  w.write({'round': 2, 'test_acc': 0.625, 'extra': 1})     # a new column rewrites the csv
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"round": 3, "test_a')                        # a crash mid-append
  rows = workdir_lib.read_metrics(str(tmp_path))
  assert rows == [{'round': 1, 'test_acc': 0.5, 'loss': None},
                  {'round': 2, 'test_acc': 0.625, 'extra': 1}]
  w = workdir_lib.MetricsWriter(str(tmp_path), keep_until=1)
  w.write({'round': 2, 'test_acc': 0.75})
  assert (tmp_path / 'metrics.jsonl').read_text() == (
      '{"round": 1, "test_acc": 0.5, "loss": null}\n{"round": 2, "test_acc": 0.75}\n')
  assert (tmp_path / 'metrics.csv').read_text().splitlines() == [
      'round,test_acc,loss', '1,0.5,', '2,0.75,']
  assert not glob.glob(str(tmp_path / '*.tmp'))


def test_a_corrupt_complete_metrics_line_is_a_data_error(tmp_path):
  (tmp_path / 'metrics.jsonl').write_text('{"round": 1}\nnot json\n{"round": 3}\n')
  with pytest.raises(DataError, match='line 2'):
    workdir_lib.read_metrics(str(tmp_path))
  with pytest.raises(DataError, match='metrics.jsonl'):
    workdir_lib.read_metrics(str(tmp_path / 'nowhere'))


def _events(logdir):
  """(tag, step, value) of every scalar in a TensorBoard event file."""
  from tensorboardX.proto import event_pb2
  out = []
  for path in sorted(glob.glob(os.path.join(logdir, 'events.out.tfevents.*'))):
    data = open(path, 'rb').read()
    i = 0
    while i < len(data):
      (n,) = struct.unpack('<Q', data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for v in event.summary.value:
        out.append((v.tag, event.step, v.simple_value))
  return out


@pytest.mark.slow
def test_tensorboard_scalars_equal_the_metrics(tmp_path):
  c = tiny_config(rounds=2)
  c.checkpoint.every = 0
  summary = _run(c, tmp_path)
  events = _events(tmp_path / 'tensorboard')
  rows = workdir_lib.read_metrics(str(tmp_path))
  acc = {step: v for tag, step, v in events if tag == 'test_acc'}
  assert acc == pytest.approx({r['round']: r['test_acc'] for r in rows})
  cum = [v for tag, _, v in events if tag == 'cum_bytes']
  assert cum[-1] == summary['cum_bytes']
  assert not any(tag == 'round' for tag, _, _ in events)


@pytest.mark.slow
def test_clients_and_partition_files(tmp_path):
  c = tiny_config(rounds=1)
  _run(c, tmp_path)
  part = json.loads((tmp_path / 'partition.json').read_text())
  clients = json.loads((tmp_path / 'clients.json').read_text())
  counts = np.asarray(part['train_counts'])
  assert counts.shape == (4, part['num_classes'])
  assert counts.sum(axis=1).tolist() == clients['train_n']
  assert clients['round'] == 1 and len(clients['acc']) == 4
  row = workdir_lib.read_metrics(str(tmp_path))[-1]
  assert np.mean(clients['acc']) == pytest.approx(row['client_acc'], abs=1e-6)  # DS-FL: server is test_acc
  assert part['client_models'] == ['mlp@0.25', 'mlp@0.5'] * 2
  # The plots read what the runner wrote.
  from fedjax_kd import plot
  files = plot.plot_runs([str(tmp_path)], str(tmp_path / 'plots'))
  assert set(files) == {'accuracy_vs_round', 'accuracy_vs_bytes', 'client_accuracy',
                        'partition'}
  assert all(open(f, 'rb').read(8) == b'\x89PNG\r\n\x1a\n' for f in files.values())
  assert plot.main([str(tmp_path), '--metric', 'client_acc', '--out',
                    str(tmp_path / 'ua')]) == 0


def test_summary_table_by_hand():
  text = results.summary_table(
      {'algorithm': 'dsfl', 'final_acc': 0.64375, 'top_acc': 0.7, 'top_round': 37,
       'rounds': 40, 'rounds_run_this_call': 15, 'cum_up_bytes': 1_500_000,
       'cum_down_bytes': 2_250, 'cum_bytes': 1_502_250, 'setup_bytes': 999,
       'wall_time_s': 68.4, 'final_client_acc': 0.61234}, 'runs/x')
  lines = text.splitlines()
  assert lines[0] == lines[-1] and set(lines[0]) == {'-'}
  body = {line[:11].strip(): line[13:] for line in lines[1:-1]}   # 'bytes total' is widest
  assert body['final acc'] == '0.6438 (server model, round 40)'
  assert body['client acc'] == '0.6123 (mean over clients, round 40)'
  assert body['best acc'] == '0.7000 (round 37)'
  assert body['rounds'] == '40 (15 in this call)'
  assert body['bytes up'] == '1.50 MB' and body['bytes down'] == '2.25 kB'
  assert body['bytes total'] == '1.50 MB (setup 999 B)'
  assert body['wall time'] == '1m08s'
  # Without a server model the headline accuracy is the clients' mean, shown once.
  fd = results.summary_table({'algorithm': 'fd', 'final_acc': 0.5, 'rounds': 3,
                             'final_client_acc': 0.5}, 'runs/fd')
  assert '0.5000 (mean over clients, round 3)' in fd and 'client acc' not in fd


# ------------------------------------------------------------------ guards
def _leaves(node, prefix=''):
  for k in node.keys():
    v = node[k]
    if hasattr(v, 'keys'):
      yield from _leaves(v, f'{prefix}{k}.')
    else:
      yield f'{prefix}{k}', v


def _wrong(value):
  if isinstance(value, bool):
    return 1
  if isinstance(value, (int, float)):
    return 'oops'
  if isinstance(value, str):
    return 3
  if isinstance(value, tuple):
    return 'a,b'
  return None


def _valid_tiny(algorithm):
  c = tiny_config(algorithm, rounds=1)
  if algorithms.ALGORITHMS[algorithm].one_architecture:
    c.clients.models = ['mlp@0.25']   # parameter exchange: one architecture
  return c


@pytest.mark.parametrize('algorithm', sorted(algorithms.ALGORITHMS))
def test_every_field_of_every_algorithm_is_type_checked(algorithm):
  base = _valid_tiny(algorithm)
  checked = 0
  for field, value in _leaves(config_lib.default_config()):
    bad = _wrong(value)
    if bad is None:
      continue
    c = _valid_tiny(algorithm)
    node = c
    *path, last = field.split('.')
    for p in path:
      node = node[p]
    with node.ignore_type():
      node[last] = bad
    with pytest.raises(ConfigError) as e:
      config_lib.validate(c)
    assert str(e.value).startswith(f'{field}='), (field, str(e.value))
    checked += 1
  assert checked > 100
  config_lib.validate(base)   # and the untouched config passes


def test_a_misspelt_field_is_named_with_a_suggestion():
  c = tiny_config()
  with c.unlocked():
    c.train.learing_rate = 0.1
  with pytest.raises(ConfigError) as e:
    config_lib.validate(c)
  assert str(e.value).startswith('train.learing_rate=0.1')
  assert 'did you mean train.learning_rate?' in str(e.value)


@pytest.mark.parametrize('algorithm,field,value,allowed', [
    ('dsfl', 'dsfl.temperature', -1.0, '>= 0.0001'),
    ('scarlet', 'scarlet.beta', 0.0, '> 0.0'),
    ('scarlet', 'cache.duration', -1, '>= 0'),
    ('fedcache2', 'fedcache2.jpeg_quality', 100, 'in [1, 95]'),
    ('fedcache2', 'fedcache2.tau', 1.5, '<= 1.0'),
    ('selective_fd', 'selective_fd.tau_client', 2.0, '<= 1.0'),
    ('comet', 'comet.clusters', 0, '>= 1'),
    ('fd', 'fd.gamma', -0.5, '>= 0.0'),
    ('fedprox', 'fedprox.mu', -1.0, '>= 0.0'),
    ('scaffold', 'train.optimizer', 'adam', "'sgd'"),
    ('fedavg', 'clients.models', ('mlp@0.25', 'mlp@0.5'), 'clients.models'),
    ('dsfl', 'comm.thresholds', (0.5, 1.5), '(0, 1]'),
    ('dsfl', 'checkpoint.keep', 0, '>= 1'),
    ('dsfl', 'selection.buffer', 0.95, 'selection.buffer'),
])
def test_algorithm_ranges_and_cross_field_rules(algorithm, field, value, allowed):
  c = config_lib.override(_valid_tiny(algorithm), {field: value})
  if field == 'selection.buffer':
    c.selection.method = 'fedentopt'
    c.clients.participation = 0.5
  with pytest.raises(ConfigError) as e:
    config_lib.validate(c)
  assert str(e.value).startswith(f'{field}=') and allowed in str(e.value)


@pytest.mark.slow
def test_noresume_starts_over_and_forgets_the_old_checkpoints(tmp_path):
  c = tiny_config(rounds=4)
  c.checkpoint.every = 2
  _run(c, tmp_path)
  assert _steps(tmp_path) == [2, 4]
  # Files the project did not write, beside and inside the folders it writes to.
  foreign = {'checkpoints/other/model.bin': b'weights', 'checkpoints/notes.txt': b'mine',
             'checkpoints/7b': b'x', 'tensorboard/my_plot.png': b'png', 'notes.md': b'#'}
  for name, data in foreign.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(data)
  (tmp_path / 'checkpoints' / '3.orbax-checkpoint-tmp-99').mkdir()   # a save cut short
  c.rounds = 1
  summary = _run(c, tmp_path, resume=False)
  assert summary['rounds_run_this_call'] == 1
  assert _steps(tmp_path) == [1]       # round 4 of the old run cannot be resumed by mistake
  assert not (tmp_path / 'checkpoints' / '3.orbax-checkpoint-tmp-99').exists()
  assert [r['round'] for r in workdir_lib.read_metrics(str(tmp_path))] == [1]
  for name, data in foreign.items():
    assert (tmp_path / name).read_bytes() == data, name
  # TensorBoard starts afresh too: round 1 once, none of the old run's rounds 1-4.
  steps = [step for tag, step, _ in _events(tmp_path / 'tensorboard') if tag == 'test_acc']
  assert steps == [1]


@pytest.mark.slow
def test_noresume_cut_short_leaves_no_old_summary(tmp_path):
  """A run started over and killed in round 1 must not leave the old run's summary to be
  read as its result."""
  c = tiny_config(rounds=3)
  c.checkpoint.every = 0
  c.eval.clients = True
  _run(c, tmp_path)
  assert (tmp_path / 'summary.json').exists() and (tmp_path / 'clients.json').exists()

  def crash(line):
    if line.startswith('round    1/'):
      raise KeyboardInterrupt   # the process dies here

  with pytest.raises(KeyboardInterrupt):
    runner.run(config_lib.validate(c), str(tmp_path), resume=False, log=crash)
  assert not (tmp_path / 'summary.json').exists() and not (tmp_path / 'clients.json').exists()
  assert [r['round'] for r in workdir_lib.read_metrics(str(tmp_path))] == [1]


def _holder(directory):
  """A separate process that takes the lock on ``directory`` and sleeps until killed."""
  code = ('import sys, time; from fedjax_kd.running import workdir; '
          'workdir.DirLock(sys.argv[1]); print("locked", flush=True); time.sleep(600)')
  proc = subprocess.Popen([sys.executable, '-c', code, str(directory)], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == 'locked'
  return proc


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_a_second_run_on_a_locked_workdir_is_refused_before_any_work(tmp_path):
  work = tmp_path / 'run'
  work.mkdir()
  holder = _holder(work)
  try:
    with pytest.raises(DataError) as e:
      _run(tiny_config(rounds=1), work)
    msg = str(e.value)
    assert msg.startswith(f'--workdir: {work} is in use by another fedjax_kd run (pid '
                          f'{holder.pid} on ') and '\n' not in msg
    assert sorted(os.listdir(work)) == [workdir_lib.LOCK]    # nothing written
    # The CLI: exit 2, one line, before any compute.
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(TINY_FILE)
    r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                        f'--workdir={work}'], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'), timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f'error: {msg}']
  finally:
    holder.kill()        # SIGKILL: the holder has no chance to clean up
    holder.wait()
  # A killed holder's lock is gone with it: the next run goes ahead.
  assert _run(tiny_config(rounds=1), work)['rounds'] == 1
  # And a finished run released it: a third run resumes the same workdir.
  assert _run(tiny_config(rounds=2), work)['rounds_run_this_call'] == 1


@pytest.mark.slow
def test_the_disk_client_store_is_locked_too(tmp_path):
  store = tmp_path / 'shared_store'
  store.mkdir()
  c = tiny_config(rounds=1)
  c.clients.store = 'disk'
  c.clients.store_dir = str(store)
  with workdir_lib.DirLock(str(store), 'clients.store_dir'):
    with pytest.raises(DataError, match=r'^clients.store_dir: .*shared_store is in use by '
                       rf'another fedjax_kd run \(pid {os.getpid()} on '):
      _run(c, tmp_path / 'a')       # another workdir, the same store
  assert _run(c, tmp_path / 'a')['rounds'] == 1
