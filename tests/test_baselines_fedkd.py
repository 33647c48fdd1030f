"""FedKD (Wu et al., Nature Communications 2022): the server's step and byte rule by hand,
bad options, and end-to-end runs with heterogeneous mentors.

The energy schedule, kept rank, single-matrix compression and the mutual-distillation loss
(with each model's gradient) are worked by hand in test_baselines_fedcache_fedkd.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedkd import FedKD, factor_floats
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm
from fedjax_kd.ops import lowrank
from fedjax_kd.running import experiment
from tests.shared import tiny_config

K = 4


# ------------------------------------------------------------------ the server's step
def test_server_average_of_two_decompressed_updates_by_hand():
  # Client 1: W = diag(3, 1): energies 9, 1 of 10, T = 0.9 keeps rank 1 -> diag(3, 0);
  #           bias (1, 1) whole. Uploads 1 * (2 + 2 + 1) + 2 = 7 floats.
  # Client 2: W = diag(0, 2): rank 1, rebuilt exactly; bias (3, -1). Also 7 floats.
  updates = {'w': jnp.asarray([[[3., 0.], [0., 1.]], [[0., 0.], [0., 2.]]]),
             'b': jnp.asarray([[1., 1.], [3., -1.]])}
  agg = jax.jit(lowrank.aggregate_updates)
  # n = (1, 3): W = (diag(3, 0) + 3 diag(0, 2)) / 4 = diag(0.75, 1.5);
  # b = ((1, 1) + 3 (3, -1)) / 4 = (2.5, -0.5).
  # Downlink at 0.9: energies 2.25, 0.5625 of 2.8125; 2.25 < 0.9 * 2.8125 = 2.53 -> rank 2,
  # 2 * 5 + 2 = 12 floats.
  down, up, n_down = agg(updates, jnp.asarray([1., 3.]), 0.9)
  np.testing.assert_allclose(np.asarray(down['w']), [[0.75, 0], [0, 1.5]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(down['b']), [2.5, -0.5], atol=1e-6)
  assert up.tolist() == [7, 7] and int(n_down) == 12
  # At 0.8: 2.25 >= 0.8 * 2.8125 = 2.25 -> rank 1: only the 1.5 direction, 5 + 2 = 7 floats.
  down, _, n_down = agg(updates, jnp.asarray([1., 3.]), 0.8)
  np.testing.assert_allclose(np.asarray(down['w']), [[0, 0], [0, 1.5]], atol=1e-6)
  assert int(n_down) == 7
  # Uniform weights (the authors' code): W = diag(1.5, 1), b = (2, 0).
  down, _, _ = agg(updates, jnp.asarray([1., 1.]), 0.9)
  np.testing.assert_allclose(np.asarray(down['w']), [[1.5, 0], [0, 1]], atol=1e-6)
  np.testing.assert_allclose(np.asarray(down['b']), [2.0, 0.0], atol=1e-6)
  # The pieces the algorithm runs give the same: weighted sum, then the server's compression.
  rec, _ = jax.vmap(lowrank.compress_tree, in_axes=(0, None))(updates, 0.9)
  total = lowrank.weighted_sum(rec, jnp.asarray([1., 3.]))
  np.testing.assert_allclose(np.asarray(total['w']), [[3, 0], [0, 6]], atol=1e-6)
  down2, n2, ranks = lowrank.server_downlink(total, jnp.float32(4.0), 0.9)
  np.testing.assert_allclose(np.asarray(down2['w']), [[0.75, 0], [0, 1.5]], atol=1e-6)
  assert int(n2) == 12 and ranks.tolist() == [2]


def _rank_matrix(m, n, r):
  """An [m, n] matrix of rank r with singular values r, r-1, ..., 1 (exact zeros elsewhere)."""
  a = np.zeros((m, n), np.float32)
  for i in range(r):
    a[i, i] = r - i
  return a


def test_round_bytes_by_hand_from_the_kept_ranks():
  # A mentee of kernels [64, 16], [16, 16], [16, 10] and biases 16, 16, 10 (42 floats).
  shapes = [(64, 16), (16, 16), (16, 10)]
  # Exact-rank updates are kept whole at T = 0.999: client ranks (3, 2, 1) and (2, 2, 2).
  def tree(ranks):
    return {'k': [jnp.asarray(_rank_matrix(m, n, r)) for (m, n), r in zip(shapes, ranks)],
            'b': [jnp.ones(16), jnp.ones(16), jnp.ones(10)]}
  counts, ranks = [], []
  for rk in [(3, 2, 1), (2, 2, 2)]:
    _, n, kept = jax.jit(lowrank.compress_tree_ranked)(tree(rk), 0.999)
    counts.append(int(n))
    ranks.append(kept.tolist())
  # Leaves flatten 'b' before 'k': the ranks are of the kernels in order.
  assert ranks == [[3, 2, 1], [2, 2, 2]]
  # 3 * (64 + 16 + 1) + 2 * (16 + 16 + 1) + 1 * (16 + 10 + 1) + 42 = 243 + 66 + 27 + 42 = 378;
  # 2 * 81 + 2 * 33 + 2 * 27 + 42 = 162 + 66 + 54 + 42 = 324.
  assert counts == [378, 324]
  assert factor_floats(shapes, [3, 2, 1]) + 42 == 378
  # The server's factors at ranks (4, 3, 2): 4 * 81 + 3 * 33 + 2 * 27 + 42 = 519 floats.
  down = factor_floats(shapes, [4, 3, 2]) + 42
  assert down == 519
  algo = FedKD.__new__(FedKD)
  algo.__dict__['mentee_elements'] = 64 * 16 + 16 * 16 + 16 * 10 + 42   # 1482 floats
  # Two active clients, one of them out of date (gets the whole mentee first).
  payloads = algo.payloads(jnp.int32(378 + 324), jnp.int32(down), 2, jnp.int32(1))
  payloads = [p.read() for p in payloads]
  # acepfl (the paper's rules: every receiver counted): up (378 + 324) * 4 = 2808;
  # down 519 * 4 * 2 + 1482 * 4 = 4152 + 5928 = 10080.
  assert comm.count_bytes(payloads, comm.RULES['acepfl']) == {'up': 2808, 'down': 10080,
                                                             'total': 12888}
  # fedcache2 (a multicast counted once): down 519 * 4 + 1482 * 4 = 2076 + 5928 = 8004.
  assert comm.count_bytes(payloads, comm.RULES['fedcache2'])['down'] == 8004


# ------------------------------------------------------------------------ options
def tiny(rounds=2, **overrides):
  over = {'fedkd.mentee': 'mlp@0.25', 'checkpoint.every': 0}
  over.update(overrides)
  return tiny_config('fedkd', rounds=rounds, **over)


def test_bad_fedkd_options_name_the_field():
  for field, value in [('fedkd.tmin', 0.0), ('fedkd.tmax', 1.5), ('fedkd.weighting', 'sizes'),
                       ('fedkd.mentee', 'cnn@0.25'), ('fedkd.tmin', 0.99)]:   # 0.99 > tmax
    with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
      config_lib.validate(tiny(**{field: value}))
  o = config_lib.validate(tiny_config('fedkd')).options
  assert (o.tmin, o.tmax, o.mentee, o.hidden, o.weighting) == (0.95, 0.98, '', True, 'samples')


# ----------------------------------------------------------------------- end to end
def _mentee_layout(exp):
  """Shapes of the mentee's compressed leaves and its count of whole (vector) floats."""
  s = exp.algorithm.mentee_shapes
  leaves = jax.tree.leaves({'params': s.params, 'batch_stats': s.batch_stats})
  mats = [tuple(l.shape[1:]) for l in leaves if l.ndim >= 3]    # leading axis: the one model
  vec = sum(int(np.prod(l.shape[1:])) for l in leaves if l.ndim < 3)
  return mats, vec


@pytest.mark.slow
def test_fedkd_two_rounds_heterogeneous_mentors_bytes_by_hand(tmp_path):
  from tests.test_fedcache2 import run   # pylint: disable=g-import-not-at-top
  c = tiny()   # mentors mlp@0.25 and mlp@0.5, mentee mlp@0.25, all K = 4 clients a round
  exp = experiment.build(config_lib.validate(c))
  mats, vec = _mentee_layout(exp)
  elements = exp.algorithm.mentee_elements
  assert len(mats) == 3 and elements == sum(m * n for m, n in mats) + vec
  rows, summary = run(tmp_path, c)
  assert len(rows) == 2
  assert summary['setup_bytes'] == elements * 4 * K     # the initial mentee, K receivers
  for t, r in enumerate(rows, 1):
    up, down = r['up_ranks'], r['down_ranks']
    assert all(1 <= k <= K * min(m, n) for k, (m, n) in zip(up, mats))
    assert all(1 <= k <= min(m, n) for k, (m, n) in zip(down, mats))
    # Up: every client's factors (its ranks, summed here) and its vectors whole.
    assert r['up_bytes'] == 4 * (factor_floats(mats, up) + K * vec)
    # Down: the server's factors to each of the K clients (acepfl rules); nobody out of date.
    assert r['down_bytes'] == 4 * K * (factor_floats(mats, down) + vec)
    assert r['mentee_sync'] == 0
    assert r['energy'] == pytest.approx(0.95 + t / 2 * 0.03)
    assert 0 < r['compression'] < 1
    assert np.isfinite(r['train_loss']) and np.isfinite(r['mentee_ce'])
    assert 0.0 <= r['test_acc'] <= 1.0 and 0.0 <= r['mentee_acc'] <= 1.0


@pytest.mark.slow
def test_fedkd_partial_participation_downlink_is_the_global_change():
  c = tiny(rounds=3, **{'clients.participation': 0.5})
  exp = experiment.build(config_lib.validate(c))
  algo = exp.algorithm
  mats, vec = _mentee_layout(exp)
  state = base.init_state(algo)
  for t, ids in [(1, [0, 1]), (2, [1, 2])]:
    active = np.zeros(K, bool)
    active[ids] = True
    old = jax.tree.map(np.asarray, state.server.params)
    state, out = base.play_round(algo, state, t, active)
    new = jax.tree.map(np.asarray, state.server.params)
    # The global mentee moved by the server's factors: each kernel's change has the logged rank.
    change = [np.asarray(b - a)[0] for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new))]
    got = [int(np.linalg.matrix_rank(d.reshape(-1, d.shape[-1]), tol=1e-6))
           for d in change if d.ndim >= 2]
    assert got == out.metrics['down_ranks']
    # Client 2 missed round 1's downlink: it receives the whole mentee in round 2.
    assert out.metrics['mentee_sync'] == (t == 2)
    sent = comm.count_bytes(out.payloads, comm.RULES['acepfl'])
    assert sent['down'] == 4 * (2 * (factor_floats(mats, out.metrics['down_ranks']) + vec)
                                + (t == 2) * algo.mentee_elements)
    assert np.asarray(state.table.synced).tolist() == ([1, 1, 0, 0] if t == 1 else [1, 2, 2, 0])
