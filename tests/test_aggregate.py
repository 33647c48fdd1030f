"""ERA / SA / power sharpening / entropy against hand-computed values (DS-FL §3)."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops import aggregate

# (mean input, T, ERA output, H(input), H(output)), computed by hand from DS-FL's eqs. 12-13.
ERA_TABLE = [
    ([0.5, 0.3, 0.2], 0.01, [1.0, 0.0, 0.0], 1.0297, 0.0),
    ([0.5, 0.3, 0.2], 0.1, [0.8438, 0.1142, 0.0420], 1.0297, 0.5243),
    ([0.5, 0.3, 0.2], 0.5, [0.4506, 0.3021, 0.2473], 1.0297, 1.0663),
    ([0.5, 0.3, 0.2], 1.0, [0.3907, 0.3199, 0.2894], 1.0297, 1.0906),
    ([0.4, 0.35, 0.25], 0.1, [0.5465, 0.3315, 0.1220], 1.0805, 0.9528),
    ([0.9, 0.05, 0.05], 0.1, [0.9996, 0.0002, 0.0002], 0.3944, 0.0039),
    ([1 / 3, 1 / 3, 1 / 3], 0.1, [1 / 3, 1 / 3, 1 / 3], 1.0986, 1.0986),
]


@pytest.mark.parametrize('mean,t,out,h_in,h_out', ERA_TABLE)
def test_era_matches_paper_examples(mean, t, out, h_in, h_out):
  got = aggregate.era(jnp.asarray(mean), t)
  np.testing.assert_allclose(got, out, atol=1e-4)
  assert float(aggregate.entropy(jnp.asarray(mean))) == pytest.approx(h_in, abs=1e-4)
  assert float(aggregate.entropy(got)) == pytest.approx(h_out, abs=1e-4)


def test_era_t05_raises_entropy_above_sa():
  """DS-FL Fig. 6: T = 0.5 gives *higher* entropy than SA (softmax of probabilities)."""
  mean = jnp.asarray([0.5, 0.3, 0.2])
  assert aggregate.entropy(aggregate.era(mean, 0.5)) > aggregate.entropy(mean)
  assert aggregate.entropy(aggregate.era(mean, 0.1)) < aggregate.entropy(mean)


def test_sa_and_era_over_clients():
  probs = jnp.asarray([[[0.6, 0.3, 0.1]], [[0.4, 0.3, 0.3]]])  # K=2, n=1, C=3
  sa = aggregate.aggregate(probs, 'sa')
  np.testing.assert_allclose(sa, [[0.5, 0.3, 0.2]], atol=1e-7)
  np.testing.assert_allclose(aggregate.aggregate(probs, 'era', 0.1),
                             [[0.8438, 0.1142, 0.0420]], atol=1e-4)


def test_weighted_mean_ignores_masked_clients():
  probs = jnp.asarray([[[0.6, 0.4]], [[0.2, 0.8]], [[0.0, 0.0]]])
  got = aggregate.mean_aggregate(probs, jnp.asarray([1.0, 1.0, 0.0]))
  np.testing.assert_allclose(got, [[0.4, 0.6]], atol=1e-7)
  got = aggregate.mean_aggregate(probs, jnp.asarray([3.0, 1.0, 0.0]))
  np.testing.assert_allclose(got, [[0.5, 0.5]], atol=1e-7)


def test_unknown_aggregation_names_allowed_values():
  with pytest.raises(ValueError, match="'sa', 'era'"):
    aggregate.aggregate(jnp.ones((1, 1, 2)) / 2, 'mean')


def test_power_sharpen_hand_values():
  p = jnp.asarray([0.5, 0.3, 0.2])
  # 0.25, 0.09, 0.04 / 0.38
  np.testing.assert_allclose(aggregate.power_sharpen(p, 2.0),
                             [0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38], rtol=1e-6)
  np.testing.assert_allclose(aggregate.power_sharpen(p, 1.0), p, rtol=1e-6)
  # Zeros stay zero, and huge beta does not overflow.
  q = jnp.asarray([0.7, 0.3, 0.0])
  out = aggregate.power_sharpen(q, 200.0)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, [1.0, 0.0, 0.0], atol=1e-6)
  # Tiny probabilities: p^beta underflows in float32 but the ratio is exact.
  r = jnp.asarray([1e-30, 2e-30])
  np.testing.assert_allclose(aggregate.power_sharpen(r, 3.0), [1 / 9, 8 / 9], rtol=1e-5)


def test_entropy_max_for_ten_classes():
  assert float(aggregate.entropy(jnp.full((10,), 0.1))) == pytest.approx(np.log(10), rel=1e-6)
  assert float(aggregate.entropy(jnp.asarray([1.0, 0.0]))) == 0.0


def test_uploader_mean_vote_and_l1_selector_by_hand():
  probs = jnp.asarray([[[0.6, 0.4], [0.2, 0.8], [0.5, 0.5]],
                       [[0.8, 0.2], [0.9, 0.1], [0.3, 0.7]],
                       [[0.1, 0.9], [0.0, 1.0], [0.0, 0.0]]])    # [K=3, n=3, C=2]
  mask = jnp.asarray([[True, True, False],
                      [True, False, False],
                      [False, True, False]])
  mean, count = aggregate.uploader_mean(probs, mask)
  np.testing.assert_allclose(mean, [[0.7, 0.3], [0.1, 0.9], [0.5, 0.5]], atol=1e-6)
  np.testing.assert_array_equal(count, [2, 2, 0])      # nobody uploaded sample 2: uniform
  votes, _ = aggregate.vote(probs, mask)
  np.testing.assert_allclose(votes, [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
  # |onehot - p|_1 = 2 (1 - max p); a tie gets two ones: |1-.5| + |1-.5| = 1
  np.testing.assert_allclose(aggregate.l1_to_onehot(jnp.asarray([[0.7, 0.3], [0.5, 0.5]])),
                             [0.6, 1.0], atol=1e-6)
