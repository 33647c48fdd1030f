"""Every shipped config, shrunk, gives the metrics recorded in ``tests/golden_metrics.json``.

The file was written before the engine's redesign (one declared per-client
table, pure algorithm rounds, one local-training rule) and must not change
with a refactor: a refactor that changes a metric changed a result.

Each case is a config file of ``configs/`` (with its argument, and the
baselines its docstring names) made small enough for CI: three rounds, at
most eight clients, synthetic 8x8 images (or the embedded digits where the
config uses them), small CNN/MLP widths in place of the paper models (as many
distinct specs as the config has), one epoch. Everything else (algorithm,
aggregation, cache, temperature, selection, partition, participation,
optimiser, communication rules) is the config's own. Every case runs with
device-resident clients; a second run keeps the clients on the host store
with half of them taking part in each round (or the config's own rate where it is
partial already), so the host store's gather/scatter of every per-client array
is covered for every algorithm.

Floats are compared to 1e-6 (absolute) and 1e-5 (relative): far below a
changed prediction (an accuracy moves in steps of 1 / test size, here >= 0.002),
and above the last-bit differences between CPUs.

Regenerate (only when a result is meant to change, and say so in the commit):
``python -m tests.test_golden --write``.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys

import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner

REPO = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = pathlib.Path(__file__).with_name('golden_metrics.json')
SMALL_MODELS = ('mlp@0.25', 'mlp@0.5', 'cnn@0.25', 'mlp@1.0')

# (case name, config file and argument, algorithm override or '').
CASES = (
    ('default', 'default.py', ''),
    ('digits_dsfl_sa', 'digits_dsfl_sa.py', ''),
    ('digits_fd', 'digits_fd.py', ''),
    ('digits_fedavg', 'digits_fedavg.py', ''),
    ('digits_single', 'digits_single.py', ''),
    ('dsfl_mnist', 'dsfl_mnist.py', ''),
    ('dsfl_mnist_cpu', 'dsfl_mnist_cpu.py', ''),
    ('dsfl_fmnist', 'dsfl_fmnist.py', ''),
    ('dsfl_fmnist_cpu', 'dsfl_fmnist_cpu.py', ''),
    ('scarlet_digits', 'scarlet_digits.py', ''),
    ('scarlet_digits_dsfl', 'scarlet_digits.py', 'dsfl'),
    ('scarlet_digits_cfd', 'scarlet_digits.py', 'cfd'),
    ('scarlet_digits_comet', 'scarlet_digits.py', 'comet'),
    ('scarlet_digits_selective_fd', 'scarlet_digits.py', 'selective_fd'),
    ('scarlet_digits_individual', 'scarlet_digits.py', 'individual'),
    ('scarlet_digits_centralized', 'scarlet_digits.py', 'centralized'),
    ('scarlet_mnist_cpu', 'scarlet_mnist_cpu.py', ''),
    ('scarlet_cifar10', 'scarlet_cifar10.py', ''),
    ('scarlet_cifar10_0.3', 'scarlet_cifar10.py:0.3', ''),
    ('scarlet_cifar100', 'scarlet_cifar100.py', ''),
    ('fedcache2_digits', 'fedcache2_digits.py', ''),
    ('fedcache2_mnist_cpu', 'fedcache2_mnist_cpu.py', ''),
    ('fedcache2_cifar10', 'fedcache2_cifar10.py', ''),
    ('fedcache2_cifar10_hetero', 'fedcache2_cifar10.py:2.0,hetero', ''),
    ('fedcache2_sensor', 'fedcache2_sensor.py:{sensor}', ''),
    ('fedentopt_digits', 'fedentopt_digits.py', ''),
    ('fedentopt_digits_random', 'fedentopt_digits.py:c2,fedavg,uniform', ''),
    ('fedentopt_digits_poc', 'fedentopt_digits.py:c2,fedavg,power_of_choice', ''),
    ('fedentopt_digits_fedprox', 'fedentopt_digits.py:c2,fedprox', ''),
    ('fedentopt_digits_scaffold', 'fedentopt_digits.py:c2,scaffold', ''),
    ('fedentopt_digits_fednova', 'fedentopt_digits.py:c2,fednova', ''),
    ('fedentopt_mnist_cpu', 'fedentopt_mnist_cpu.py', ''),
    ('fedentopt_cifar10', 'fedentopt_cifar10.py', ''),
    ('fedentopt_cifar100', 'fedentopt_cifar100.py:c3', ''),
    ('acepfl_digits', 'acepfl_digits.py', ''),
    ('acepfl_digits_fedmd', 'acepfl_digits.py', 'fedmd'),
    ('acepfl_mnist_cpu', 'acepfl_mnist_cpu.py', ''),
    ('acepfl_cifar10', 'acepfl_cifar10.py', ''),
    ('acepfl_cifar10_pat2', 'acepfl_cifar10.py:pat2', ''),
)
STORES = ('device', 'host')
# What CI runs (about 2 minutes on 2 cores): the host store with partial participation (the
# gather/scatter of every per-client array) for one algorithm of each engine family: the
# public-set protocol (DS-FL, SCARLET's cache, COMET's per-client cache, Selective-FD's upload
# masks), FD, FedCache 2.0, ACE-pFL and SCAFFOLD (client table plus local-rule hooks).
# FEDJAX_KD_GOLDEN=all runs every case on both stores (about 20 minutes); run it before
# landing any change to the engine, the algorithms or the stores.
CI_CASES = {('default', 'host'), ('digits_fd', 'host'), ('scarlet_digits', 'host'),
            ('scarlet_digits_comet', 'host'), ('scarlet_digits_selective_fd', 'host'),
            ('fedcache2_digits', 'host'), ('fedentopt_digits_scaffold', 'host'),
            ('acepfl_digits', 'host')}


def _sensor_npz(directory: pathlib.Path) -> str:
  """A small feature-vector npz (the sensor config's input): 12 features, 10 classes."""
  path = directory / 'sensor.npz'
  if not path.exists():
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(10, 12))
    def draw(n):
      y = rng.permutation(np.arange(n) % 10)
      return (protos[y] + 0.5 * rng.normal(size=(n, 12))).astype(np.float32), y
    x_tr, y_tr = draw(600)
    x_te, y_te = draw(150)
    np.savez(path, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
  return str(path)


def shrunk_config(case: str, data_dir: pathlib.Path, store: str):
  """The case's config file, made small (see the module docstring)."""
  _, path, algorithm = next(c for c in CASES if c[0] == case)
  path = path.format(sensor=_sensor_npz(data_dir))
  c = config_lib.load_file(str(REPO / 'configs' / path))
  if algorithm:
    c.algorithm = algorithm
  c.rounds = 3
  sensor = c.data.source.startswith('npz:')
  if c.data.source != 'digits' and not sensor:
    c.data.source = 'synthetic:600'
    c.data.label_key = ''
    if c.data.public_source:
      c.data.public_source = 'synthetic:400'
  c.data.mean, c.data.std = (), ()
  if c.data.num_public > 0:
    c.data.num_public = 150
  c.data.num_private = -1
  if c.distill.public_per_round > 0:
    c.distill.public_per_round = min(c.distill.public_per_round, 100)
  c.clients.num_clients = min(c.clients.num_clients, 8)
  if c.clients.assignment not in ('round_robin', 'blocks'):
    c.clients.assignment = 'round_robin'
  if not sensor:
    specs = list(dict.fromkeys(c.clients.models))
    small = dict(zip(specs, SMALL_MODELS))
    c.clients.models = [small[m] for m in c.clients.models]
    c.server.model = 'mlp@0.5'
  c.train.epochs = 1
  c.distill.epochs = 1
  c.train.batch_size = min(c.train.batch_size, 20)
  c.distill.batch_size = min(c.distill.batch_size, 50)
  c.eval.every = 1
  c.checkpoint.every = 0
  if store != 'device':
    c.clients.store = store
    if c.clients.participation >= 1.0:
      c.clients.participation = 0.5
  return c


def metrics(case: str, store: str, tmp: pathlib.Path) -> list[dict]:
  """Every deterministic column of every round of one case (timings dropped)."""
  spec = config_lib.validate(shrunk_config(case, tmp, store))
  workdir = tmp / f'{case}-{store}'
  runner.run(spec, str(workdir), resume=False, progress=False)
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


def _same(a, b) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    if a is None or b is None:
      return a is b
    if math.isnan(a) or math.isnan(b):
      return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
  return a == b


def _golden() -> dict:
  if not GOLDEN.exists():
    pytest.fail(f'{GOLDEN} is missing: python -m tests.test_golden --write')
  return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize('store', STORES)
@pytest.mark.parametrize('case', [c[0] for c in CASES])
def test_metrics_equal_the_recorded_ones(case, store, tmp_path):
  if (case, store) not in CI_CASES and os.environ.get('FEDJAX_KD_GOLDEN') != 'all':
    pytest.skip('outside the CI subset; FEDJAX_KD_GOLDEN=all runs it')
  want = _golden()[f'{case}/{store}']
  got = metrics(case, store, tmp_path)
  assert [r['round'] for r in got] == [r['round'] for r in want]
  for g, w in zip(got, want):
    assert sorted(g) == sorted(w), f'round {w["round"]}: columns differ'
    diff = {k: (g[k], w[k]) for k in w if not _same(g[k], w[k])}
    assert not diff, f'round {w["round"]}: {diff}'


def test_same_detects_a_changed_prediction_and_ignores_last_bits():
  assert _same(0.9, 0.9 + 1e-9) and _same(float('nan'), float('nan'))
  assert not _same(0.9, 0.9 + 1 / 500) and not _same(0.9, float('nan'))
  assert _same(12, 12) and not _same(12, 13)


def _write() -> None:
  """Records every case (keeping the ones already in the file: delete it to start over)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  out = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
  with tempfile.TemporaryDirectory() as tmp:
    for case, _, _ in CASES:
      for store in STORES:
        if f'{case}/{store}' in out:
          continue
        print(f'{case}/{store}', file=sys.stderr, flush=True)
        out[f'{case}/{store}'] = metrics(case, store, pathlib.Path(tmp))
        GOLDEN.write_text(json.dumps(out, indent=0, sort_keys=True) + '\n')


if __name__ == '__main__':
  if sys.argv[1:] != ['--write']:
    sys.exit('usage: python -m tests.test_golden --write')
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  _write()
