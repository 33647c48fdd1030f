"""FedCache 2.0 end to end: byte counts by hand, the KRR distillation step, bad input, resume."""

import dataclasses
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.algorithms import base, fedcache2
from fedjax_kd.config import presets
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import krr
from fedjax_kd.running import experiment
from tests.test_main import read_rows

K = 4
C = 10
PIXELS = 8 * 8 * 1        # synthetic inputs are 8x8x1 images in [0, 1]
LABEL = 1                 # fedcache2 rules: one byte per hard label


def fc2_tiny(rounds=2, **overrides):
  c = presets.fedcache2_cpu('synthetic:600')
  c.rounds = rounds
  c.data.num_private = -1
  c.clients.num_clients = K
  c.clients.models = ['mlp@0.25', 'mlp@0.5']
  c.server.model = 'mlp@0.5'
  c.train.epochs = 1
  c.train.batch_size = 32
  c.fedcache2.dd_epochs = 1
  c.fedcache2.dd_batch_size = 32
  c.fedcache2.encoding = 'raw'
  c.checkpoint.every = 0
  return config_lib.override(c, overrides)


def run(tmp_path, c, name='run'):
  workdir = os.path.join(tmp_path, name)
  summary = runner.run(config_lib.validate(c), workdir, progress=False, log=lambda s: None)
  return read_rows(workdir), summary


def class_presence(c) -> np.ndarray:
  exp = experiment.build(config_lib.validate(c))
  return exp.ctx.data.client_labels() > 0        # [K, C]: which synthetic samples exist


@pytest.mark.slow
def test_bytes_and_items_by_hand_with_tau_one(tmp_path):
  c = fc2_tiny(rounds=2, **{'fedcache2.tau': 1.0})
  items = int(class_presence(c).sum())       # one synthetic sample per (client, class it has)
  rows, summary = run(tmp_path, c)
  r1, r2 = rows
  assert summary['setup_bytes'] == K * C * 4            # p^k, once, float32
  assert r1['up_items'] == items and r1['cache_items'] == items
  assert r1['up_bytes'] == items * (PIXELS + LABEL)
  assert r1['down_bytes'] == 0 and r1['down_items'] == 0   # round 1: empty cache (eq. 15)
  # tau = 1: every client downloads the whole cache (eq. 17).
  assert r2['down_items'] == items
  assert r2['down_bytes'] == K * items * (PIXELS + LABEL)
  assert r2['up_bytes'] == items * (PIXELS + LABEL)
  for r in rows:
    assert all(v is not None for k, v in r.items() if k != 'test_acc_top5'), r
    assert r['dd_skipped_steps'] == 0


@pytest.mark.slow
def test_exclude_own_and_cap(tmp_path):
  c = fc2_tiny(rounds=2, **{'fedcache2.tau': 1.0, 'fedcache2.exclude_own': True})
  have = class_presence(c)
  rows, _ = run(tmp_path, c, 'excl')
  assert rows[1]['down_items'] == pytest.approx(np.mean(have.sum() - have.sum(1)))
  c = fc2_tiny(rounds=2, **{'fedcache2.tau': 1.0, 'fedcache2.max_download': 5})
  rows, _ = run(tmp_path, c, 'cap')
  assert rows[1]['down_items'] == 5
  assert rows[1]['down_bytes'] == K * 5 * (PIXELS + LABEL)


@pytest.mark.slow
def test_png_bytes_are_pil_file_sizes(tmp_path):
  from fedjax_kd.ops import codec
  c = fc2_tiny(rounds=1, **{'fedcache2.encoding': 'png'})
  exp = experiment.build(config_lib.validate(c))
  algo = exp.algorithm
  state = algo.init()
  state, out = base.play_round(algo, state, 1, np.ones(K, bool))
  cache = state.extra
  q = np.asarray(codec.quantize(cache.x, 0.0, 1.0))
  valid = np.asarray(cache.valid)
  want = codec.encoded_sizes(q[valid], 'png').sum()
  sent = {p.name: p for p in out.payloads}
  assert sent['distilled_inputs'].elements == want
  assert want != valid.sum() * PIXELS                 # file sizes, not raw pixels
  assert want > valid.sum() * 57   # an 8x8 PNG is >= 57 bytes of signature and chunks
  # The received images are exactly the uint8 grid (lossless).
  np.testing.assert_allclose(np.asarray(cache.x), q / 255.0, atol=1e-6)


@pytest.mark.slow
def test_distillation_lowers_the_krr_loss():
  c = fc2_tiny(**{'fedcache2.dd_epochs': 15, 'fedcache2.dd_lr': 0.01})
  exp = experiment.build(config_lib.validate(c))
  algo, fed = exp.algorithm, exp.ctx.fed
  state = algo.init()
  state, _ = algo.train_clients(state, base.round_input(algo, fed, 1, np.ones(K, bool)))
  x0, v0 = state.table.proto, state.table.proto_valid
  d = exp.ctx.data
  program = fedcache2.SyntheticDistillation(epochs=15, batch_size=32, lr=0.01, reg=1e-6,
                                            bn_mode='eval', augment=None, chunk=64,
                                            value_range=(0.0, 1.0))
  x1, loss, skipped = fed.run(
      program, state.clients, exp.ctx.root, 1, 'distill', data=algo.private_rows(),
      row={'x': x0, 'valid': v0}, shared={'y_b': algo.y_b, 'x': d.x_private, 'y': d.y_private},
      fill=(x0, jnp.full((K,), jnp.nan), jnp.zeros((K,), jnp.int32))).out
  assert np.all(skipped == 0) and np.all(np.isfinite(loss))
  assert float(jnp.min(x1)) >= 0.0 and float(jnp.max(x1)) <= 1.0   # clipped to the data range

  def full_loss(x_b, k):
    cohort = fed.cohorts[fed._cohort_of[k]]
    st = jax.tree.map(lambda a: a[fed._row_of[k]], state.clients[fed._cohort_of[k]])
    feats = lambda x: cohort.kernels.module.apply({'params': st.params}, x, embed=True)
    rows = np.asarray(d.client_idx)[k, :d.client_n[k]]
    y_t = jax.nn.one_hot(d.y_private[rows], C)
    return float(krr.krr_loss(feats(d.x_private[rows]), y_t, feats(x_b[k]), algo.y_b,
                              v0[k].astype(jnp.float32)))

  before = [full_loss(x0, k) for k in range(K)]
  after = [full_loss(x1, k) for k in range(K)]
  assert all(a < b for a, b in zip(after, before)), (before, after)


@pytest.mark.parametrize('field,value,needle', [
    ('fedcache2.tau', 1.5, 'fedcache2.tau'),
    ('fedcache2.tau', -0.1, 'fedcache2.tau'),
    ('fedcache2.ipc', 0, 'fedcache2.ipc'),
    ('fedcache2.sampling', 'uniform', "'count', 'bernoulli', 'repo'"),
    ('fedcache2.encoding', 'gif', "'raw', 'png', 'jpeg'"),
    ('fedcache2.dd_reg', 0.0, 'fedcache2.dd_reg'),
    ('fedcache2.dd_bn_mode', 'batch', "'eval', 'train'"),
])
def test_bad_options_are_named(field, value, needle):
  with pytest.raises(ConfigError, match=needle.replace('.', r'\.').replace('(', r'\(')):
    config_lib.validate(fc2_tiny(**{field: value}))


def tabular_npz(tmp_path, d=12, n=400):
  rng = np.random.default_rng(0)
  centers = rng.normal(0, 3, (5, d))
  y = rng.integers(0, 5, n + n // 4)
  x = (centers[y] + rng.normal(0, 1, (len(y), d))).astype(np.float32)
  path = os.path.join(tmp_path, 'sensor.npz')
  np.savez(path, x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:])
  return path


@pytest.mark.slow
def test_tabular_inputs_travel_as_float32_and_png_is_refused(tmp_path):
  path = tabular_npz(tmp_path)
  c = load_config('fedcache2_sensor.py', f'{path},0.5')
  assert tuple(c.clients.models) == ('fcn@1.0',) and c.data.source == f'npz:{path}'
  c = fc2_tiny(rounds=2, **{'data.source': c.data.source, 'clients.models': ['fcn@0.25'],
                            'server.model': 'fcn@0.25', 'fedcache2.tau': 1.0})
  c.data.min_size = 5
  presence = class_presence(c)
  rows, _ = run(tmp_path, c, 'tab')
  items = int(presence.sum())
  assert rows[0]['up_bytes'] == items * (12 * 4 + LABEL)
  assert rows[1]['down_bytes'] == K * items * (12 * 4 + LABEL)
  assert rows[1]['test_acc'] is not None
  c.fedcache2.encoding = 'png'
  with pytest.raises(ConfigError, match='fedcache2.encoding'):
    experiment.build(config_lib.validate(c))


@pytest.mark.slow
def test_sigma_init_sends_donor_sets_and_resume_matches(tmp_path):
  c = fc2_tiny(rounds=3, **{'fedcache2.proto_init': 'sigma', 'fedcache2.tau': 0.5,
                            'checkpoint.every': 1})
  full, _ = run(tmp_path, c, 'full')
  assert full[0]['down_bytes'] == 0
  # Round 2 also downloads each client's donor set (eq. 8): more than the sampled items.
  assert full[1]['down_bytes'] > full[1]['down_items'] * K * (PIXELS + LABEL)
  c2 = fc2_tiny(rounds=2, **{'fedcache2.proto_init': 'sigma', 'fedcache2.tau': 0.5,
                             'checkpoint.every': 1})
  run(tmp_path, c2, 'resumed')
  c2.rounds = 3
  resumed, _ = run(tmp_path, c2, 'resumed')
  for a, b in zip(full, resumed):
    assert a['test_acc'] == pytest.approx(b['test_acc'], abs=1e-6)
    assert a['cum_bytes'] == b['cum_bytes']


def load_config(name, arg):
  path = os.path.join(os.path.dirname(__file__), '..', 'configs', name)
  spec = importlib.util.spec_from_file_location(name[:-3], path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


@pytest.mark.parametrize('arg,models', [
    ('0.5', ['resnet_l@1']), ('2.0,hetero', ['resnet_s@1', 'resnet_m@1', 'resnet_l@1'])])
def test_paper_config_matches_the_spec(arg, models):
  s = config_lib.validate(load_config('fedcache2_cifar10.py', arg))
  assert s.algorithm == 'fedcache2' and s.clients.num_clients == 100 and s.rounds == 15
  assert s.data.partition == 'dirichlet' and s.data.alpha == float(arg.split(',')[0])
  assert sorted(set(s.clients.models)) == sorted(models)
  assert (s.train.optimizer, s.train.learning_rate, s.train.batch_size, s.train.epochs) == (
      'adam', 0.01, 64, 5)
  o = s.options
  assert (o.tau, o.ipc, o.dd_lr, o.encoding) == (0.5, 1, 1e-3, 'jpeg')


def test_scarce_digits_setting_is_small_clients_near_uniform_labels_three_widths():
  base = config_lib.validate(load_config('fedcache2_digits.py', ''))
  s = config_lib.validate(load_config('fedcache2_digits.py', 'scarce'))
  assert (s.data.num_private, s.data.alpha, s.train.batch_size) == (200, 2.0, 10)
  assert sorted(set(s.clients.models)) == ['cnn@0.25', 'cnn@0.5', 'cnn@1']
  assert (base.data.num_private, base.data.alpha) == (-1, 0.5)
  assert (s.rounds, s.options.tau, s.clients.num_clients) == (15, 0.5, 10)
  with pytest.raises(ValueError, match="expected no argument, ':scarce'"):
    load_config('fedcache2_digits.py', 'x')
  # :baselines is the same clients on one architecture, for the parameter-exchange baselines.
  b = config_lib.validate(load_config('fedcache2_digits.py', 'baselines'))
  # (with a tenth of each client's rows held out: kNN-Per tunes its lambda on them)
  assert b.data == dataclasses.replace(s.data, val_fraction=0.1)
  assert set(b.clients.models) == {'cnn@1'} and b.rounds == s.rounds


@pytest.mark.slow
def test_batchnorm_train_mode_two_per_class_and_tiny_ridge_stay_finite(tmp_path):
  # A BatchNorm CNN distilling with the synthetic batch's own statistics (the authors'
  # code), 2 synthetic samples per class, and a ridge so small that float32 Cholesky
  # needs the documented fallback: no NaNs anywhere, no skipped steps.
  c = fc2_tiny(rounds=2, **{'clients.models': ['cnn@0.25'], 'server.model': 'cnn@0.25',
                            'fedcache2.dd_bn_mode': 'train', 'fedcache2.ipc': 2,
                            'fedcache2.dd_reg': 1e-12, 'fedcache2.tau': 1.0})
  have = class_presence(c)
  rows, _ = run(tmp_path, c, 'bn')
  counts = experiment.build(config_lib.validate(c)).ctx.data.client_labels()
  assert rows[0]['up_items'] == int(np.minimum(counts, 2).sum()) >= have.sum()
  for r in rows:
    assert r['dd_loss'] is not None and r['test_acc'] is not None
    assert r['dd_skipped_steps'] == 0


def _pool_after_two_rounds():
  """The tiny FedCache 2.0 experiment, its planned pool buffer, the pool it keeps after
  round 2, round 1's cache and the bytes of its data arrays."""
  exp = experiment.build(config_lib.validate(fc2_tiny()))
  algo, d = exp.algorithm, exp.ctx.data
  (want,) = algo.planned_buffers()
  state, _ = base.play_round(algo, base.init_state(algo), 1, np.ones(K, bool))
  assert algo._pool_x is None   # pylint: disable=protected-access  (round 1: nothing cached)
  cache = state.extra           # what round 2's clients download from
  base.play_round(algo, state, 2, np.ones(K, bool))
  data = sum(getattr(d, f).nbytes for f in d.__dataclass_fields__
             if isinstance(getattr(d, f), jax.Array))
  return exp, want, algo._pool_x, cache, data  # pylint: disable=protected-access


@pytest.mark.slow   # FedCache 2.0's programs compile for 20 s; tiny/fedcache2 runs them quick
def test_the_download_pool_is_declared_to_the_memory_planner_as_built():
  """From the first round with downloads the algorithm keeps its pool (the private rows as
  model inputs, then every cache slot): its planned_buffers are that array's shape and dtype,
  and the plan counts its bytes."""
  from fedjax_kd.running import memory  # pylint: disable=g-import-not-at-top
  exp, want, pool, cache, data = _pool_after_two_rounds()
  d = exp.ctx.data
  assert (pool.shape, pool.dtype) == (want.shape, want.dtype)
  n = d.x_private.shape[0]
  np.testing.assert_array_equal(pool[:n], d.normalize(d.x_private))
  np.testing.assert_array_equal(pool[n:], cache.x.reshape((-1,) + cache.x.shape[2:]))
  assert memory.plan(exp).data == data + pool.nbytes


@pytest.mark.slow
def test_xlas_figure_counts_the_download_pool_too():
  """XLA's own figure (every program compiled) has the pool's bytes too."""
  from fedjax_kd.running import memory  # pylint: disable=g-import-not-at-top
  exp, _, pool, _, data = _pool_after_two_rounds()
  assert memory.xla_figure(exp).data == data + pool.nbytes
