"""MTFL (private BatchNorm + FedAdam server) and kNN-Per (FedAvg + local kNN memory).

Quick tier: the FedAdam step, the private-BN masks, the byte count, MTFL's broadcast and
server step on a tiny model, the kNN-Per kernel prediction and its batched per-client
scoring, all worked out by hand (numbers in the comments). Slow tier: 2-round runs of each
from the runner with the bytes checked against the rule computed by hand.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import knn_per as knn_per_lib
from fedjax_kd.algorithms.mtfl import MTFL, MTFLOptions, MTFLServer
from fedjax_kd.core.state import ModelState
from fedjax_kd.errors import ConfigError
from fedjax_kd.models import layers
from fedjax_kd.ops import knn as knn_ops
from fedjax_kd.ops import private_bn
from fedjax_kd.running import experiment
from tests.shared import tiny_config


# ------------------------------------------------------------------ MTFL
def test_server_adam_two_steps_by_hand():
  # Round 1: w = [1, 2], clients [0, 2] and [2, 2] with n = 1, 3: mean = [1.5, 2].
  # g = w - mean = [-0.5, 0]; m = 0.1 g = [-0.05, 0]; v = 0.001 g^2 = [2.5e-4, 0];
  # w0 = 1 - 0.01 * (-0.05) / (sqrt(2.5e-4) + 1e-4) = 1 + 5e-4 / 0.0159114 = 1.0314240;
  # w1 = 2 - 0 = 2 (m = 0: no step).
  kw = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-4)
  w = {'a': jnp.array([1.0, 2.0])}
  z = {'a': jnp.zeros(2)}
  mean = {'a': 0.25 * jnp.array([0.0, 2.0]) + 0.75 * jnp.array([2.0, 2.0])}
  w1, m1, v1 = private_bn.server_adam(w, mean, z, z, **kw)
  np.testing.assert_allclose(m1['a'], [-0.05, 0.0], rtol=1e-6)
  np.testing.assert_allclose(v1['a'], [2.5e-4, 0.0], rtol=1e-6)
  np.testing.assert_allclose(w1['a'], [1.0314240, 2.0], rtol=1e-6)
  # Round 2: mean = [0.5, 2.5]: g = [0.5314240, -0.5];
  # m = 0.9 (-0.05) + 0.1 (0.5314240) = 0.0081424, 0.9 * 0 + 0.1 (-0.5) = -0.05;
  # v = 0.999 (2.5e-4) + 0.001 (0.5314240^2) = 5.32161e-4, 0.001 * 0.25 = 2.5e-4;
  # w = 1.0314240 - 0.01 * 0.0081424 / (0.0230686 + 1e-4) = 1.0279096,
  #     2 + 0.01 * 0.05 / (0.0158114 + 1e-4) = 2.0314240.
  w2, m2, v2 = private_bn.server_adam(w1, {'a': jnp.array([0.5, 2.5])}, m1, v1, **kw)
  np.testing.assert_allclose(m2['a'], [0.0081424, -0.05], rtol=1e-5)
  np.testing.assert_allclose(v2['a'], [5.32161e-4, 2.5e-4], rtol=1e-5)
  np.testing.assert_allclose(w2['a'], [1.0279096, 2.0314240], rtol=1e-6)


class _Tiny(nn.Module):
  """Dense(3) -> BatchNorm -> Dense(2) on 2 inputs."""

  @nn.compact
  def __call__(self, x, train=False):
    x = layers.BatchNorm()(nn.Dense(3)(x), train=train)
    return nn.Dense(2)(x)


def _tiny_variables():
  v = _Tiny().init(jax.random.PRNGKey(0), jnp.zeros((1, 2)))
  return {'params': v['params'], 'batch_stats': v['batch_stats']}


@pytest.mark.parametrize('setting,shared', [
    # Dense_0 2*3 + 3 = 9, Dense_1 3*2 + 2 = 8; BN: y, b 3 + 3 = 6; u, s 3 + 3 = 6.
    ('usyb', 9 + 8), ('yb', 9 + 8 + 6), ('us', 9 + 8 + 6), ('none', 9 + 8 + 6 + 6)])
def test_private_mask_and_element_count_by_hand(setting, shared):
  v = _tiny_variables()
  mask = private_bn.private_mask(v, setting)
  assert private_bn.shared_elements(v, mask) == shared
  assert mask['params']['Dense_0']['kernel'] is False
  assert mask['params']['BatchNorm_0']['scale'] is ('y' in setting)
  assert mask['batch_stats']['BatchNorm_0']['var'] is ('u' in setting)


def _mtfl_parts(setting='usyb'):
  """An MTFL object with only what its broadcast and server step read (no experiment)."""
  algo = MTFL.__new__(MTFL)
  algo.options = MTFLOptions(bn_private=setting)
  algo.__dict__['private'] = private_bn.private_mask(_tiny_variables(), setting)
  return algo


def _state(fill):
  """A ModelState of the tiny model whose leaves are ``fill(i, shape)`` (i: leaf number)."""
  v = _tiny_variables()
  leaves, tree = jax.tree.flatten(v)
  v = jax.tree.unflatten(tree, [fill(i, x.shape) for i, x in enumerate(leaves)])
  return ModelState(params=v['params'], batch_stats=v['batch_stats'], opt_state={})


def test_mtfl_server_step_averages_only_federated_leaves():
  algo = _mtfl_parts('usyb')
  # Two clients: every leaf of client 0 is 0, of client 1 is 4; n = 1, 3: mean 3.
  cohort = _state(lambda i, s: jnp.stack([jnp.zeros(s), jnp.full(s, 4.0)]))
  server = _state(lambda i, s: jnp.ones((1,) + s))          # w = 1 everywhere
  zeros = jax.tree.map(jnp.zeros_like, {'params': server.params,
                                        'batch_stats': server.batch_stats})
  new, extra = algo._server_step(server, MTFLServer(m=zeros, v=zeros), cohort,
                                 jnp.array([1.0, 3.0]))
  # Federated leaves: g = 1 - 3 = -2; m = -0.2, v = 0.004; w = 1 + 0.01 * 0.2 / (0.0632456
  # + 1e-4) = 1 + 0.002 / 0.0633456 = 1.0315728. Private BN leaves: the weighted mean 3
  # (a diagnostic, never sent), moments 0.
  np.testing.assert_allclose(new.params['Dense_0']['kernel'], 1.0315728, rtol=1e-6)
  np.testing.assert_allclose(extra.m['params']['Dense_1']['bias'], -0.2, rtol=1e-6)
  np.testing.assert_allclose(new.params['BatchNorm_0']['scale'], 3.0)
  np.testing.assert_allclose(new.batch_stats['BatchNorm_0']['mean'], 3.0)
  assert float(jnp.abs(extra.m['params']['BatchNorm_0']['bias']).max()) == 0.0
  assert float(jnp.abs(extra.v['batch_stats']['BatchNorm_0']['var']).max()) == 0.0


def test_mtfl_broadcast_keeps_private_bn_and_skips_inactive():
  algo = _mtfl_parts('usyb')
  cohort = _state(lambda i, s: jnp.stack([jnp.full(s, 5.0), jnp.full(s, 6.0)]))
  server = _state(lambda i, s: jnp.full((1,) + s, 9.0))
  out = algo._broadcast(cohort, server, jnp.array([True, False]))
  assert float(out.params['Dense_0']['kernel'][0].min()) == 9.0     # federated: global
  assert float(out.params['BatchNorm_0']['bias'][0].max()) == 5.0   # private: its own
  assert float(out.batch_stats['BatchNorm_0']['var'][0].max()) == 5.0
  assert float(out.params['Dense_1']['bias'][1].max()) == 6.0       # inactive: untouched
  yb = _mtfl_parts('yb')._broadcast(cohort, server, jnp.array([True, False]))
  assert float(yb.batch_stats['BatchNorm_0']['mean'][0].min()) == 9.0   # u, s federated


def test_mtfl_refuses_two_architectures_and_a_host_store():
  with pytest.raises(ConfigError, match='clients.models'):
    config_lib.validate(tiny_config('mtfl', rounds=1))
  with pytest.raises(ConfigError, match='clients.store'):
    config_lib.validate(tiny_config('mtfl', rounds=1, **{'clients.models': ['mlp@0.25'],
                                                         'clients.store': 'host'}))
  with pytest.raises(ConfigError, match='mtfl.bn_private'):
    config_lib.validate(tiny_config('mtfl', rounds=1, **{'clients.models': ['mlp@0.25'],
                                                         'mtfl.bn_private': 'ys'}))


# --------------------------------------------------------------- kNN-Per
# Datastore in 2-D (D = 2, scale 1, k = 3): (0,0) y0, (1,0) y0, (0,2) y1, (3,3) y1, plus a
# padding row (0,1) that must be ignored. Query (0,1): squared distances 1, 2, 1, 13, so the
# neighbours are (0,0), (0,2), (1,0) with weights exp(-1/2), exp(-1/2), exp(-2/2):
# 0.6065307, 0.6065307, 0.3678794. p_kNN(y0) = (0.6065307 + 0.3678794) / 1.5809408
# = 0.6163483, p_kNN(y1) = 0.3836517, p_kNN(y2) = 0.
STORE = np.array([[0, 0], [1, 0], [0, 2], [3, 3], [0, 1]], np.float32)
LABELS = np.array([0, 0, 1, 1, 2], np.int32)
VALID = np.array([True, True, True, True, False])


def test_knn_kernel_prediction_and_interpolation_by_hand():
  p, has = knn_ops.knn_probs(jnp.array([[0.0, 1.0]]), STORE, LABELS, VALID, k=3, scale=1.0,
                             num_classes=3)
  np.testing.assert_allclose(p[0], [0.6163483, 0.3836517, 0.0], rtol=1e-5, atol=1e-7)
  assert bool(has[0])
  # lambda = 0.5 with p_global = [0.2, 0.5, 0.3]: [0.4081741, 0.4418259, 0.15]; the global
  # model's argmax (1) is kept; lambda = 0.8 gives 0.8 * 0.6163 + 0.2 * 0.2 = 0.5331 > 0.4069:
  # class 0.
  pg = jnp.array([[0.2, 0.5, 0.3]])
  np.testing.assert_allclose(knn_ops.interpolate(p, pg, 0.5)[0], [0.4081741, 0.4418259, 0.15],
                             rtol=1e-5)
  assert int(jnp.argmax(knn_ops.interpolate(p, pg, 0.8)[0])) == 0
  # Scale 2: weights exp(-1/4), exp(-1/4), exp(-2/4) = 0.7788008, 0.7788008, 0.6065307:
  # p(y0) = 1.3853315 / 2.1641323 = 0.6401317.
  p2, _ = knn_ops.knn_probs(jnp.array([[0.0, 1.0]]), STORE, LABELS, VALID, k=3, scale=2.0,
                            num_classes=3)
  np.testing.assert_allclose(p2[0, 0], 0.6401317, rtol=1e-5)


def test_knn_leave_one_out_few_rows_and_empty_store():
  # Leave-one-out, k = 1. Query (0,0) without row 0 (itself): nearest (1,0) at d = 1: y0.
  # Query (0,2) without row 2 (itself): (0,0) at d = 4, (1,0) at 5, (3,3) at 10: y0.
  q = jnp.array([[0.0, 0.0], [0.0, 2.0]])
  p, _ = knn_ops.knn_probs(q, STORE, LABELS, VALID, k=1, scale=1.0, num_classes=3,
                           exclude=jnp.array([0, 2]))
  np.testing.assert_allclose(p, [[1, 0, 0], [1, 0, 0]])
  # k larger than the real rows: only the 4 real rows count (the padding is never used).
  p, has = knn_ops.knn_probs(jnp.array([[0.0, 1.0]]), STORE, LABELS, VALID, k=5, scale=1.0,
                             num_classes=3)
  assert float(p[0, 2]) == 0.0 and bool(has[0])
  # No real row at all: no kNN prediction; the interpolation keeps the global one.
  p, has = knn_ops.knn_probs(jnp.array([[0.0, 1.0]]), STORE, LABELS, np.zeros(5, bool), k=2,
                             scale=1.0, num_classes=3)
  assert not bool(has[0])
  np.testing.assert_allclose(knn_ops.interpolate(p, jnp.array([[0.2, 0.5, 0.3]]), 0.7, has),
                             [[0.2, 0.5, 0.3]])


def test_lambda_grid_and_ties_take_the_smaller_lambda():
  np.testing.assert_allclose(knn_per_lib.lambda_grid(0.1), np.arange(11) / 10, atol=1e-7)
  np.testing.assert_allclose(knn_per_lib.lambda_grid(0.3), [0, 0.3, 0.6, 0.9, 1.0], atol=1e-7)
  grid = jnp.array([0.0, 0.5, 1.0])
  assert float(knn_ops.choose(jnp.array([0.5, 0.7, 0.7]), grid)) == 0.5


def _numpy_knn(q, s, ys, k, scale, c):
  """A literal transcription of the authors' gather_knn_outputs (faiss IndexFlatL2)."""
  d = ((q[:, None, :] - s[None, :, :]) ** 2).sum(-1)
  idx = np.argsort(d, axis=1, kind='stable')[:, :k]
  dist = np.take_along_axis(d, idx, 1)
  w = np.exp(-dist / (s.shape[1] * scale))
  out = np.zeros((len(q), c))
  for cls in range(c):
    out[:, cls] = (w * (ys[idx] == cls)).sum(1) / w.sum(1)
  return out


def _scores(f_store, y_store, f_q, p_q, y_q, store, queries, lams, *, k, scale, num_classes,
            loo):
  """Every client's :class:`KNNScores` (its program's math, vmapped over the clients as the
  engine runs it): ``(acc, nll)`` ``[K, G]``."""
  program = knn_per_lib.KNNScores(k, scale, num_classes, loo)
  shared = {'f_store': jnp.asarray(f_store), 'y_store': jnp.asarray(y_store),
            'f_query': jnp.asarray(f_q), 'p_query': jnp.asarray(p_q),
            'y_query': jnp.asarray(y_q)}

  def one(si, sn, qi, qn, lam):
    row = {'store': si, 'store_n': sn, 'query': qi, 'query_n': qn, 'lam': lam}
    return program.final(None, None, row, shared)[1]

  return jax.vmap(one)(*(jnp.asarray(a) for a in (*store, *queries, lams)))


def test_batched_client_scores_match_a_per_client_numpy_loop():
  rng = np.random.default_rng(0)
  c, dim = 3, 4
  f_store = rng.normal(size=(12, dim)).astype(np.float32)
  y_store = rng.integers(0, c, 12).astype(np.int32)
  f_q = rng.normal(size=(7, dim)).astype(np.float32)
  p_q = rng.dirichlet(np.ones(c), 7).astype(np.float32)
  y_q = rng.integers(0, c, 7).astype(np.int32)
  # Client 0: store rows 0..7 (8), queries 0..4 (5); client 1: rows 8..10 (3 of 8 slots),
  # queries 5, 6 (2 of 5 slots); the padding repeats row 0 and must not matter.
  s_idx = np.array([[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 0, 0, 0, 0, 0]], np.int32)
  s_n = np.array([8, 3], np.int32)
  q_idx = np.array([[0, 1, 2, 3, 4], [5, 6, 0, 0, 0]], np.int32)
  q_n = np.array([5, 2], np.int32)
  lams = np.array([[0.0, 0.5, 1.0], [0.0, 0.3, 0.9]], np.float32)
  acc, nll = _scores(f_store, y_store, f_q, p_q, y_q, (s_idx, s_n), (q_idx, q_n),
                                 lams, k=3, scale=1.0, num_classes=c, loo=False)
  for kk in range(2):
    s = f_store[s_idx[kk, :s_n[kk]]]
    ys = y_store[s_idx[kk, :s_n[kk]]]
    rows = q_idx[kk, :q_n[kk]]
    pk = _numpy_knn(f_q[rows], s, ys, 3, 1.0, c)
    for g, lam in enumerate(lams[kk]):
      p = lam * pk + (1 - lam) * p_q[rows]
      np.testing.assert_allclose(acc[kk, g], np.mean(p.argmax(1) == y_q[rows]), atol=1e-6)
      want = -np.mean(np.log(np.maximum(p[np.arange(len(rows)), y_q[rows]], 1e-12)))
      np.testing.assert_allclose(nll[kk, g], want, rtol=1e-4)


def test_knn_per_options_are_checked():
  base = {'clients.models': ['mlp@0.25'], 'data.val_fraction': 0.1}
  with pytest.raises(ConfigError, match='knn_per.lam'):
    config_lib.validate(tiny_config('knn_per', rounds=1, **base, **{'knn_per.lam': 1.5}))
  # Tuning lambda needs held-out rows: without them the line names data.val_fraction.
  with pytest.raises(ConfigError, match=r'data.val_fraction=0.0 .*held out'):
    config_lib.validate(tiny_config('knn_per', rounds=1, **{**base, 'data.val_fraction': 0.0}))
  for fixed in ({'knn_per.lam': 0.5}, {'knn_per.tune': 'loo'}):   # nothing to hold out
    config_lib.validate(tiny_config('knn_per', rounds=1, **{**base, 'data.val_fraction': 0.0},
                                    **fixed))
  with pytest.raises(ConfigError, match='clients.models'):
    config_lib.validate(tiny_config('knn_per', rounds=1, **{'data.val_fraction': 0.1}))
  s = config_lib.validate(tiny_config('knn_per', rounds=1, **base))
  assert (s.options.k, s.options.scale, s.options.lam, s.options.tune) == (7, 1.0, -1.0, 'val')


def test_lambda_tuned_on_the_training_rows_is_zero_and_on_held_out_rows_is_not():
  # One client, two classes on a line: training rows at 0, 0.1 (class 0) and 5, 5.1 (class 1),
  # which the global model fits (0.9 on the true class); two held-out rows at 0.05 and 5.05
  # that it gets wrong (0.4 on the true class). k = 1.
  f = np.array([[0.0], [0.1], [5.0], [5.1], [0.05], [5.05]], np.float32)
  y = np.array([0, 0, 1, 1, 0, 1], np.int32)
  p = np.array([[.9, .1], [.9, .1], [.1, .9], [.1, .9], [.4, .6], [.6, .4]], np.float32)
  store = (np.array([[0, 1, 2, 3]], np.int32), np.array([4], np.int32))
  held_out = (np.array([[4, 5]], np.int32), np.array([2], np.int32))
  grid = np.array([[0.0, 0.5, 1.0]], np.float32)
  kw = dict(k=1, scale=1.0, num_classes=2)
  # Leave-one-out on the training rows: every row's neighbour shares its class, so every
  # lambda scores 1 and the tie goes to lambda = 0, the global model alone.
  acc, _ = _scores(f, y, f, p, y, store, store, grid, loo=True, **kw)
  np.testing.assert_allclose(acc, [[1.0, 1.0, 1.0]])
  assert float(knn_ops.choose(acc, grid[0])[0]) == 0.0
  # On the held-out rows the global model scores 0, and lambda = 0.5 already mixes in enough
  # of the kNN's one-hot vote: 0.5 (1, 0) + 0.5 (0.4, 0.6) = (0.7, 0.3).
  acc, _ = _scores(f, y, f, p, y, store, held_out, grid, loo=False, **kw)
  np.testing.assert_allclose(acc, [[0.0, 1.0, 1.0]])
  assert float(knn_ops.choose(acc, grid[0])[0]) == 0.5


# ------------------------------------------------------------ end to end
def _run(tmp_path, c, name='run'):
  from tests.test_fedcache2 import run   # pylint: disable=g-import-not-at-top
  return run(tmp_path, c, name)


@pytest.mark.slow
def test_mtfl_two_rounds_counts_only_federated_parameters(tmp_path):
  # text_dnn@0.25 on 8x8 inputs: Dense 64->128, BN(128), Dense 128->32, BN(32), Dense 32->10.
  model = 'text_dnn@0.25'
  c = tiny_config('mtfl', rounds=2, **{'clients.models': [model], 'server.model': model,
                                       'clients.participation': 0.5,
                                       'data.per_client_test': True})
  rows, summary = _run(tmp_path, c)
  shared = (64 * 128 + 128) + (128 * 32 + 32) + (32 * 10 + 10)            # 12,778
  private = 2 * (128 + 128) + 2 * (32 + 32)                               # y, b, u, s
  exp = experiment.build(config_lib.validate(c))
  st = exp.algorithm.init()
  total = sum(x.size for x in jax.tree.leaves((st.server.params, st.server.batch_stats)))
  assert total == shared + private and exp.algorithm.model_elements == shared
  assert summary['setup_bytes'] == shared * 4              # the initial global multicast
  for r in rows:                                           # 2 of 4 clients a round
    assert r['participants'] == 2
    assert r['up_bytes'] == 2 * shared * 4 and r['down_bytes'] == shared * 4
    assert 0.0 <= r['test_acc'] <= 1.0 and 0.0 <= r['global_acc'] <= 1.0
    assert np.isfinite(r['train_loss']) and 'server_ua' in r


@pytest.mark.slow
def test_knn_per_two_rounds_bytes_and_lambda_zero_is_the_global_model(tmp_path):
  c = tiny_config('knn_per', rounds=2, **{'clients.models': ['mlp@0.25'],
                                          'server.model': 'mlp@0.25', 'data.val_fraction': 0.2,
                                          'clients.participation': 0.5,
                                          'data.per_client_test': True})
  rows, summary = _run(tmp_path, c)
  # mlp@0.25 on 8x8 inputs: 64*50 + 50 + 50*50 + 50 + 50*10 + 10 = 6,310 floats.
  elements = 64 * 50 + 50 + 50 * 50 + 50 + 50 * 10 + 10
  assert summary['setup_bytes'] == elements * 4
  for r in rows:
    assert r['up_bytes'] == 2 * elements * 4 and r['down_bytes'] == elements * 4
    assert 0.0 <= r['test_acc'] <= 1.0 and 0.0 <= r['knn_lambda_mean'] <= 1.0
  # lambda = 0 is the global model: its UA is server_ua; lambda = 1 is the pure kNN.
  exp = experiment.build(config_lib.validate(c))
  algo = exp.algorithm
  st = algo.init()
  k = algo.num_clients
  acc0, _, _, n = algo.personalised_scores(st, lams=np.zeros(k, np.float32))
  split = algo.server_split_metrics(st)['server_ua']
  np.testing.assert_allclose(np.nanmean(acc0), split, rtol=1e-6)
  ev = algo.scores(st)
  assert ev['test_acc'] >= 0.0 and set(ev) >= {'global_acc', 'server_ua', 'knn_lambda_mean'}
