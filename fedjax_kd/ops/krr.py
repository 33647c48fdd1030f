"""Kernel ridge regression (KRR) for on-device dataset distillation.

Implements the distillation objective of FedCache 2.0: Q. Pan, S. Sun, Z. Wu,
Y. Wang, M. Liu, B. Gao, J. Wang, "FedCache 2.0: Federated Edge Learning with
Knowledge Caching and Dataset Distillation", arXiv 2405.13378. Each client
distills its local data into a small synthetic set by kernel ridge regression on
penultimate-layer features (FRePo-style neural feature regression with a linear
kernel): the distilled prototypes ``X_b`` with labels ``Y_b`` form the KRR
support set, and the real local samples ``(X_i, Y_i)`` are the regression
targets.

The paper's Eq. 12 as printed swaps ``y_b`` and ``y_i`` (the dimensions do not
match: ``(K_bb + lam I)^{-1}`` is ``[n_b, n_b]`` and can only multiply the
``[n_b, C]`` distilled labels). We implement standard KRR with the distilled set
as support and the real local data as targets::

  L(X_b) = 1/2 * mean_{i in targets} || Y_i - K_ib (K_bb + lam I)^{-1} Y_b ||^2,
  K_bb = Phi_b Phi_b^T,   K_ib = Phi_i Phi_b^T,
  lam  = reg * tr(K_bb) / n_valid,   reg = 1e-6 by default,

where ``Phi`` are penultimate-layer features; ``reg = 1e-6`` follows the
authors' code (``nfr(..., reg=1e-6)``), whose loss is ``mean_squared_loss``
(half the squared error summed over classes, averaged over samples).

Padding: the support set may be padded to a fixed size. A ``valid`` mask
``[n_b]`` marks the real prototype rows; masked rows are zeroed in the features
and labels and the solve is equivalent to the reduced system on valid rows only.
Likewise ``target_mask`` ``[n_t]`` marks the real target rows of the loss.

Numerics: the linear solve uses a Cholesky factorisation in the input dtype
(float32). In float32 ``K_bb + lam I`` can be numerically indefinite when
``K_bb`` is (near) singular, e.g. two identical prototypes with the tiny default
ridge; the factor then contains NaNs. As a fallback (a scale-relative version of
the authors' ``+ 1e-3 * I`` retry) the ridge is increased to
``lam + 1e-3 * tr(K_bb) / n_valid``; should that also fail (only for extreme
round-off), ``lam + tr(K_bb)`` is used, for which ``K + lam I`` has condition
number at most 2. All candidates are evaluated under ``jit`` and selected with
``jnp.where``; the final factorisation is recomputed on the chosen ridge so that
no NaN from a rejected candidate reaches the gradients.

All functions are pure, jittable, vmappable and differentiable with respect to
the prototype features ``phi_b``. No gradient is stopped: callers pass
already-detached target features.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

_HIGHEST = jax.lax.Precision.HIGHEST

# Fallback ridge, relative to the mean diagonal of K_bb (authors' +1e-3*I).
_FALLBACK_RIDGE = 1e-3


def _valid_vector(valid: Array | None, n: int, dtype) -> Array:
  """The ``[n]`` support mask as a {0, 1} vector of ``dtype``."""
  if valid is None:
    return jnp.ones((n,), dtype)
  return jnp.asarray(valid).astype(dtype)


def _trace_and_count(k_bb: Array, v: Array) -> tuple[Array, Array]:
  """Trace of ``K_bb`` over valid rows and ``max(n_valid, 1)``."""
  trace = jnp.sum(jnp.diagonal(k_bb) * v)
  count = jnp.maximum(jnp.sum(v), 1.0)
  return trace, count


def krr_ridge(k_bb: Array, valid: Array | None = None,
              reg: float = 1e-6) -> Array:
  """The scale-relative KRR ridge ``lam = reg * tr(K_bb) / n_valid``.

  Args:
    k_bb: ``[n_b, n_b]`` support kernel matrix.
    valid: optional ``[n_b]`` mask (bool or {0, 1} float) of real support rows;
      only their diagonal entries enter the trace and the count.
    reg: relative ridge strength (authors' default ``1e-6``).

  Returns:
    A scalar ridge of ``k_bb``'s dtype. If the trace-based value is not
    positive (all-zero features), 1.0 is returned instead: any ridge yields the
    same zero prediction then, and 1.0 keeps the solution and gradients
    moderate.
  """
  k_bb = jnp.asarray(k_bb)
  v = _valid_vector(valid, k_bb.shape[-1], k_bb.dtype)
  trace, count = _trace_and_count(k_bb, v)
  lam = reg * trace / count
  return jnp.where(lam > 0, lam, jnp.ones((), k_bb.dtype)).astype(k_bb.dtype)


def _masked_system(k_bb: Array, v: Array) -> Array:
  """``K_bb`` with masked rows/cols zeroed and a unit diagonal on them."""
  k = k_bb * v[:, None] * v[None, :]
  return k + jnp.diag(1.0 - v)


def _chol_ok(a: Array) -> Array:
  """Whether the Cholesky factor of ``a`` is finite (probe; no gradient)."""
  factor = jnp.linalg.cholesky(jax.lax.stop_gradient(a))
  return jnp.all(jnp.isfinite(factor))


def krr_solve(k_bb: Array, y_b: Array, valid: Array | None = None,
              reg: float = 1e-6) -> Array:
  """KRR coefficients ``alpha = (K_bb + lam I)^{-1} Y_b``.

  Masked rows/cols of ``K_bb`` are zeroed and given a unit diagonal and masked
  rows of ``Y_b`` are zeroed, so ``alpha`` equals the solution of the reduced
  system on the valid rows and is 0 on masked rows. The solve uses a Cholesky
  factorisation in the input dtype; if the factor is not finite (float32
  round-off makes ``K + lam I`` numerically indefinite, e.g. duplicate
  prototypes), the ridge ``lam + 1e-3 * tr(K_bb) / n_valid`` is used instead,
  and ``lam + tr(K_bb)`` as a last resort (see the module docstring).

  Args:
    k_bb: ``[n_b, n_b]`` symmetric PSD support kernel.
    y_b: ``[n_b, C]`` support labels (one-hot or soft).
    valid: optional ``[n_b]`` mask (bool or {0, 1} float) of real support rows.
    reg: relative ridge strength, see :func:`krr_ridge`.

  Returns:
    ``[n_b, C]`` coefficients, finite for finite inputs.
  """
  k_bb = jnp.asarray(k_bb)
  y_b = jnp.asarray(y_b)
  dtype = jnp.result_type(k_bb.dtype, y_b.dtype)
  k_bb = k_bb.astype(dtype)
  y_b = y_b.astype(dtype)
  n_b = k_bb.shape[-1]
  v = _valid_vector(valid, n_b, dtype)

  lam = krr_ridge(k_bb, v, reg)
  trace, count = _trace_and_count(k_bb, v)
  lam_fallback = lam + _FALLBACK_RIDGE * trace / count
  lam_last = lam + trace

  k = _masked_system(k_bb, v)
  eye = jnp.eye(n_b, dtype=dtype)
  ok = _chol_ok(k + lam * eye)
  ok_fallback = _chol_ok(k + lam_fallback * eye)
  lam_eff = jnp.where(ok, lam, jnp.where(ok_fallback, lam_fallback, lam_last))

  factor = jnp.linalg.cholesky(k + lam_eff * eye)
  alpha = jax.scipy.linalg.cho_solve((factor, True), y_b * v[:, None])
  return alpha * v[:, None]


def krr_predict(phi_t: Array, phi_b: Array, y_b: Array,
                valid: Array | None = None, reg: float = 1e-6) -> Array:
  """Linear-kernel KRR predictions ``K_tb (K_bb + lam I)^{-1} Y_b``.

  Args:
    phi_t: ``[n_t, d]`` target (query) features.
    phi_b: ``[n_b, d]`` support (distilled prototype) features.
    y_b: ``[n_b, C]`` support labels.
    valid: optional ``[n_b]`` mask of real support rows; masked rows of
      ``phi_b`` are zeroed before the kernels are built.
    reg: relative ridge strength, see :func:`krr_ridge`.

  Returns:
    ``[n_t, C]`` predictions.
  """
  phi_b = jnp.asarray(phi_b)
  v = _valid_vector(valid, phi_b.shape[0], phi_b.dtype)
  phi_bm = phi_b * v[:, None]
  k_bb = jnp.matmul(phi_bm, phi_bm.T, precision=_HIGHEST)
  k_tb = jnp.matmul(phi_t, phi_bm.T, precision=_HIGHEST)
  alpha = krr_solve(k_bb, y_b, v, reg)
  return jnp.matmul(k_tb, alpha, precision=_HIGHEST)


def krr_loss(phi_t: Array, y_t: Array, phi_b: Array, y_b: Array,
             valid: Array | None = None, target_mask: Array | None = None,
             reg: float = 1e-6) -> Array:
  """FedCache 2.0 distillation loss (half squared error of KRR predictions).

  ``0.5 * sum_c (pred - y_t)^2`` per target row, averaged over the rows where
  ``target_mask`` is set (the authors' ``mean_squared_loss``).

  Args:
    phi_t: ``[n_t, d]`` features of the real local samples (targets).
    y_t: ``[n_t, C]`` float one-hot (or soft) target labels.
    phi_b: ``[n_b, d]`` features of the distilled prototypes (support).
    y_b: ``[n_b, C]`` float labels of the prototypes.
    valid: optional ``[n_b]`` mask of real support rows.
    target_mask: optional ``[n_t]`` mask of real target rows.
    reg: relative ridge strength, see :func:`krr_ridge`.

  Returns:
    Scalar loss.
  """
  pred = krr_predict(phi_t, phi_b, y_b, valid, reg)
  y_t = jnp.asarray(y_t).astype(pred.dtype)
  per_row = 0.5 * jnp.sum(jnp.square(pred - y_t), axis=-1)
  m = _valid_vector(target_mask, per_row.shape[0], per_row.dtype)
  return jnp.sum(per_row * m) / jnp.maximum(jnp.sum(m), 1.0)
