"""Runs give the metrics recorded in ``tests/golden_metrics.json``, to within what XLA may
change between CPUs.

Two sets of cases. **Every algorithm, tiny** (the quick tier): each built-in
algorithm for two rounds on 300 synthetic 8x8 images, four clients of one small
MLP, so that all of them share one set of compiled kernels. **Every shipped
config, shrunk** (the long tier, ``-m slow``): each config file of ``configs/``
(with its argument, and the baselines its docstring names) made small enough for
CI: three rounds, at most eight clients, synthetic 8x8 images (or the embedded
digits where the config uses them), small CNN/MLP widths in place of the paper
models (as many distinct specs as the config has), one epoch. Everything else
(algorithm, aggregation, cache, temperature, selection, partition,
participation, optimiser, communication rules) is the config's own. Every case
runs with device-resident clients; a second run keeps the clients on the host
store with half of them taking part in each round (or the config's own rate
where it is partial already), so the host store's gather/scatter of every
per-client array is covered for every algorithm.

The recorded file must not change with a refactor: a refactor that changes a
metric changed a result. What may change is the last bits: XLA:CPU compiles
float32 sums differently for other instruction sets, thread counts and device
counts. Each metric is compared by its kind (``results.metric_kind``), with tolerances set
from the spread ``benchmarks/reproduction/golden_spread.py`` measured over such builds (the
table and command are in ``docs/testing.md``):

* integers (rounds, bytes, counts, selections, partitions): exactly;
* accuracies: to within :data:`ACC_SAMPLES` test samples;
* other floats (losses, entropies, distances, temperatures, ratios): to a
  relative :data:`REL_TOL`, measured against at least :data:`FLOAT_FLOOR`.

Regenerate (only when a result is meant to change, and say so in the commit):
``python -m tests.test_golden --write``.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np
import pytest

from fedjax_kd import algorithms
from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib
from tests.shared import count_reads, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = pathlib.Path(__file__).with_name('golden_metrics.json')
SMALL_MODELS = ('mlp@0.25', 'mlp@0.5', 'cnn@0.25', 'mlp@1.0')

# Two of the shrunk cases' eight clients a round (10 % would be one: nothing to drop).
_TWO = {'clients.participation': 0.25}
# (case name, config file and argument, algorithm override or '', other overrides).
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
    # The arms of the reproduction's FedEntOpt sweeps, each its own case, so that a change to
    # the KL selector, the dropout, the stragglers or the noisy label counts moves a record
    # (and makes the archived runs of those arms stale until they replay).
    ('fedentopt_digits_kl', 'fedentopt_digits.py:c2,fedavg,kl', '', _TWO),
    ('fedentopt_digits_dropout', 'fedentopt_digits.py', '', {**_TWO, 'selection.dropout': 0.3}),
    ('fedentopt_digits_stragglers', 'fedentopt_digits.py:c2,fedprox,uniform', '',
     {'clients.participation': 0.5, 'selection.stragglers': 0.5, 'train.epochs': 2}),
    ('fedentopt_digits_dp', 'fedentopt_digits.py', '', {**_TWO, 'selection.dp': True}),
    ('fedentopt_digits_dir01', 'fedentopt_digits.py:dir0.1', '',
     {**_TWO, 'selection.buffer': 0.5}),
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
# Every algorithm fedjax_kd registers itself, as a tiny case of the quick tier.
TINY = ('acepfl', 'centralized', 'cfd', 'comet', 'dsfl', 'fd', 'fedavg', 'fedcache2', 'fedmd',
        'fednova', 'fedprox', 'individual', 'scaffold', 'scarlet', 'selective_fd', 'single',
        'fedrs', 'fedlc', 'fedconcat', 'mtfl', 'knn_per', 'scdpfl', 'fedcache', 'feddf',
        'fedala', 'kt_pfl', 'pfedme', 'perfedavg', 'fedkd')
# What CI runs (about 2 minutes on 2 cores): the host store with partial participation (the
# gather/scatter of every per-client array) for one algorithm of each engine family: the
# public-set protocol (DS-FL, SCARLET's cache, COMET's per-client cache, Selective-FD's upload
# masks), FD, FedCache 2.0, ACE-pFL and SCAFFOLD (client table plus local-rule hooks); and
# the FedEntOpt sweeps' arms on the device store (what the reproduction's standing check reads).
# FEDJAX_KD_GOLDEN=all runs every case on both stores (about 20 minutes); run it before
# landing any change to the engine, the algorithms or the stores.
CI_CASES = {('default', 'host'), ('digits_fd', 'host'), ('scarlet_digits', 'host'),
            ('scarlet_digits_comet', 'host'), ('scarlet_digits_selective_fd', 'host'),
            ('fedcache2_digits', 'host'), ('fedentopt_digits_scaffold', 'host'),
            ('acepfl_digits', 'host'), ('fedentopt_digits_kl', 'device'),
            ('fedentopt_digits_dropout', 'device'), ('fedentopt_digits_stragglers', 'device'),
            ('fedentopt_digits_dp', 'device'), ('fedentopt_digits_dir01', 'device')}


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
  _, path, algorithm, *overrides = next(c for c in CASES if c[0] == case)
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
  for field, value in (overrides[0] if overrides else {}).items():   # the case's own, last
    group, name = field.split('.')
    c[group][name] = value
  return c


def golden_tiny_config(algorithm: str):
  """Two rounds of ``algorithm`` on 300 synthetic images: four clients and the server all one
  small MLP, so every tiny case runs on the same compiled kernels (kNN-Per, which tunes its
  lambda on held-out rows, holds a fifth of each client's rows out; FedConcat runs four
  rounds, so that its default split gives two to the encoders and two to the classifier)."""
  return tiny_config(algorithm, rounds=4 if algorithm == 'fedconcat' else 2, **{
      'data.source': 'synthetic:300', 'data.num_public': 60, 'clients.models': ['mlp@0.25'],
      'server.model': 'mlp@0.25', 'distill.public_per_round': 50, 'distill.batch_size': 25,
      'eval.every': 1, 'checkpoint.every': 0,
      **({'data.val_fraction': 0.2} if algorithm == 'knn_per' else {})})


def case_config(key: str, tmp: pathlib.Path):
  """The config of a recorded case: ``tiny/<algorithm>`` or ``<case>/<store>``."""
  case, store = key.split('/')
  return golden_tiny_config(store) if case == 'tiny' else shrunk_config(case, tmp, store)


def metrics(key: str, tmp: pathlib.Path, reads=None) -> list[dict]:
  """Every deterministic column of every round of one case (timings dropped); ``reads``, a
  ``DeviceReads``, counts the run's device reads (``tests.shared.count_reads``)."""
  spec = config_lib.validate(case_config(key, tmp))
  workdir = tmp / key.replace('/', '-')
  if reads is None:
    runner.run(spec, str(workdir), resume=False, progress=False)
  else:
    with count_reads(reads):
      runner.run(spec, str(workdir), resume=False, progress=False)
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


# Tolerances, from the spread benchmarks/reproduction/golden_spread.py measured (docs/testing.md):
# no accuracy, count or byte moved in any build; floats moved by at most 9e-5 (ACE-pFL's L_GD, a
# difference of nearly equal terms, with matrix products by Eigen), 4.4e-5 on four devices and
# 3.2e-5 for the KRR distillation loss; a CPU with AVX2 alone moved the KRR loss by 1.1e-5.
ACC_SAMPLES = 1      # accuracies: one test sample (a single borderline prediction)
REL_TOL = 5e-4       # other floats: relative, over 5x the largest spread measured
FLOAT_FLOOR = results.FLOAT_FLOOR   # floats below this (losses near zero): REL_TOL * 0.1


def num_test_samples(key: str, tmp: pathlib.Path) -> int:
  """How many samples the server's test set of a case holds (an accuracy moves in steps of
  one over this; the host-store run of a case tests on the same set)."""
  from fedjax_kd.data import sources  # pylint: disable=g-import-not-at-top
  d = config_lib.validate(case_config(key, tmp)).data
  dataset = sources.load_source(d.source, data_dir=d.data_dir or None, seed=0, field='',
                                label_key=d.label_key or None)
  return len(dataset.y_test)


def same(column: str, got, want, test_samples: int) -> bool:
  """Whether a metric equals its recorded value, to within its kind's tolerance."""
  return results.same_metric(column, got, want, accuracy_tol=(ACC_SAMPLES + 1e-3) / test_samples,
                             rel_tol=REL_TOL)


def _golden() -> dict:
  if not GOLDEN.exists():
    pytest.fail(f'{GOLDEN} is missing: python -m tests.test_golden --write')
  return json.loads(GOLDEN.read_text())


def _check(key: str, tmp: pathlib.Path, reads=None) -> None:
  want = _golden()[key]
  got = metrics(key, tmp, reads)
  n = num_test_samples(key, tmp)
  assert [r['round'] for r in got] == [r['round'] for r in want]
  for g, w in zip(got, want):
    assert sorted(g) == sorted(w), f'round {w["round"]}: columns differ'
    diff = {k: (g[k], w[k]) for k in w if not same(k, g[k], w[k], n)}
    assert not diff, f'{key} round {w["round"]}: {diff}'


@pytest.mark.parametrize('algorithm', TINY)
def test_every_algorithm_gives_its_recorded_tiny_rounds(algorithm, tmp_path):
  """Its recorded metrics, and one device read in every round: its metrics, payload counts,
  scores, the NaN guard's flags and the facts the next round's control flow needs, in one
  transfer (RoundOutput.read). (A host codec reads once more: the next test.)"""
  from tests.shared import DeviceReads  # pylint: disable=g-import-not-at-top
  reads = DeviceReads()
  _check(f'tiny/{algorithm}', tmp_path, reads)
  for t, n in reads.rounds.items():
    assert n <= 1, f'{algorithm}: round {t} read the device {n} times: {reads.sites[t]}'


def test_a_codec_is_a_rounds_one_read_more(tmp_path):
  """FedCache 2.0 sizes its uploads with the host's PNG codec: the quantised images are read
  once more a round (raw bytes, its tiny case above: no read of their own)."""
  c = golden_tiny_config('fedcache2')
  c.data.source = 'digits'          # 8x8 images: a codec needs (H, W, C) inputs
  c.fedcache2.encoding = 'png'
  with count_reads() as reads:
    runner.run(config_lib.validate(c), str(tmp_path / 'png'), progress=False)
  assert list(reads.rounds.values()) == [2, 2], reads.sites
  assert all(any('fedcache2.py' in site for site in sites) for sites in reads.sites.values())


def test_the_read_count_sees_implicit_and_explicit_reads(tmp_path):
  """The counter cannot miss a read: an algorithm that reads a loss with float() and with
  np.asarray() in its round is counted two more than FedAvg, and a round's evaluation is no
  extra read."""
  from fedjax_kd.algorithms import fedavg  # pylint: disable=g-import-not-at-top
  from tests.shared import DeviceReads  # pylint: disable=g-import-not-at-top

  @algorithms.register
  class Reading(fedavg.FedAvg):
    name = 'reading_fedavg'

    def round(self, state, r):
      state, out = super().round(state, r)
      float(out.metrics['train_loss'])   # a read of its own
      np.asarray(out.metrics['train_loss'])   # and another (NumPy reads the buffer)
      return state, out

  counts = {}
  try:
    for name in ('fedavg', 'reading_fedavg'):
      c = golden_tiny_config('fedavg')
      c.algorithm = name
      with count_reads() as reads:
        runner.run(config_lib.validate(c), str(tmp_path / name), progress=False)
      counts[name] = reads.rounds[2]
  finally:
    algorithms.unregister('reading_fedavg')
  assert counts == {'fedavg': 1, 'reading_fedavg': 3}


@pytest.mark.slow   # three runs of three rounds each
@pytest.mark.parametrize('algorithm,after_resume', [('scarlet', 2), ('dsfl', 1)])
def test_a_pending_downlink_is_carried_on_the_host_or_read_once_after_a_resume(
    algorithm, after_resume, tmp_path):
  """SCARLET's clients receive the downlink of the round before, and learn that one waits
  from that round (RoundOutput.carry): one read a round. After a resume that fact is unknown,
  so the first round reads the state's flag (one read more) and gives the uninterrupted
  run's row. DS-FL's clients receive it in the same round, after the server step, so it
  never needs the read."""
  def run(rounds, workdir):
    c = golden_tiny_config(algorithm)
    c.rounds, c.checkpoint.every = rounds, 1
    with count_reads() as reads:
      runner.run(config_lib.validate(c), str(tmp_path / workdir), progress=False)
    return reads.rounds, workdir_lib.read_metrics(str(tmp_path / workdir))

  whole, rows = run(3, 'whole')
  assert whole == {1: whole[1], 2: 1, 3: 1}, whole
  run(2, 'cut')
  resumed, cut_rows = run(3, 'cut')
  assert resumed == {3: after_resume}, resumed
  strip = lambda row: {k: v for k, v in row.items() if not k.endswith('_s')}
  assert [strip(r) for r in cut_rows] == [strip(r) for r in rows]


def test_every_built_in_algorithm_has_a_tiny_case():
  assert set(TINY) == set(algorithms._BUILT_IN)  # pylint: disable=protected-access


@pytest.mark.parametrize('store', STORES)
@pytest.mark.parametrize('case', [c[0] for c in CASES])
@pytest.mark.slow
def test_metrics_equal_the_recorded_ones(case, store, tmp_path):
  if (case, store) not in CI_CASES and os.environ.get('FEDJAX_KD_GOLDEN') != 'all':
    pytest.skip('outside the CI subset; FEDJAX_KD_GOLDEN=all runs it')
  _check(f'{case}/{store}', tmp_path)


def test_same_ignores_last_bits_and_catches_a_changed_prediction():
  # 360 test samples: one prediction is 1/360 of accuracy.
  assert same('test_acc', 0.9 + ACC_SAMPLES / 360, 0.9, 360)
  assert not same('test_acc', 0.9 + (ACC_SAMPLES + 1) / 360, 0.9, 360)
  assert same('train_loss', 2.0 * (1 + 0.9 * REL_TOL), 2.0, 360)
  assert not same('train_loss', 2.0 * (1 + 2 * REL_TOL), 2.0, 360)
  assert same('dd_loss', 0.5 * FLOAT_FLOOR * REL_TOL, 0.0, 360)   # near zero: the floor
  assert not same('dd_loss', 2 * FLOAT_FLOOR * REL_TOL, 0.0, 360)
  assert same('test_loss', float('nan'), float('nan'), 360)
  assert not same('test_loss', 0.5, float('nan'), 360)
  assert same('round_bytes', 12, 12, 360) and not same('round_bytes', 12, 13, 360)
  assert not same('participants', 4.0, 4, 360)


def _dump(path: str, cases: list[str], stores: list[str]) -> None:
  """Writes the metrics of the given cases (``case/store`` keys, the golden file's layout)
  and each case's test-set size to ``path``: what ``benchmarks/reproduction/golden_spread.py``
  compares against the recorded file under other XLA builds of the same programs."""
  import tempfile  # pylint: disable=g-import-not-at-top
  out = {'metrics': {}, 'test_size': {}}
  with tempfile.TemporaryDirectory() as tmp:
    for case in cases:
      for store in stores:
        key = f'{case}/{store}'
        print(key, file=sys.stderr, flush=True)
        out['metrics'][key] = metrics(key, pathlib.Path(tmp))
        out['test_size'][key] = num_test_samples(key, pathlib.Path(tmp))
      pathlib.Path(path).write_text(json.dumps(out, sort_keys=True) + '\n')


def _write() -> None:
  """Records every case (keeping the ones already in the file: delete it to start over)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  out = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
  with tempfile.TemporaryDirectory() as tmp:
    keys = [f'tiny/{a}' for a in TINY] + [f'{c[0]}/{s}' for c in CASES for s in STORES]
    for key in keys:
      if key in out:
        continue
      print(key, file=sys.stderr, flush=True)
      out[key] = metrics(key, pathlib.Path(tmp))
      GOLDEN.write_text(json.dumps(out, indent=0, sort_keys=True) + '\n')


if __name__ == '__main__':
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  if sys.argv[1:] == ['--write']:
    _write()
  elif len(sys.argv) == 5 and sys.argv[1] == '--dump':
    _dump(sys.argv[2], sys.argv[3].split(','), sys.argv[4].split(','))
  else:
    sys.exit('usage: python -m tests.test_golden --write | --dump OUT.json CASE,... STORE,...')
