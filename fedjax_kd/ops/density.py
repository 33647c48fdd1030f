"""Selective-FD client-side selector: KuLSIF density-ratio outlier detection.

Implements the client-side "selector" of J. Shao, F. Wu, J. Zhang, "Selective
knowledge sharing for privacy-preserving federated distillation without a good
teacher", Nature Communications 2024 (Selective-FD), as reproduced by the code
of the SCARLET paper (Azuma et al. 2025). Each client estimates the density
ratio between its private data and uniform noise with KuLSIF (kernel
unconstrained least-squares importance fitting) and flags a public sample as an
outlier (one it should not share a soft label for) when its estimated ratio
falls below the ``tau``-quantile of the ratios of held-out private samples.

Algorithm (per client, ``n_priv`` private samples, feature dimension ``D``):
  * features: the (already normalised) image bilinearly resized to 32x32,
    channel count kept, flattened to float64 (:func:`features`);
  * a random half of the private set (``n_priv // 2`` samples, without
    replacement) is drawn; its first ``m = int(0.9 * half)`` samples are the
    numerator samples ``y``, the remaining ones are held out;
  * ``n = n_priv // 2`` denominator samples ``x`` are i.i.d.
    ``Uniform(-1, 1)^D`` noise;
  * Gaussian kernel ``k(a, b) = exp(-||a - b||^2 / (2 sigma^2))``;
  * ``lambda = n_priv ** lambda_exponent`` (full private size);
  * ``alpha = (K_xx / n + lambda I_n)^{-1} (-K_xy 1_m / (n m lambda))``;
  * ``r(z) = sum_i alpha_i k(z, x_i) + (1 / (m lambda)) sum_j k(z, y_j)``;
  * ``thr = quantile(r(held_out), tau)``; public sample ``j`` is an outlier
    iff ``r(public_j) < thr``.

Everything is plain NumPy float64 (``numpy.linalg`` only); it runs once per
client at start-up, so no JAX is involved.
"""

from __future__ import annotations

import dataclasses

import numpy as np

_MIN_PRIVATE = 4


@dataclasses.dataclass(frozen=True, eq=False)
class KuLSIF:
  """A fitted KuLSIF density-ratio model.

  Attributes:
    x: ``[n, D]`` denominator (uniform-noise) samples.
    y: ``[m, D]`` numerator (private) samples.
    alpha: ``[n]`` coefficients of the denominator kernel terms.
    lam: regulariser ``lambda``.
    sigma: Gaussian kernel bandwidth.
    m: number of numerator samples (``len(y)``).
    held_out: ``[n_held, D]`` held-out private features (for the threshold).
  """
  x: np.ndarray
  y: np.ndarray
  alpha: np.ndarray
  lam: float
  sigma: float
  m: int
  held_out: np.ndarray

  @property
  def n(self) -> int:
    """Number of denominator samples."""
    return int(self.x.shape[0])


def _check_sigma(sigma: float) -> float:
  sigma = float(sigma)
  if not np.isfinite(sigma) or sigma <= 0:
    raise ValueError(f'sigma must be a finite number > 0, got {sigma!r}')
  return sigma


def _check_tau(tau: float) -> float:
  tau = float(tau)
  if not 0.0 <= tau <= 1.0:  # Also rejects NaN.
    raise ValueError(f'tau must be in [0, 1], got {tau!r}')
  return tau


def _check_lambda_exponent(lambda_exponent: float) -> float:
  lambda_exponent = float(lambda_exponent)
  if not np.isfinite(lambda_exponent):
    raise ValueError(
        f'lambda_exponent must be finite, got {lambda_exponent!r}')
  return lambda_exponent


def _resize_matrix(n_in: int, n_out: int) -> np.ndarray:
  """``[n_out, n_in]`` bilinear interpolation weights (half-pixel centres)."""
  src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
  src = np.clip(src, 0.0, n_in - 1)
  lo = np.floor(src).astype(np.int64)
  hi = np.minimum(lo + 1, n_in - 1)
  frac = src - lo
  w = np.zeros((n_out, n_in), np.float64)
  rows = np.arange(n_out)
  np.add.at(w, (rows, lo), 1.0 - frac)
  np.add.at(w, (rows, hi), frac)
  return w


def features(x: np.ndarray, size: int = 32) -> np.ndarray:
  """Selector feature vectors: images bilinearly resized to ``size x size``.

  The channel count is kept (MNIST ``28x28x1 -> 1024`` dims, CIFAR
  ``32x32x3 -> 3072``); images that are already ``size x size`` are only
  flattened. Resizing uses half-pixel-centre bilinear interpolation, whose
  weights sum to one, so constant images stay constant.

  Args:
    x: ``[n, H, W, C]`` or ``[n, H, W]`` images (already normalised).
    size: output height and width.

  Returns:
    ``[n, size * size * C]`` float64 features (row-major ``H, W, C`` order).
  """
  size = int(size)
  if size < 1:
    raise ValueError(f'size must be a positive integer, got {size!r}')
  x = np.asarray(x, dtype=np.float64)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4:
    raise ValueError(
        f'x must have shape [n, H, W] or [n, H, W, C], got {x.shape}')
  n, h, w, c = x.shape
  if (h, w) != (size, size):
    wh = _resize_matrix(h, size)  # [size, H]
    ww = _resize_matrix(w, size)  # [size, W]
    t = np.matmul(np.matmul(wh, x.transpose(0, 3, 1, 2)), ww.T)  # [n, C, s, s]
    x = np.ascontiguousarray(t.transpose(0, 2, 3, 1))  # [n, size, size, C]
  return x.reshape(n, -1)


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """``[len(a), len(b)]`` squared Euclidean distances, clipped at 0."""
  d = (np.sum(a * a, axis=1)[:, None] + np.sum(b * b, axis=1)[None, :]
       - 2.0 * (a @ b.T))
  return np.maximum(d, 0.0)


def _kernel(a: np.ndarray, b: np.ndarray, sigma: float) -> np.ndarray:
  """Gaussian kernel matrix ``exp(-||a_i - b_j||^2 / (2 sigma^2))``."""
  return np.exp(-_sq_dists(a, b) / (2.0 * sigma * sigma))


def kulsif_fit(private_feats: np.ndarray,
               rng: np.random.Generator,
               *,
               sigma: float = 5.0,
               lambda_exponent: float = 0.5) -> KuLSIF:
  """Fits KuLSIF between a client's private features and uniform noise.

  Draws ``n_priv // 2`` private samples without replacement (first 90% as
  numerator samples, the rest held out) and then ``n_priv // 2`` noise samples
  from ``Uniform(-1, 1)^D``, in that order, from ``rng``.

  Args:
    private_feats: ``[n_priv, D]`` private features (see :func:`features`).
    rng: random generator (consumed).
    sigma: Gaussian kernel bandwidth (> 0).
    lambda_exponent: ``lambda = n_priv ** lambda_exponent``.

  Returns:
    The fitted :class:`KuLSIF` model.
  """
  sigma = _check_sigma(sigma)
  lambda_exponent = _check_lambda_exponent(lambda_exponent)
  feats = np.asarray(private_feats, dtype=np.float64)
  if feats.ndim != 2:
    raise ValueError(
        f'private_feats must have shape [n_priv, D], got {feats.shape}')
  n_priv, dim = feats.shape
  if n_priv < _MIN_PRIVATE:
    raise ValueError(
        f'private_feats: a client needs at least {_MIN_PRIVATE} private '
        f'samples for the KuLSIF selector, got {n_priv}')
  half = n_priv // 2
  m = int(0.9 * half)
  n = n_priv // 2
  sel = rng.choice(n_priv, size=half, replace=False)
  y = feats[sel[:m]]
  held_out = feats[sel[m:]]
  x = rng.uniform(-1.0, 1.0, size=(n, dim))
  lam = float(n_priv) ** lambda_exponent

  k_xx = _kernel(x, x, sigma)
  k_xy = _kernel(x, y, sigma)
  a = k_xx / n + lam * np.eye(n)
  b = -k_xy.sum(axis=1) / (n * m * lam)
  try:
    alpha = np.linalg.solve(a, b)
  except np.linalg.LinAlgError:
    alpha = np.linalg.pinv(a) @ b
  return KuLSIF(x=x, y=y, alpha=alpha, lam=lam, sigma=sigma, m=m,
                held_out=held_out)


def kulsif_ratio(model: KuLSIF, feats: np.ndarray,
                 batch: int = 1000) -> np.ndarray:
  """Estimated density ratio ``r(z)`` of a fitted KuLSIF model.

  ``r(z) = sum_i alpha_i k(z, x_i) + (1 / (m lambda)) sum_j k(z, y_j)``,
  evaluated ``batch`` rows at a time to bound memory.

  Args:
    model: a model from :func:`kulsif_fit`.
    feats: ``[N, D]`` features to evaluate.
    batch: rows per kernel block (> 0).

  Returns:
    ``[N]`` float64 ratios.
  """
  batch = int(batch)
  if batch < 1:
    raise ValueError(f'batch must be a positive integer, got {batch!r}')
  feats = np.asarray(feats, dtype=np.float64)
  if feats.ndim != 2 or feats.shape[1] != model.x.shape[1]:
    raise ValueError(
        f'feats must have shape [N, {model.x.shape[1]}], got {feats.shape}')
  out = np.empty(feats.shape[0], np.float64)
  coef = 1.0 / (model.m * model.lam)
  for s in range(0, feats.shape[0], batch):
    z = feats[s:s + batch]
    out[s:s + batch] = (_kernel(z, model.x, model.sigma) @ model.alpha
                        + coef * _kernel(z, model.y, model.sigma).sum(axis=1))
  return out


def _mask_from_feats(private_feats: np.ndarray, public_feats: np.ndarray,
                     rng: np.random.Generator, tau: float, sigma: float,
                     lambda_exponent: float) -> np.ndarray:
  """Inlier mask from precomputed features (see :func:`inlier_mask`)."""
  model = kulsif_fit(private_feats, rng, sigma=sigma,
                     lambda_exponent=lambda_exponent)
  thr = np.quantile(kulsif_ratio(model, model.held_out), q=tau)
  return kulsif_ratio(model, public_feats) >= thr


def inlier_mask(private_x: np.ndarray,
                public_x: np.ndarray,
                rng: np.random.Generator,
                *,
                tau: float,
                sigma: float = 5.0,
                lambda_exponent: float = 0.5,
                size: int = 32) -> np.ndarray:
  """One client's Selective-FD selector over the public set.

  Args:
    private_x: ``[n_priv, H, W(, C)]`` the client's private images.
    public_x: ``[N_pub, H, W(, C)]`` public images.
    rng: random generator (consumed).
    tau: quantile of the held-out ratios used as threshold, in ``[0, 1]``.
    sigma: Gaussian kernel bandwidth (> 0).
    lambda_exponent: ``lambda = n_priv ** lambda_exponent``.
    size: feature resize side (see :func:`features`).

  Returns:
    ``[N_pub]`` bool, True for inliers (samples the client keeps/shares).
  """
  tau = _check_tau(tau)
  sigma = _check_sigma(sigma)
  return _mask_from_feats(features(private_x, size), features(public_x, size),
                          rng, tau, sigma, lambda_exponent)


def inlier_masks(x_private: np.ndarray,
                 client_indices: list[np.ndarray],
                 x_public: np.ndarray,
                 seed: int,
                 *,
                 tau: float,
                 sigma: float = 5.0,
                 lambda_exponent: float = 0.5,
                 size: int = 32) -> np.ndarray:
  """Selective-FD selector masks for all clients.

  Public features are computed once; client ``k`` uses
  ``np.random.default_rng([seed, k])``, so its mask does not depend on the
  other clients.

  Args:
    x_private: ``[N_priv_total, H, W(, C)]`` pooled private images.
    client_indices: ``K`` index arrays into ``x_private``, one per client.
    x_public: ``[N_pub, H, W(, C)]`` public images.
    seed: base seed (non-negative integer).
    tau: quantile of the held-out ratios used as threshold, in ``[0, 1]``.
    sigma: Gaussian kernel bandwidth (> 0).
    lambda_exponent: ``lambda = n_priv ** lambda_exponent``.
    size: feature resize side (see :func:`features`).

  Returns:
    ``[K, N_pub]`` bool, True for inliers of each client.
  """
  tau = _check_tau(tau)
  sigma = _check_sigma(sigma)
  x_private = np.asarray(x_private)
  pub = features(x_public, size)
  masks = np.zeros((len(client_indices), pub.shape[0]), dtype=bool)
  for k, idx in enumerate(client_indices):
    idx = np.asarray(idx, dtype=np.int64)
    if idx.size < _MIN_PRIVATE:
      raise ValueError(
          f'client_indices[{k}]: a client needs at least {_MIN_PRIVATE} '
          f'private samples for the KuLSIF selector, got {idx.size}')
    rng = np.random.default_rng([int(seed), k])
    masks[k] = _mask_from_feats(features(x_private[idx], size), pub, rng, tau,
                                sigma, lambda_exponent)
  return masks
