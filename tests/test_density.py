"""Selective-FD KuLSIF selector against a loop transcription and toy blobs."""

import numpy as np
import pytest

from fedjax_kd.ops import density


def _loop_kernel(a, b, sigma):
  return float(np.exp(-np.sum((a - b) ** 2) / (2.0 * sigma**2)))


def _loop_fit_and_ratio(private, seed, z, sigma, lambda_exponent):
  """Direct, loop-based transcription of Selective-FD's KuLSIF procedure (same rng draw order)."""
  rng = np.random.default_rng(seed)
  n_priv, dim = private.shape
  half = n_priv // 2
  m = int(0.9 * half)
  n = n_priv // 2
  sel = rng.choice(n_priv, size=half, replace=False)
  y = private[sel[:m]]
  x = rng.uniform(-1.0, 1.0, size=(n, dim))
  lam = n_priv**lambda_exponent
  a = np.zeros((n, n))
  b = np.zeros(n)
  for i in range(n):
    for k in range(n):
      a[i, k] = _loop_kernel(x[i], x[k], sigma) / n + (lam if i == k else 0.0)
    for j in range(m):
      b[i] -= _loop_kernel(x[i], y[j], sigma) / (n * m * lam)
  alpha = np.linalg.solve(a, b)
  r = np.zeros(len(z))
  for t in range(len(z)):
    for i in range(n):
      r[t] += alpha[i] * _loop_kernel(z[t], x[i], sigma)
    for j in range(m):
      r[t] += _loop_kernel(z[t], y[j], sigma) / (m * lam)
  return alpha, r


@pytest.mark.parametrize('sigma,lambda_exponent', [(5.0, 0.5), (0.7, -0.5)])
def test_ratio_matches_loop_transcription(sigma, lambda_exponent):
  data_rng = np.random.default_rng(0)
  private = data_rng.normal(0.0, 0.5, (20, 3))
  z = data_rng.normal(0.0, 1.0, (7, 3))
  model = density.kulsif_fit(private, np.random.default_rng(3), sigma=sigma,
                             lambda_exponent=lambda_exponent)
  alpha, r = _loop_fit_and_ratio(private, 3, z, sigma, lambda_exponent)
  np.testing.assert_allclose(model.alpha, alpha, rtol=0, atol=1e-12)
  np.testing.assert_allclose(density.kulsif_ratio(model, z), r, rtol=0,
                             atol=1e-10)
  # Batching does not change the result.
  np.testing.assert_allclose(density.kulsif_ratio(model, z, batch=2), r,
                             rtol=0, atol=1e-10)
  assert model.lam == pytest.approx(20**lambda_exponent)


def test_alpha_solves_linear_system():
  private = np.random.default_rng(1).normal(0.0, 0.3, (60, 5))
  model = density.kulsif_fit(private, np.random.default_rng(2))
  n, m, lam = model.n, model.m, model.lam
  sq = lambda a, b: np.sum((a[:, None] - b[None]) ** 2, axis=-1)
  k_xx = np.exp(-sq(model.x, model.x) / (2 * model.sigma**2))
  k_xy = np.exp(-sq(model.x, model.y) / (2 * model.sigma**2))
  lhs = (k_xx / n + lam * np.eye(n)) @ model.alpha
  rhs = -k_xy @ np.ones(m) / (n * m * lam)
  np.testing.assert_allclose(lhs, rhs, rtol=0, atol=1e-14)
  assert np.abs(rhs).max() > 1e-6  # Not a trivially zero system.


def test_sizes():
  private = np.random.default_rng(0).normal(size=(500, 4))
  model = density.kulsif_fit(private, np.random.default_rng(0))
  assert model.m == 225
  assert model.y.shape == (225, 4)
  assert model.held_out.shape == (25, 4)
  assert model.x.shape == (250, 4)
  assert model.n == 250
  assert model.alpha.shape == (250,)
  assert model.lam == pytest.approx(500**0.5)
  # Noise ~ Uniform(-1, 1); y and held-out rows are distinct private rows.
  assert np.all(np.abs(model.x) <= 1.0)
  rows = np.concatenate([model.y, model.held_out])
  assert len(np.unique(rows, axis=0)) == 250
  private_set = {tuple(r) for r in private}
  assert all(tuple(r) in private_set for r in rows)


def _blobs(seed=0, dim=16):
  rng = np.random.default_rng(seed)
  private = rng.normal(0.0, 0.1, (500, dim))
  near = rng.normal(0.0, 0.1, (200, dim))
  far = rng.normal(0.0, 0.1, (200, dim)) + 3.0
  return private, np.concatenate([near, far])


def _mask_feats(private, public, seed, tau):
  # [n, 4, 4, 1] images at size=4 flatten back to the 16-dim toy vectors.
  return density.inlier_mask(private.reshape(-1, 4, 4, 1),
                             public.reshape(-1, 4, 4, 1),
                             np.random.default_rng(seed), tau=tau, size=4)


def test_selector_keeps_in_distribution_and_rejects_far():
  private, public = _blobs()
  mask = _mask_feats(private, public, 7, 0.0625)
  assert mask.dtype == bool and mask.shape == (400,)
  assert mask[:200].mean() >= 0.8
  assert (~mask[200:]).mean() >= 0.8


def test_tau_zero_threshold_is_min_held_out_ratio():
  private, public = _blobs()
  mask = _mask_feats(private, public, 7, 0.0)
  model = density.kulsif_fit(private, np.random.default_rng(7))
  r_pub = density.kulsif_ratio(model, public)
  thr = density.kulsif_ratio(model, model.held_out).min()
  np.testing.assert_array_equal(mask, r_pub >= thr)
  assert mask[:200].mean() >= 0.9


def test_tau_monotonic():
  private, public = _blobs(seed=3)
  taus = [0.0, 0.0625, 0.1, 0.25, 0.5, 0.75, 1.0]
  masks = [_mask_feats(private, public, 11, t) for t in taus]
  counts = [int(m.sum()) for m in masks]
  assert counts == sorted(counts, reverse=True)
  for looser, tighter in zip(masks, masks[1:]):
    assert not np.any(tighter & ~looser)  # Larger tau keeps a subset.


def test_inlier_mask_images_end_to_end():
  rng = np.random.default_rng(0)
  private = rng.normal(0.0, 0.1, (200, 28, 28))
  public = np.concatenate([rng.normal(0.0, 0.1, (50, 28, 28)),
                           rng.normal(0.0, 0.1, (50, 28, 28)) + 1.0])
  mask = density.inlier_mask(private, public, np.random.default_rng(1),
                             tau=0.0625)
  assert mask.shape == (100,) and mask.dtype == bool
  assert mask[:50].mean() >= 0.8
  assert (~mask[50:]).mean() >= 0.8


def test_inlier_masks_matches_per_client_and_is_deterministic():
  rng = np.random.default_rng(0)
  x_private = rng.normal(0.0, 0.1, (120, 8, 8, 1))
  x_public = np.concatenate([rng.normal(0.0, 0.1, (30, 8, 8, 1)),
                             rng.normal(0.0, 0.1, (30, 8, 8, 1)) + 1.0])
  idx = [np.arange(0, 40), np.arange(40, 100), np.arange(100, 120)]
  masks = density.inlier_masks(x_private, idx, x_public, 5, tau=0.1, size=8)
  assert masks.shape == (3, 60) and masks.dtype == bool
  for k, ix in enumerate(idx):
    one = density.inlier_mask(x_private[ix], x_public,
                              np.random.default_rng([5, k]), tau=0.1, size=8)
    np.testing.assert_array_equal(masks[k], one)
  again = density.inlier_masks(x_private, idx, x_public, 5, tau=0.1, size=8)
  np.testing.assert_array_equal(masks, again)


def test_determinism_for_fixed_seed():
  private, public = _blobs(seed=1)
  a = density.kulsif_fit(private, np.random.default_rng(42))
  b = density.kulsif_fit(private, np.random.default_rng(42))
  c = density.kulsif_fit(private, np.random.default_rng(43))
  for f in ('x', 'y', 'alpha', 'held_out'):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  assert not np.array_equal(a.alpha, c.alpha)
  np.testing.assert_array_equal(_mask_feats(private, public, 42, 0.25),
                                _mask_feats(private, public, 42, 0.25))


def test_features_shapes_and_values():
  rng = np.random.default_rng(0)
  mnist = rng.random((5, 28, 28)).astype(np.float32)
  f = density.features(mnist)
  assert f.shape == (5, 1024) and f.dtype == np.float64
  assert density.features(mnist[..., None]).shape == (5, 1024)
  const = np.full((2, 28, 28, 1), -0.4242)
  np.testing.assert_allclose(density.features(const), -0.4242, rtol=0,
                             atol=1e-12)
  cifar = rng.random((3, 32, 32, 3))
  np.testing.assert_array_equal(density.features(cifar), cifar.reshape(3, -1))
  assert density.features(rng.random((2, 28, 28, 3))).shape == (2, 3072)


def test_features_bilinear_values():
  # 1x2 -> 4 along width, half-pixel centres: sources clip to 0, .25, .75, 1.
  img = np.array([[[[1.0], [5.0]]]])  # [1, H=1, W=2, C=1]
  out = density.features(img, size=4).reshape(4, 4)
  np.testing.assert_allclose(out, np.tile([1.0, 2.0, 4.0, 5.0], (4, 1)),
                             atol=1e-12)
  # Downsampling a linear ramp by 2 averages neighbouring pixels.
  ramp = np.arange(8.0)[None, None, :, None].repeat(8, axis=1)
  down = density.features(ramp, size=4).reshape(4, 4)
  np.testing.assert_allclose(down, np.tile([0.5, 2.5, 4.5, 6.5], (4, 1)),
                             atol=1e-12)


def test_bad_inputs():
  private, public = _blobs()
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match='tau'):
    density.inlier_mask(private[:, :4, None], public[:, :4, None], rng,
                        tau=1.5, size=4)
  with pytest.raises(ValueError, match='tau'):
    density.inlier_mask(private[:, :4, None], public[:, :4, None], rng,
                        tau=-0.1, size=4)
  with pytest.raises(ValueError, match='sigma'):
    density.inlier_mask(private[:, :4, None], public[:, :4, None], rng,
                        tau=0.1, sigma=0.0, size=4)
  with pytest.raises(ValueError, match='sigma'):
    density.kulsif_fit(private, rng, sigma=-1.0)
  with pytest.raises(ValueError, match='private'):
    density.kulsif_fit(private[:3], rng)
  with pytest.raises(ValueError, match=r'client_indices\[1\]'):
    density.inlier_masks(private[:, :4, None], [np.arange(10), np.arange(3)],
                         public[:, :4, None], 0, tau=0.1, size=4)
  with pytest.raises(ValueError, match='tau'):
    density.inlier_masks(private[:, :4, None], [np.arange(10)],
                         public[:, :4, None], 0, tau=float('nan'), size=4)
