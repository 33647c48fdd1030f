"""FedCache (and FedKD) baselines of FedCache 2.0: hand-worked formulas, end-to-end bytes.

Quick tier: the related-sample kNN table on toy points, the R-mean teacher, FedCache's
per-sample loss on 2 classes. Slow tier: 2-round runs with the bytes computed by hand.
"""

import numpy as np
import jax.numpy as jnp
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.errors import ConfigError
from fedjax_kd.running import experiment
import jax

from fedjax_kd.ops import lowrank
from fedjax_kd.ops import related_knowledge as rk

# ------------------------------------------------------------------ FedCache: kNN table
#  row  point        label owner
#   0   (1, 0)         0     0
#   1   (1, 1)         0     1      cos(0,1) = 0.7071
#   2   (0, 1)         0     1      cos(0,2) = 0, cos(1,2) = 0.7071
#   3   (2, 0.1)       0    -1      held by no client: never a neighbour
#   4   (1, 0.1)       1     0
#   5   (-1, 0)        1     2      the only other class-1 sample
#   6   (1, 0.2)       0     0      cos(6,0) = 0.9806, cos(6,1) = 0.8321, cos(6,2) = 0.1961
POINTS = np.array([[1, 0], [1, 1], [0, 1], [2, 0.1], [1, 0.1], [-1, 0], [1, 0.2]], np.float32)
LABELS = np.array([0, 0, 0, 0, 1, 1, 0], np.int32)
OWNER = np.array([0, 1, 1, -1, 0, 2, 0], np.int32)


def _table(r=2, **kw):
  idx, valid = rk.related_samples(jnp.asarray(POINTS), jnp.asarray(LABELS), jnp.asarray(OWNER),
                                  r, chunk=3, **kw)
  return np.asarray(idx), np.asarray(valid)


def test_related_samples_by_hand():
  idx, valid = _table()
  # Row 1: cos to 6 (0.8321) beats the tie 0 / 2 (0.7071 each): the lower row, 0, wins.
  # Row 3 (unowned) still gets neighbours: 0 (0.9988) then 6 (0.9891).
  # Rows 4, 5: one candidate of their class each; the second slot is empty.
  expect = [[6, 1], [6, 0], [1, 6], [0, 6], [5, 0], [4, 0], [0, 1]]
  expect_valid = [[1, 1], [1, 1], [1, 1], [1, 1], [1, 0], [1, 0], [1, 1]]
  np.testing.assert_array_equal(valid, np.asarray(expect_valid, bool))
  np.testing.assert_array_equal(idx, expect)


def test_related_samples_other_clients_and_any_class():
  idx, valid = _table(other_clients=True)
  # Row 0 (client 0): only client 1's rows 1 (0.7071) and 2 (0); row 6 likewise.
  # Row 1 (client 1): rows 6 (0.8321) and 0 (0.7071); row 2: 1 excluded -> 6 (0.1961), 0 (0).
  np.testing.assert_array_equal(idx[[0, 1, 2, 6]], [[1, 2], [6, 0], [6, 0], [1, 2]])
  assert valid[[0, 1, 2, 6]].all() and valid[4].tolist() == [True, False]
  idx, _ = _table(same_class=False)
  # Any class: row 4 (1, 0.1) is nearest to 6 (0.9999) then 0 (0.9950).
  assert idx[4].tolist() == [6, 0]


def test_related_samples_match_a_brute_force_transcription():
  gen = np.random.default_rng(0)
  f = gen.normal(size=(50, 5)).astype(np.float32)
  y = gen.integers(0, 3, 50).astype(np.int32)
  own = gen.integers(-1, 4, 50).astype(np.int32)
  idx, valid = rk.related_samples(jnp.asarray(f), jnp.asarray(y), jnp.asarray(own), 4,
                                  chunk=16)
  u = f / np.linalg.norm(f, axis=1, keepdims=True)
  for i in range(50):
    cand = [j for j in range(50) if j != i and own[j] >= 0 and y[j] == y[i]]
    best = sorted(cand, key=lambda j: (-float(u[i] @ u[j]), j))[:4]
    assert np.asarray(idx)[i][np.asarray(valid)[i]].tolist() == best


def test_related_targets_mean_of_valid_entries():
  cache = jnp.asarray([[1., 0.], [3., 2.], [5., 4.]])
  idx = jnp.asarray([[1, 2], [0, 0], [2, 0]])
  valid = jnp.asarray([[True, True], [True, False], [False, False]])
  t, w = rk.related_targets(cache, idx, valid)
  # Row 0: mean of rows 1 and 2 = (4, 3); row 1: row 0 alone; row 2: no teacher.
  np.testing.assert_allclose(np.asarray(t), [[4, 3], [1, 0], [0, 0]])
  np.testing.assert_array_equal(np.asarray(w), [1, 1, 0])


def test_write_logits_and_owners():
  cache, seen = rk.write_logits(jnp.zeros((4, 2)), jnp.zeros(4, bool),
                                jnp.asarray([[2, 0], [1, 3]]), jnp.ones((2, 2, 2)) * 7,
                                jnp.asarray([[True, False], [True, True]]))
  np.testing.assert_array_equal(np.asarray(seen), [False, True, True, True])
  np.testing.assert_array_equal(np.asarray(cache)[:, 0], [0, 7, 7, 7])
  owner = rk.owners(np.asarray([[3, 1, 0], [2, 0, 0]]), np.asarray([2, 1]), 5)
  np.testing.assert_array_equal(owner, [-1, 0, 1, 0, -1])


# ------------------------------------------------------------- FedCache: the local loss
def test_cache_kd_loss_two_classes_by_hand():
  beta, temp = 1.5, 2.0
  logits = jnp.asarray([[0.0, 0.0], [np.log(3.0), 0.0], [0.0, 0.0]])
  labels = jnp.asarray([0, 1, 0])
  # Teacher logits (2 ln 3, 0): at T = 2 the teacher is softmax(ln 3, 0) = (3/4, 1/4).
  targets = jnp.asarray([[2 * np.log(3.0), 0.0]] * 3)
  weight = jnp.asarray([1.0, 1.0, 0.0])
  got = np.asarray(jax.jit(rk.cache_kd_loss)(logits, labels, targets, weight, beta, temp))
  # Sample 0: q = (1/2, 1/2). CE = ln 2 = 0.693147;
  #   KL = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.304099 - 0.173287 = 0.130812;
  #   loss = 0.693147 + 1.5 * 4 * 0.130812 = 1.478019.
  # Sample 1: p = (3/4, 1/4), CE = -ln(1/4) = 1.386294; at T = 2, q = softmax(ln 3 / 2, 0) =
  #   (0.633975, 0.366025); KL = 3/4 ln(0.75/0.633975) + 1/4 ln(0.25/0.366025) = 0.030738;
  #   loss = 1.386294 + 6 * 0.030738 = 1.570721.
  # Sample 2: weight 0 (no related sample): CE only, ln 2.
  np.testing.assert_allclose(got, [1.478019, 1.570721, 0.693147], atol=2e-6)


# ------------------------------------------------------- FedKD: SVD energy compression
def test_energy_threshold_schedule():
  # T(t) = 0.95 + (t / 100) * 0.03 (FedCache 2.0 Table III: tmin 0.95, tmax 0.98).
  got = [float(lowrank.energy_threshold(t, 100, 0.95, 0.98)) for t in (1, 50, 100)]
  np.testing.assert_allclose(got, [0.9503, 0.965, 0.98], atol=1e-6)


def test_kept_rank_and_bytes_by_hand():
  # Singular values 3, 2, 1: energies 9, 4, 1 of 14; cumulative 0.643, 0.929, 1.
  g = jnp.asarray([[3., 0, 0], [0, 2, 0], [0, 0, 1], [0, 0, 0]])      # [4, 3]
  sigma = jnp.asarray([3., 2., 1.])
  kept = jax.jit(jax.vmap(lowrank.kept_rank, in_axes=(None, 0)))
  assert kept(sigma, jnp.asarray([0.6, 0.9, 0.95, 1.0])).tolist() == [1, 2, 3, 3]
  assert kept(jnp.zeros(3), jnp.asarray([0.9])).tolist() == [0]      # nothing to send
  rec, k = jax.jit(lowrank.compress_matrix)(g, 0.9)
  assert int(k) == 2
  np.testing.assert_allclose(np.asarray(rec), [[3, 0, 0], [0, 2, 0], [0, 0, 0], [0, 0, 0]],
                             atol=1e-5)
  # Rank 2 of a [4, 3] matrix: U_k 4x2, S_k 2, V_k 2x3 = 2 * (4 + 3 + 1) = 16 floats = 64 B.
  assert int(lowrank.factor_elements((4, 3), k)) * 4 == 64
  # A tree: the same matrix as a conv kernel [2, 2, 1, 3] (a [4, 3] matrix) and a bias [3].
  tree = {'kernel': g.reshape(2, 2, 1, 3), 'bias': jnp.ones(3)}
  compress = jax.jit(lowrank.compress_tree)
  rec_tree, n = compress(tree, 0.9)
  assert int(n) == 16 + 3                                   # at 0.95: 3 * 8 + 3 = 27
  assert int(compress(tree, 0.95)[1]) == 27
  np.testing.assert_allclose(np.asarray(rec_tree['kernel']).reshape(4, 3),
                             np.asarray(rec), atol=1e-6)
  # vmapped over clients, one rank per client.
  ranks = jax.vmap(lambda m: lowrank.compress_matrix(m, 0.9)[1])(jnp.stack([g, 0 * g]))
  assert ranks.tolist() == [2, 0]


def test_mutual_distillation_loss_by_hand():
  # Mentor p_t = (3/4, 1/4), mentee p_s = (1/2, 1/2), label 0.
  # CE_t = -ln 0.75 = 0.287682, CE_s = ln 2 = 0.693147, w = 1 / 0.980829 = 1.019545;
  # KL(p_s || p_t) = 0.143841, KL(p_t || p_s) = 0.130812;
  # total = 0.980829 + 1.019545 * (0.143841 + 0.130812) = 1.260851.
  zt = jnp.asarray([[np.log(3.0), 0.0]])
  zs = jnp.zeros((1, 2))
  y, m = jnp.asarray([0]), jnp.asarray([True])
  loss = jax.jit(lowrank.mutual_distillation_loss)
  total, parts = loss(zt, zs, y, m)
  np.testing.assert_allclose(float(total), 1.260851, atol=1e-5)
  np.testing.assert_allclose(float(parts['weight']), 1.019545, atol=1e-5)
  # Each model learns from its own terms only: d/dz_s = (p_s - e_y) + w (p_s - p_t)
  # = (-0.754886, 0.754886); d/dz_t = (p_t - e_y) + w (p_t - p_s) = (0.004886, -0.004886).
  gt, gs = jax.jit(jax.grad(lambda a, b: loss(a, b, y, m)[0], argnums=(0, 1)))(zt, zs)
  np.testing.assert_allclose(np.asarray(gs), [[-0.754886, 0.754886]], atol=1e-5)
  np.testing.assert_allclose(np.asarray(gt), [[0.004886, -0.004886]], atol=1e-5)
  # Hidden loss: identical similarity structure costs nothing, whatever the widths.
  h = jnp.asarray([[1., 0.], [0., 1.]])
  _, parts = loss(jnp.zeros((2, 2)), jnp.zeros((2, 2)), jnp.asarray([0, 1]),
                  jnp.asarray([True, True]), h, jnp.concatenate([h, h], axis=1) * 5)
  assert abs(float(parts['hidden'])) < 1e-6
  # Orthogonal mentor features (similarities I) vs parallel mentee features (all ones): the
  # two off-diagonal entries differ by 1, so the mean over the 4 pairs is 2 / 4 = 0.5.
  _, parts = loss(jnp.zeros((2, 2)), jnp.zeros((2, 2)), jnp.asarray([0, 1]),
                  jnp.asarray([True, True]), h, jnp.asarray([[1., 0.], [1., 0.]]))
  np.testing.assert_allclose(float(parts['hidden']), 0.5, atol=1e-6)


# ----------------------------------------------------------------------- end to end
K, C = 4, 10


def tiny(algorithm, **overrides):
  from tests.test_fedcache2 import fc2_tiny   # pylint: disable=g-import-not-at-top
  return fc2_tiny(rounds=2, algorithm=algorithm, **overrides)


def test_bad_fedcache_options_name_the_field():
  for field, value in [('fedcache.r', 0), ('fedcache.cold_start', 'warm'),
                       ('fedcache.temperature', 0.0), ('fedcache.beta', -1.0)]:
    with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
      config_lib.validate(tiny('fedcache', **{field: value}))


@pytest.mark.slow
def test_fedcache_two_rounds_bytes_by_hand(tmp_path):
  from tests.test_fedcache2 import run   # pylint: disable=g-import-not-at-top
  c = tiny('fedcache')
  exp = experiment.build(config_lib.validate(c))
  n = int(np.sum(exp.ctx.data.client_n))      # every private sample is some client's
  cache = exp.algorithm.init().extra
  assert cache.related.shape == (exp.ctx.data.x_private.shape[0], 16)
  rows, summary = run(tmp_path, c)
  # Setup: 576 float32 hash features and a one-byte label per private sample.
  assert summary['setup_bytes'] == n * (576 * 4 + 1)
  for r in rows:   # full participation: every sample's C-float teacher down, logits + id up
    assert r['down_bytes'] == n * C * 4
    assert r['up_bytes'] == n * (C * 4 + 4)
    assert np.isfinite(r['train_loss']) and 0.0 <= r['test_acc'] <= 1.0
  # Every sample was uploaded in round 1 (metrics are read at the end of a round).
  assert rows[0]['cache_seen'] == rows[1]['cache_seen'] == 1.0
  assert rows[0]['kd_coverage'] == 1.0
