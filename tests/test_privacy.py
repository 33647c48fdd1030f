"""Noise mechanisms: Laplace label counts and noisy top-K soft predictions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops import privacy


def test_laplace_counts_scale_and_mean():
  rng = np.random.default_rng(0)
  eps = 0.5
  counts = np.full(200_000, 1e6)  # far from 0: no clipping
  noisy = privacy.laplace_counts(rng, counts, eps)
  dev = noisy - counts
  # Laplace(0, b): mean 0, E|X| = b = 1 / eps = 2, std = b sqrt(2).
  assert abs(dev.mean()) < 0.03
  assert np.mean(np.abs(dev)) == pytest.approx(1 / eps, rel=0.02)
  assert dev.std() == pytest.approx(np.sqrt(2) / eps, rel=0.02)
  assert noisy.dtype == np.float64 and noisy.shape == counts.shape


def test_laplace_counts_clips_and_is_seeded():
  counts = np.zeros((50, 10))
  a = privacy.laplace_counts(np.random.default_rng(3), counts, 1.0)
  b = privacy.laplace_counts(np.random.default_rng(3), counts, 1.0)
  np.testing.assert_array_equal(a, b)
  assert np.all(a >= 0)
  # Half the zero counts get negative noise and are clipped to exactly 0.
  assert 0.4 < np.mean(a == 0) < 0.6
  # Large epsilon: almost no noise.
  c = privacy.laplace_counts(np.random.default_rng(1), [5, 7, 0], 1e9)
  np.testing.assert_allclose(c, [5, 7, 0], atol=1e-7)


@pytest.mark.parametrize('eps', [0, -1.0, float('nan'), float('inf')])
def test_laplace_counts_bad_epsilon(eps):
  with pytest.raises(ValueError):
    privacy.laplace_counts(np.random.default_rng(0), [1, 2], eps)


def _topk_rows():
  probs = jnp.array([[.6, .3, 0., .1], [0., .5, .5, 0.], [.25, .25, .25, .25]],
                    jnp.float32)
  kept = probs > 0
  return probs, kept


_noisy = jax.jit(privacy.noisy_topk_probs, static_argnames='mechanism')


@pytest.mark.parametrize('mechanism', privacy.MECHANISMS)
def test_noisy_topk_scale_zero_is_identity(mechanism):
  probs, kept = _topk_rows()
  out = _noisy(jax.random.PRNGKey(0), probs, kept, mechanism, 0.0)
  np.testing.assert_allclose(out, probs, atol=1e-7)


@pytest.mark.parametrize('mechanism', privacy.MECHANISMS)
def test_noisy_topk_support_and_normalisation(mechanism):
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((64, 10))
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  top = np.argsort(-probs, axis=-1)[:, :3]
  kept = np.zeros_like(probs, bool)
  np.put_along_axis(kept, top, True, axis=-1)
  filt = np.where(kept, probs, 0)
  filt = (filt / filt.sum(-1, keepdims=True)).astype(np.float32)
  out = np.asarray(_noisy(jax.random.PRNGKey(1), filt, kept, mechanism, 0.05))
  assert out.dtype == np.float32
  assert np.all(out[~kept] == 0)
  assert np.all((out >= 0) & (out <= 1))
  np.testing.assert_allclose(out.sum(-1), 1, atol=1e-6)
  assert not np.allclose(out, filt)  # noise was added
  assert np.max(np.abs(out - filt)) < 0.5
  # Deterministic in the key; different keys differ.
  np.testing.assert_array_equal(out, _noisy(jax.random.PRNGKey(1), filt, kept, mechanism, 0.05))
  assert not np.array_equal(out, _noisy(jax.random.PRNGKey(2), filt, kept, mechanism, 0.05))


def test_noisy_topk_zero_mass_falls_back_to_uniform():
  probs, kept = _topk_rows()
  # Huge negative noise clips every kept entry to 0 for (almost) every row:
  # emulate with probs shifted far below 0 and tiny noise.
  out = _noisy(jax.random.PRNGKey(0), probs - 10.0, kept, 'gaussian', 1e-3)
  expected = np.asarray(kept, np.float32) / np.asarray(kept).sum(-1, keepdims=True)
  np.testing.assert_allclose(out, expected, atol=1e-7)
  # A row with nothing kept stays all zero.
  out = _noisy(jax.random.PRNGKey(0), jnp.zeros((1, 3)), jnp.zeros((1, 3), bool), 'laplace', 1.)
  np.testing.assert_array_equal(out, 0)


def test_noisy_topk_noise_scale_statistics():
  # Unclipped regime (values .5, small noise): the noise std matches the scale.
  probs = jnp.full((20_000, 2), .5, jnp.float32)
  kept = jnp.array([[True, False]] * 20_000)
  kept2 = jnp.ones((20_000, 2), bool)
  out = np.asarray(_noisy(jax.random.PRNGKey(0), probs, kept2, 'gaussian', 0.01))
  np.testing.assert_allclose(out.sum(-1), 1, atol=1e-6)
  # Before renormalisation a and b are .5 + n_a, .5 + n_b; a / (a + b) ~ .5 + (n_a - n_b) / 2.
  assert np.std(out[:, 0]) == pytest.approx(0.01 / np.sqrt(2), rel=0.05)
  out1 = _noisy(jax.random.PRNGKey(0), probs, kept, 'laplace', 0.1)
  np.testing.assert_allclose(out1, np.tile([1., 0.], (20_000, 1)), atol=1e-7)


def test_noisy_topk_bad_args():
  probs, kept = _topk_rows()
  with pytest.raises(ValueError):
    privacy.noisy_topk_probs(jax.random.PRNGKey(0), probs, kept, 'uniform', 0.1)
  with pytest.raises(ValueError):
    privacy.noisy_topk_probs(jax.random.PRNGKey(0), probs, kept, 'gaussian', -0.1)
