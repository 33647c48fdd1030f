"""SCARLET's soft-label cache (Algorithm 2) as device arrays, checked by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops import cache as C

N, NC = 10, 3


def _labels(rows):
  """Distinct recognisable labels: row r is [r, r + 0.1, r + 0.2] / scale."""
  rows = np.asarray(rows, np.float32)
  return jnp.asarray(np.stack([rows, rows + 0.1, rows + 0.2], -1) / 100.0)


def _round(cache, draw, t, d, fresh=None):
  idx, req = C.select(cache.stamp, jnp.asarray(draw, jnp.int32), t, d)
  if fresh is None:
    fresh = _labels(np.asarray(idx) + 10 * t)
  cache, zhat, sig = C.update_global(cache, idx, fresh, jnp.ones(idx.shape, bool), t, d)
  return cache, np.asarray(idx), np.asarray(req), zhat, np.asarray(sig)


def test_first_round_all_newly_cached_then_excluded_from_request():
  cache = C.empty_cache(N, NC)
  cache, idx, req, zhat, sig = _round(cache, [4, 1, 7], t=1, d=5)
  assert req.all() and (sig == C.NEWLY_CACHED).all()
  np.testing.assert_array_equal(np.asarray(cache.stamp)[[4, 1, 7]], [1, 1, 1])
  np.testing.assert_allclose(cache.labels[jnp.asarray(idx)], zhat)
  # Round 2 draws 7 again plus two new ones: 7 is not requested, and comes last.
  cache, idx, req, zhat, sig = _round(cache, [2, 7, 9], t=2, d=5)
  np.testing.assert_array_equal(idx, [2, 9, 7])
  np.testing.assert_array_equal(req, [True, True, False])
  np.testing.assert_array_equal(sig, [C.NEWLY_CACHED, C.NEWLY_CACHED, C.CACHED])
  np.testing.assert_allclose(zhat[2], _labels([7 + 10])[0])   # the round-1 label, as stored


@pytest.mark.parametrize('d', [0, 1, 3])
def test_expiry_boundary(d):
  """Cached at t_c: reused while t - t_c <= D; then EXPIRED (not stored); then re-cached."""
  cache = C.empty_cache(N, NC)
  cache, *_ = _round(cache, [3], t=10, d=d)
  for t in range(11, 10 + d + 1):           # t - t_c = 1 .. D: reused
    cache, _, req, _, sig = _round(cache, [3], t=t, d=d)
    assert not req[0] and sig[0] == C.CACHED, t
  t = 10 + d + 1                             # t - t_c = D + 1: requested, EXPIRED
  assert not bool(C.is_valid(cache.stamp, t, d)[3])
  cache, _, req, zhat, sig = _round(cache, [3], t=t, d=d)
  assert req[0] and sig[0] == C.EXPIRED
  np.testing.assert_allclose(zhat[0], _labels([3 + 10 * t])[0])   # fresh label used once
  assert int(cache.stamp[3]) == C.EMPTY
  cache, _, req, _, sig = _round(cache, [3], t=t + 1, d=d)
  assert req[0] and sig[0] == C.NEWLY_CACHED and int(cache.stamp[3]) == t + 1


def test_boundary_exactly_d_is_still_valid():
  stamp = jnp.asarray([5, 5, -1, 0], jnp.int32)
  np.testing.assert_array_equal(C.is_valid(stamp, 55, 50), [True, True, False, False])
  np.testing.assert_array_equal(C.is_valid(stamp, 56, 50), [False, False, False, False])


def test_absent_requested_index_is_left_alone():
  cache = C.empty_cache(N, NC)
  idx = jnp.asarray([1, 2], jnp.int32)
  cache, _, sig = C.update_global(cache, idx, _labels([1, 2]), jnp.asarray([True, False]), 1, 5)
  np.testing.assert_array_equal(sig, [C.NEWLY_CACHED, C.ABSENT])
  assert int(cache.stamp[2]) == C.EMPTY


def test_rebuild_local_fifo_by_hand():
  local = C.empty_cache(N, NC)
  local = C.SoftLabelCache(local.labels.at[2].set(_labels([2])[0]).at[7].set(_labels([7])[0]),
                           local.stamp.at[2].set(1).at[7].set(1))
  idx = jnp.asarray([5, 2, 7, 1], jnp.int32)
  sig = jnp.asarray([C.NEWLY_CACHED, C.CACHED, C.EXPIRED, C.NEWLY_CACHED], jnp.int32)
  queue = jnp.concatenate([_labels([50, 70, 10]), jnp.zeros((1, NC))])  # a, b, c, padding
  new, out = C.rebuild_local(local, idx, sig, queue, 4)
  want = _labels([50, 2, 70, 10])
  np.testing.assert_allclose(out, want)
  np.testing.assert_array_equal(np.asarray(new.stamp)[[5, 2, 7, 1]], [4, 1, C.EMPTY, 4])
  np.testing.assert_allclose(new.labels[5], want[0])
  np.testing.assert_allclose(new.labels[1], want[3])


def test_fifo_queue_puts_fresh_rows_first():
  sig = jnp.asarray([C.CACHED, C.NEWLY_CACHED, C.CACHED, C.EXPIRED], jnp.int32)
  q = C.fifo_queue(_labels([0, 1, 2, 3]), sig)
  np.testing.assert_allclose(q[:2], _labels([1, 3]))


def test_per_client_local_content():
  local = C.empty_cache(N, NC, num_clients=2)
  idx = jnp.asarray([4, 6], jnp.int32)
  sig = jnp.asarray([C.NEWLY_CACHED, C.NEWLY_CACHED], jnp.int32)
  queue = jnp.stack([_labels([1, 2]), _labels([3, 4])])
  new, out = C.rebuild_local(local, idx, sig, queue, 1)
  np.testing.assert_allclose(out, queue)
  np.testing.assert_allclose(new.labels[1, 6], _labels([4])[0])


def test_mirror_stays_in_sync_with_server_over_many_rounds():
  rng = np.random.default_rng(0)
  n_pub, n, d = 200, 40, 4
  server, local = C.empty_cache(n_pub, NC), C.empty_cache(n_pub, NC)
  for t in range(1, 60):
    draw = jnp.asarray(rng.choice(n_pub, n, replace=False), jnp.int32)
    idx, req = C.select(server.stamp, draw, t, d)
    fresh = jnp.asarray(rng.dirichlet(np.ones(NC), n), jnp.float32)
    server, zhat, sig = C.update_global(server, idx, fresh, jnp.ones(n, bool), t, d)
    np.testing.assert_array_equal(np.asarray(sig) == C.CACHED, ~np.asarray(req))
    local, rebuilt = C.rebuild_local(local, idx, sig, C.fifo_queue(zhat, sig), t)
    np.testing.assert_array_equal(rebuilt, zhat)
  np.testing.assert_array_equal(local.stamp, server.stamp)


@pytest.mark.parametrize('d', [10, 50])
def test_steady_state_hit_ratio(d):
  """SCARLET's steady-state hit ratio (the plateau of its Fig. 3): h(D) = pD / (pD + 2),
  p = |P^t| / |P| = 0.1 (our closed form, derived from the cache dynamics)."""
  rng = np.random.default_rng(1)
  n_pub, n, rounds = 10_000, 1000, 4 * d + 300
  cache = C.empty_cache(n_pub, 2)
  fresh = jnp.full((n, 2), 0.5, jnp.float32)
  ok = jnp.ones((n,), bool)
  hits, newly, expired = [], [], []
  for t in range(1, rounds + 1):
    draw = jnp.asarray(rng.choice(n_pub, n, replace=False), jnp.int32)
    idx, _ = C.select(cache.stamp, draw, t, d)
    cache, _, sig = C.update_global(cache, idx, fresh, ok, t, d)
    if t > rounds - 300:
      counts = C.signal_counts(sig)
      hits.append(counts['cached'] / n)
      newly.append(counts['newly_cached'])
      expired.append(counts['expired'])
  h = 0.1 * d / (0.1 * d + 2)
  assert abs(np.mean(hits) - h) < 0.01, (np.mean(hits), h)
  assert abs(np.mean(newly) - np.mean(expired)) < 0.02 * n
  assert abs(np.mean(newly) - n * (1 - h) / 2) < 0.02 * n   # ~143 each at D = 50


def test_catch_up_counts_and_sync_by_hand():
  # 3 clients x 6 public samples; I^t = [0, 1, 2, 3]
  client = jnp.asarray([[2, 2, -1, 4, -1, -1],     # holds the old entry of sample 3
                        [-1, 2, 7, 4, -1, -1],     # also misses 0 and holds a stale 2
                        [2, 2, -1, 4, -1, -1]], jnp.int32)
  kept = np.asarray(client[2])
  idx = jnp.asarray([0, 1, 2, 3], jnp.int32)
  server = jnp.asarray([2, 2, -1, 5], jnp.int32)   # server re-cached 3 at round 5
  receivers = jnp.asarray([True, True, False])
  upd, stale = C.catch_up_counts(client, idx, server, receivers)
  np.testing.assert_array_equal(upd, [1, 2, 0])     # client 0: sample 3; client 1: 0 and 3
  np.testing.assert_array_equal(stale, [0, 1, 0])   # client 1: sample 2
  post = jnp.asarray([2, 2, 9, -1], jnp.int32)
  new = C.sync_clients(client, idx, post, receivers)   # donates ``client``
  np.testing.assert_array_equal(new[0, :4], post)
  np.testing.assert_array_equal(new[1, :4], post)
  np.testing.assert_array_equal(new[2], kept)
