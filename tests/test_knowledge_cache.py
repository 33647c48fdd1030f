"""FedCache 2.0's knowledge cache and device-centric sampling (Eq. 13, 17), by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops import knowledge_cache as KC

# A small grid: K = 3 clients, C = 3 classes, ipc = 2 -> S = 6, slot classes
# [0, 0, 1, 1, 2, 2].
K, C, IPC = 3, 3, 2
S = C * IPC
SLOT = jnp.asarray(KC.slot_classes(C, IPC))
VALID = np.asarray([[1, 1, 1, 0, 1, 1],
                    [1, 0, 1, 1, 0, 0],
                    [1, 1, 0, 0, 1, 0]], bool)
# |S_c| = [5, 3, 3]


M = 2000   # draws per call; one shape everywhere keeps the number of compiles low


def _keys(n, seed=0):
  return jax.random.split(jax.random.PRNGKey(seed), n)


def _draw(valid, p, tau, seed=0, n=M, **kw):
  """``n`` independent draws (``bool[n, K, S]``) of one client's download."""
  p = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (M, C))
  out = KC.sample_clients(_keys(M, seed), jnp.asarray(valid, bool), SLOT, p, tau, **kw)
  return np.asarray(out)[:n]


def _class_counts(sel):
  """Per-class selected counts of ``bool[..., K, S]`` -> ``[..., C]``."""
  sel = np.asarray(sel)
  onehot = np.asarray(SLOT)[:, None] == np.arange(C)[None]       # [S, C]
  return sel.sum(-2) @ onehot.astype(np.int64)


def test_slot_classes_and_empty():
  np.testing.assert_array_equal(KC.slot_classes(3, 2), [0, 0, 1, 1, 2, 2])
  assert KC.slot_classes(3, 2).dtype == np.int32
  cache = KC.empty_cache(K, S, (4, 4, 1))
  assert cache.x.shape == (K, S, 4, 4, 1) and cache.x.dtype == jnp.float32
  assert not np.asarray(cache.valid).any()
  np.testing.assert_array_equal(cache.stamp, np.full((K, S), -1))
  np.testing.assert_array_equal(cache.nbytes, np.zeros((K, S)))


def test_write_replaces_whole_rows_of_writers_only():
  cache = KC.empty_cache(K, S, (2,))
  x1 = jnp.ones((K, S, 2)) * jnp.arange(K, dtype=jnp.float32)[:, None, None]
  cache = KC.write(cache, x1, jnp.ones((K, S), bool), jnp.full((K, S), 7.0),
                   jnp.asarray([True, True, True]), 1)
  np.testing.assert_array_equal(cache.stamp, np.ones((K, S)))
  # Round 3: only client 1 writes, with two invalid slots.
  v = np.ones((K, S), bool)
  v[1, [1, 4]] = False
  x3 = jnp.full((K, S, 2), 9.0)
  cache = KC.write(cache, x3, jnp.asarray(v), jnp.full((K, S), 3.0),
                   jnp.asarray([False, True, False]), 3)
  np.testing.assert_array_equal(cache.stamp[1], [3, -1, 3, 3, -1, 3])
  np.testing.assert_array_equal(cache.valid[1], v[1])
  np.testing.assert_array_equal(cache.x[1], np.full((S, 2), 9.0))
  np.testing.assert_array_equal(cache.nbytes[1], np.full(S, 3.0))
  for r in (0, 2):   # untouched
    np.testing.assert_array_equal(cache.stamp[r], np.ones(S))
    assert np.asarray(cache.valid[r]).all()
    np.testing.assert_array_equal(cache.x[r], np.full((S, 2), float(r)))
    np.testing.assert_array_equal(cache.nbytes[r], np.full(S, 7.0))


def test_class_sizes_by_hand():
  np.testing.assert_array_equal(KC.class_sizes(jnp.asarray(VALID), SLOT, C), [5, 3, 3])
  np.testing.assert_array_equal(KC.class_sizes(jnp.asarray(VALID[1]), SLOT, C), [1, 2, 0])
  np.testing.assert_array_equal(KC.class_sizes(jnp.zeros((K, S), bool), SLOT, C), [0, 0, 0])


def test_expected_download():
  p = jnp.asarray([0.5, 0.5, 0.0])
  np.testing.assert_allclose(KC.expected_download(jnp.asarray(VALID), SLOT, p, 0.5),
                             [0.75 * 5, 0.75 * 3, 0.5 * 3])
  # Excluding row 0 leaves |S_c| = [3, 2, 1].
  np.testing.assert_allclose(
      KC.expected_download(jnp.asarray(VALID), SLOT, p, 0.5, exclude_row=0),
      [0.75 * 3, 0.75 * 2, 0.5 * 1])


def test_bad_mode_raises():
  with pytest.raises(ValueError, match='count'):
    KC.sample(_keys(1)[0], jnp.asarray(VALID), SLOT, jnp.ones(C) / C, 0.5, mode='nope')
  with pytest.raises(ValueError, match='bernoulli'):
    KC.sample_clients(_keys(2), jnp.asarray(VALID), SLOT, jnp.ones((2, C)) / C, 0.5, mode='x')


@pytest.mark.parametrize('mode', ['count', 'bernoulli', 'repo'])
def test_tau_one_downloads_everything(mode):
  # 'repo' with tau = 1 takes m = min |S_c| items per class: with all classes
  # of size 3 that is everything.
  valid = VALID if mode != 'repo' else np.asarray(
      [[1, 1, 1, 0, 1, 1], [1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0]], bool)
  if mode == 'repo':
    np.testing.assert_array_equal(KC.class_sizes(jnp.asarray(valid), SLOT, C), [3, 3, 3])
  sels = _draw(valid, [0.2, 0.3, 0.5], 1.0, n=50, mode=mode)
  np.testing.assert_array_equal(sels, np.broadcast_to(valid, sels.shape))


def test_count_tau_zero_one_hot():
  want = VALID & (np.asarray(SLOT) == 0)[None]
  sels = _draw(VALID, [1.0, 0.0, 0.0], 0.0, n=50)
  np.testing.assert_array_equal(sels, np.broadcast_to(want, sels.shape))


def test_count_exact_when_integer():
  # |S| = [4, 4, 2] (row 2 empty).
  valid = np.asarray([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1], [0] * 6], bool)
  np.testing.assert_array_equal(KC.class_sizes(jnp.asarray(valid), SLOT, C), [4, 4, 2])
  # tau = 0, p = [.5, 0, .5]: q |S| = [2, 0, 1] exactly, every draw.
  counts = _class_counts(_draw(valid, [0.5, 0.0, 0.5], 0.0, n=200))
  np.testing.assert_array_equal(counts, np.tile([2, 0, 1], (200, 1)))
  # tau = .5, p = [0, .5, .5]: q = [.5, .75, .75], q |S| = [2, 3, 1.5]; class 2
  # is rounded stochastically to 1 or 2.
  counts = _class_counts(_draw(valid, [0.0, 0.5, 0.5], 0.5, seed=1, n=200))
  np.testing.assert_array_equal(counts[:, :2], np.tile([2, 3], (200, 1)))
  assert set(counts[:, 2]) == {1, 2}


def test_count_stochastic_rounding_mean_uniformity_and_validity():
  # |S| = [5, 3, 3]; p = [.5, .25, .25], tau = 0 -> q |S| = [2.5, .75, .75].
  sels = _draw(VALID, [0.5, 0.25, 0.25], 0.0, seed=2)
  assert not (sels & ~VALID[None]).any()
  counts = _class_counts(sels)
  np.testing.assert_allclose(counts.mean(0), [2.5, 0.75, 0.75], atol=0.05)
  assert counts[:, 0].min() == 2 and counts[:, 0].max() == 3
  # Every class-0 item is drawn with probability 2.5 / 5 = 0.5.
  cls0 = VALID & (np.asarray(SLOT) == 0)[None]
  freq = sels[:, cls0].sum(0)
  expected = M * 0.5
  chi2 = ((freq - expected) ** 2 / expected).sum()
  assert chi2 < 30, (freq, chi2)    # 4 degrees of freedom: p ~ 1e-5


def test_count_uniform_with_fixed_n():
  # q_0 = .4 -> n_0 = 2 of the 5 class-0 items, exactly; each item p = .4.
  sels = _draw(VALID, [0.4, 0.3, 0.3], 0.0, seed=3)
  cls0 = VALID & (np.asarray(SLOT) == 0)[None]
  assert (sels[:, cls0].sum(1) == 2).all()
  freq = sels[:, cls0].sum(0)
  expected = M * 0.4
  assert ((freq - expected) ** 2 / expected).sum() < 30, freq


def test_bernoulli_mean_fraction():
  # tau = .5, p = [.6, .4, 0] -> q = [.8, .7, .5].
  sels = _draw(VALID, [0.6, 0.4, 0.0], 0.5, seed=4, mode='bernoulli')
  assert not (sels & ~VALID[None]).any()
  frac = _class_counts(sels).mean(0) / np.asarray([5, 3, 3])
  np.testing.assert_allclose(frac, [0.8, 0.7, 0.5], atol=0.03)
  assert len({tuple(c) for c in _class_counts(sels[:50])}) > 1   # counts vary


def test_repo_hand_case():
  # |S| = [4, 2, 3]; p = [.5, .5, 0], tau = .5 -> q = [.75, .75, .5];
  # m = 2; n = floor(2 q / .75) = [2, 2, 1].
  valid = np.asarray([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 0], [0] * 6], bool)
  np.testing.assert_array_equal(KC.class_sizes(jnp.asarray(valid), SLOT, C), [4, 2, 3])
  sels = _draw(valid, [0.5, 0.5, 0.0], 0.5, seed=5, n=100, mode='repo')
  assert not (sels & ~valid[None]).any()
  np.testing.assert_array_equal(_class_counts(sels), np.tile([2, 2, 1], (100, 1)))
  assert len({s.tobytes() for s in sels}) > 1   # random items, not the first ones


def test_repo_ignores_empty_intermediate_class():
  # |S| = [4, 0, 3]: the repository's min over all bincounts would be 0 (no
  # download); ours is over non-empty classes, m = 3.
  valid = np.asarray([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 0], [0] * 6], bool)
  # tau = 1: n = [3, 3, 3] -> [3, 0, 3] after clipping to |S_c|.
  counts = _class_counts(_draw(valid, [0.2, 0.3, 0.5], 1.0, n=10, mode='repo'))
  np.testing.assert_array_equal(counts, np.tile([3, 0, 3], (10, 1)))
  # tau = 0, p = [0, 0, 1]: q / max q = [0, 0, 1] -> n = [0, 0, 3].
  counts = _class_counts(_draw(valid, [0.0, 0.0, 1.0], 0.0, n=10, mode='repo'))
  np.testing.assert_array_equal(counts, np.tile([0, 0, 3], (10, 1)))
  # Empty cache: nothing.
  assert not _draw(np.zeros((K, S), bool), [1 / 3] * 3, 0.5, n=10, mode='repo').any()


@pytest.mark.parametrize('mode', ['count', 'bernoulli'])
def test_cap_keeps_random_subset(mode):
  # tau = 1 selects all 11 valid items; cap = 4 keeps 4 distinct valid ones.
  sels = _draw(VALID, [1 / 3] * 3, 1.0, seed=6, mode=mode, cap=4)
  assert (sels.sum((1, 2)) == 4).all()
  assert not (sels & ~VALID[None]).any()
  # Uniform random subsample: every valid item kept with probability 4/11,
  # the high class ids included (no truncation).
  np.testing.assert_allclose(sels.mean(0)[VALID], 4 / 11, atol=0.04)
  # Fewer selected than the cap: unchanged (tau = 0, one-hot on class 1 -> 3 items).
  sels = _draw(VALID, [0.0, 1.0, 0.0], 0.0, n=20, mode=mode, cap=4)
  want = VALID & (np.asarray(SLOT) == 1)[None]
  np.testing.assert_array_equal(sels, np.broadcast_to(want, sels.shape))


def test_exclude_row():
  rows = jnp.asarray(np.resize([1, 0, -1, K], M), jnp.int32)
  # tau = 1: everything except the excluded row (-1 and K exclude nothing).
  sels = _draw(VALID, [1 / 3] * 3, 1.0, n=4, exclude_rows=rows)
  for i, r in enumerate([1, 0, None, None]):
    want = VALID.copy()
    if r is not None:
      want[r] = False
    np.testing.assert_array_equal(sels[i], want)
  # |S_c| is counted without the row: without row 0, |S| = [3, 2, 1]; p one-hot
  # on class 1, tau = 0 -> exactly the 2 class-1 items of rows 1 and 2.
  sels = _draw(VALID, [0.0, 1.0, 0.0], 0.0, exclude_rows=rows)[1::4]
  assert not sels[:, 0].any()
  np.testing.assert_array_equal(_class_counts(sels), np.tile([0, 2, 0], (len(sels), 1)))
  # The single-client entry point agrees.
  sel = KC.sample(_keys(1)[0], jnp.asarray(VALID), SLOT, jnp.ones(C) / C, 1.0, exclude_row=2)
  want = VALID.copy()
  want[2] = False
  np.testing.assert_array_equal(sel, want)


def test_sample_clients_matches_sample_and_keys_differ():
  keys = _keys(M, 8)
  p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(9), (M, C)))
  valid = jnp.asarray(VALID)
  fn = jax.jit(lambda k, p, t: KC.sample_clients(k, valid, SLOT, p, t))
  sels = np.asarray(fn(keys, p, jnp.float32(0.3)))
  assert sels.shape == (M, K, S) and sels.dtype == bool
  for i in (0, 7):
    np.testing.assert_array_equal(sels[i], KC.sample(keys[i], valid, SLOT, p[i], 0.3))
  # Same p for all, different keys -> different draws.
  sels = _draw(VALID, [0.5, 0.25, 0.25], 0.3, seed=8, n=20)
  assert len({s.tobytes() for s in sels}) > 1
  # Traced tau = 1 downloads everything.
  out = np.asarray(fn(keys, p, jnp.float32(1.0)))
  np.testing.assert_array_equal(out, np.broadcast_to(VALID, (M, K, S)))
