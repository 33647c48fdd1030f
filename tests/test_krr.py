"""FedCache 2.0 KRR distillation ops against hand values and float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops import krr


# Jitted entry points (eager op-by-op dispatch is slow); reg stays traced.
_ridge = jax.jit(krr.krr_ridge)
_solve = jax.jit(krr.krr_solve)
_predict = jax.jit(krr.krr_predict)
_loss = jax.jit(krr.krr_loss)
_grad = jax.jit(jax.grad(krr.krr_loss, argnums=2))


def _np_ridge(phi_b, reg):
  """``reg * tr(K) / n`` in float64 (no zero-trace special case)."""
  phi_b = np.asarray(phi_b, np.float64)
  return reg * np.sum(phi_b * phi_b) / phi_b.shape[0]


def _np_predict(phi_t, phi_b, y_b, lam):
  """Float64 KRR predictions with an explicit ridge."""
  phi_t = np.asarray(phi_t, np.float64)
  phi_b = np.asarray(phi_b, np.float64)
  y_b = np.asarray(y_b, np.float64)
  k_bb = phi_b @ phi_b.T
  alpha = np.linalg.solve(k_bb + lam * np.eye(len(phi_b)), y_b)
  return phi_t @ phi_b.T @ alpha, alpha


def _np_loss(pred, y_t):
  return float(np.mean(0.5 * np.sum((pred - np.asarray(y_t)) ** 2, axis=-1)))


def _random_case(seed, n_b=10, d=64, n_t=50, c=10):
  rng = np.random.default_rng(seed)
  phi_b = rng.normal(size=(n_b, d)).astype(np.float32)
  phi_t = rng.normal(size=(n_t, d)).astype(np.float32)
  y_b = np.eye(c, dtype=np.float32)[rng.integers(0, c, n_b)]
  y_t = np.eye(c, dtype=np.float32)[rng.integers(0, c, n_t)]
  return phi_t, y_t, phi_b, y_b


# ----------------------------------------------------------------- hand case


def test_hand_case_exact_values():
  phi_b = jnp.array([[1.0], [2.0]])
  y_b = jnp.eye(2)
  phi_t = jnp.array([[1.0]])
  y_t = jnp.array([[1.0, 0.0]])
  k_bb = phi_b @ phi_b.T  # [[1, 2], [2, 4]]: singular without the ridge.
  # tr = 5, lam = 0.4 * 5 / 2 = 1.
  np.testing.assert_allclose(_ridge(k_bb, reg=0.4), 1.0, rtol=1e-6)
  # (K + I)^{-1} = 1/6 [[5, -2], [-2, 2]].
  np.testing.assert_allclose(
      _solve(k_bb, y_b, reg=0.4),
      np.array([[5.0, -2.0], [-2.0, 2.0]]) / 6.0, rtol=1e-5, atol=1e-6)
  pred = _predict(phi_t, phi_b, y_b, reg=0.4)
  np.testing.assert_allclose(pred, [[1.0 / 6.0, 2.0 / 6.0]], rtol=1e-5)
  loss = _loss(phi_t, y_t, phi_b, y_b, reg=0.4)
  assert loss.shape == ()
  np.testing.assert_allclose(loss, 29.0 / 72.0, rtol=1e-5)


def test_ridge_default_and_masked_trace():
  k_bb = jnp.diag(jnp.array([1.0, 2.0, 3.0, 100.0]))
  np.testing.assert_allclose(_ridge(k_bb), 1e-6 * 106.0 / 4.0, rtol=1e-5)
  valid = jnp.array([True, True, True, False])
  np.testing.assert_allclose(_ridge(k_bb, valid), 1e-6 * 6.0 / 3.0,
                             rtol=1e-5)
  np.testing.assert_allclose(
      _ridge(k_bb, valid.astype(jnp.float32)), 1e-6 * 2.0, rtol=1e-5)
  # Zero trace (all-zero features or nothing valid) -> ridge 1.
  assert float(_ridge(jnp.zeros((3, 3)))) == 1.0
  assert float(_ridge(k_bb, jnp.zeros(4))) == 1.0


# ------------------------------------------------------- random vs numpy f64


@pytest.mark.parametrize('reg', [1e-6, 1e-2])
def test_random_case_matches_numpy(reg):
  phi_t, y_t, phi_b, y_b = _random_case(0)
  lam = _np_ridge(phi_b, reg)
  want_pred, want_alpha = _np_predict(phi_t, phi_b, y_b, lam)
  k_bb = jnp.asarray(phi_b) @ jnp.asarray(phi_b).T
  np.testing.assert_allclose(_ridge(k_bb, reg=reg), lam, rtol=1e-4)
  alpha = _solve(k_bb, y_b, reg=reg)
  assert alpha.dtype == jnp.float32
  np.testing.assert_allclose(alpha, want_alpha, rtol=1e-4, atol=1e-6)
  pred = _predict(phi_t, phi_b, y_b, reg=reg)
  assert pred.shape == (50, 10)
  np.testing.assert_allclose(pred, want_pred, rtol=1e-4, atol=1e-5)
  loss = _loss(phi_t, y_t, phi_b, y_b, reg=reg)
  np.testing.assert_allclose(loss, _np_loss(want_pred, y_t), rtol=1e-4)


def test_support_interpolation_with_tiny_ridge():
  # Predicting the support set itself with n_b < d reproduces Y_b.
  _, _, phi_b, y_b = _random_case(1)
  pred = _predict(phi_b, phi_b, y_b)
  np.testing.assert_allclose(pred, y_b, atol=1e-3)
  assert float(_loss(phi_b, y_b, phi_b, y_b)) < 1e-5


# ------------------------------------------------------------------- masking


def test_valid_mask_equals_reduced_arrays():
  phi_t, y_t, phi_b, y_b = _random_case(2, n_b=12)
  valid = np.ones(12, bool)
  valid[[3, 7, 11]] = False
  # Garbage in padded rows must not matter.
  phi_pad = phi_b.copy()
  phi_pad[~valid] = 1e3
  y_pad = y_b.copy()
  y_pad[~valid] = 5.0
  k_pad = jnp.asarray(phi_pad) @ jnp.asarray(phi_pad).T
  alpha = np.asarray(_solve(k_pad, y_pad, valid))
  k_red = jnp.asarray(phi_b[valid]) @ jnp.asarray(phi_b[valid]).T
  alpha_red = _solve(k_red, y_b[valid])
  np.testing.assert_array_equal(alpha[~valid], 0.0)
  np.testing.assert_allclose(alpha[valid], alpha_red, rtol=1e-4, atol=1e-6)
  pred_red = _predict(phi_t, phi_b[valid], y_b[valid])
  np.testing.assert_allclose(_predict(phi_t, phi_pad, y_pad, valid), pred_red,
                             rtol=1e-4, atol=1e-5)
  loss_red = _loss(phi_t, y_t, phi_b[valid], y_b[valid])
  for mask in (valid, valid.astype(np.float32)):  # bool or {0, 1} float mask
    np.testing.assert_allclose(_loss(phi_t, y_t, phi_pad, y_pad, mask),
                               loss_red, rtol=1e-5)
  # Against float64 numpy on the reduced problem.
  want, _ = _np_predict(phi_t, phi_b[valid], y_b[valid],
                        _np_ridge(phi_b[valid], 1e-6))
  np.testing.assert_allclose(_predict(phi_t, phi_pad, y_pad, valid),
                             want, rtol=1e-4, atol=1e-5)


def test_target_mask_equals_dropping_rows():
  phi_t, y_t, phi_b, y_b = _random_case(3)
  tmask = np.zeros(50, bool)
  tmask[::3] = True
  y_garbage = y_t.copy()
  y_garbage[~tmask] = 100.0
  got = _loss(phi_t, y_garbage, phi_b, y_b, target_mask=tmask)
  want = _loss(phi_t[tmask], y_t[tmask], phi_b, y_b)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  got_f = _loss(phi_t, y_garbage, phi_b, y_b,
                       target_mask=tmask.astype(np.float32))
  np.testing.assert_allclose(got_f, want, rtol=1e-6)
  # No valid target: 0 (max(count, 1) denominator), not NaN.
  assert float(_loss(phi_t, y_t, phi_b, y_b,
                            target_mask=np.zeros(50, bool))) == 0.0


# ------------------------------------------------------- singular kernels


def test_duplicate_prototypes_finite_and_match_numpy():
  phi_t, y_t, phi_b, y_b = _random_case(4, n_b=6, c=4)
  phi_b[1] = phi_b[0]
  y_b[1] = y_b[0]  # Same class: the prediction is well determined.
  lam = _np_ridge(phi_b, 1e-6)
  want, _ = _np_predict(phi_t, phi_b, y_b, lam)
  k_bb = jnp.asarray(phi_b) @ jnp.asarray(phi_b).T
  assert np.all(np.isfinite(_solve(k_bb, y_b)))
  pred = _predict(phi_t, phi_b, y_b)
  np.testing.assert_allclose(pred, want, rtol=1e-3, atol=1e-4)
  assert np.isfinite(float(_loss(phi_t, y_t, phi_b, y_b)))
  # Different labels on the duplicates: K + lam I has condition ~1e6, so the
  # float32 split between them is only roughly determined, but it stays
  # finite and close to float64.
  y_b2 = y_b.copy()
  y_b2[1] = np.roll(y_b[0], 1)
  want2, _ = _np_predict(phi_t, phi_b, y_b2, lam)
  pred2 = np.asarray(_predict(phi_t, phi_b, y_b2))
  assert np.all(np.isfinite(pred2))
  np.testing.assert_allclose(pred2, want2, atol=5e-2)
  np.testing.assert_allclose(_loss(phi_t, y_t, phi_b, y_b2),
                             _np_loss(want2, y_t), rtol=1e-2)
  assert np.all(np.isfinite(_grad(phi_t, y_t, phi_b, y_b2)))


def test_rank_deficient_tiny_reg_uses_fallback():
  rng = np.random.default_rng(5)
  phi_b = rng.normal(size=(20, 3)).astype(np.float32)  # rank 3, n_b = 20
  phi_t = rng.normal(size=(30, 3)).astype(np.float32)
  y_b = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 20)]
  y_t = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 30)]
  reg = 1e-10
  k_bb = jnp.asarray(phi_b) @ jnp.asarray(phi_b).T
  lam = _ridge(k_bb, reg=reg)
  # The plain float32 factor fails here, so the fallback must kick in.
  assert not np.all(np.isfinite(np.asarray(
      jnp.linalg.cholesky(k_bb + lam * jnp.eye(20)))))
  alpha = _solve(k_bb, y_b, reg=reg)
  assert np.all(np.isfinite(alpha))
  lam_fb = _np_ridge(phi_b, reg) + 1e-3 * _np_ridge(phi_b, 1.0)
  want, _ = _np_predict(phi_t, phi_b, y_b, lam_fb)
  pred = _predict(phi_t, phi_b, y_b, reg=reg)
  np.testing.assert_allclose(pred, want, rtol=1e-3, atol=1e-3)
  assert np.isfinite(float(_loss(phi_t, y_t, phi_b, y_b, reg=reg)))
  assert np.all(np.isfinite(_grad(phi_t, y_t, phi_b, y_b, reg=reg)))


def test_all_zero_features():
  phi_t, y_t, _, y_b = _random_case(6, n_b=5, d=8, n_t=7, c=3)
  phi_b = np.zeros((5, 8), np.float32)
  want = 0.5 * np.mean(np.sum(y_t**2, -1))
  np.testing.assert_allclose(_loss(phi_t, y_t, phi_b, y_b), want, rtol=1e-6)
  np.testing.assert_array_equal(_predict(phi_t, phi_b, y_b), 0.0)
  g = _grad(phi_t, y_t, phi_b, y_b)
  assert np.all(np.isfinite(g))
  # At Phi_b = 0 the ridge is 1, alpha = Y_b: dL/dPhi_b = alpha r^T Phi_t / n
  # with residual r = -Y_t.
  want_g = (np.asarray(y_b) @ (-np.asarray(y_t)).T @ phi_t) / len(phi_t)
  np.testing.assert_allclose(g, want_g, rtol=1e-4, atol=1e-6)
  # Zero target features too: loss unchanged, gradient zero.
  g0 = _grad(0 * phi_t, y_t, phi_b, y_b)
  np.testing.assert_array_equal(g0, 0.0)


# ----------------------------------------------------------------- gradients


def test_gradient_matches_finite_differences_x64():
  rng = np.random.default_rng(7)
  phi_b = rng.normal(size=(4, 6))
  phi_t = rng.normal(size=(9, 6))
  y_b = np.eye(3)[[0, 1, 2, 1]]
  y_t = np.eye(3)[rng.integers(0, 3, 9)]
  valid = np.array([1.0, 1.0, 1.0, 0.0])
  with jax.enable_x64(True):
    loss_fn = jax.jit(lambda p: krr.krr_loss(
        jnp.asarray(phi_t), jnp.asarray(y_t), p, jnp.asarray(y_b),
        jnp.asarray(valid), reg=1e-3))
    p0 = jnp.asarray(phi_b)
    assert loss_fn(p0).dtype == jnp.float64
    g = np.asarray(jax.jit(jax.grad(loss_fn))(p0))
    eps = 1e-6
    fd = np.zeros_like(phi_b)
    for idx in np.ndindex(phi_b.shape):
      e = np.zeros_like(phi_b)
      e[idx] = eps
      fd[idx] = (float(loss_fn(p0 + e)) - float(loss_fn(p0 - e))) / (2 * eps)
  np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-8)
  np.testing.assert_array_equal(g[3], 0.0)  # Masked prototype: no gradient.
  assert np.abs(g[:3]).max() > 1e-3


def test_gradient_float32_finite_differences_loose():
  phi_t, y_t, phi_b, y_b = _random_case(8, n_b=5, d=12, n_t=20, c=4)
  loss_fn = lambda p: _loss(phi_t, y_t, p, y_b, reg=1e-2)
  g = np.asarray(_grad(phi_t, y_t, phi_b, y_b, reg=1e-2))
  rng = np.random.default_rng(9)
  for _ in range(3):
    direction = rng.normal(size=phi_b.shape).astype(np.float32)
    eps = 1e-2
    fd = (float(loss_fn(phi_b + eps * direction)) -
          float(loss_fn(phi_b - eps * direction))) / (2 * eps)
    np.testing.assert_allclose(np.sum(g * direction), fd, rtol=2e-2,
                               atol=1e-4)


# ---------------------------------------------------------------- jit / vmap


def test_jit_and_vmap_over_clients():
  n_clients = 3
  cases = [_random_case(10 + k, n_b=8, d=16, n_t=12, c=5)
           for k in range(n_clients)]
  phi_t, y_t, phi_b, y_b = (np.stack(a) for a in zip(*cases))
  valid = np.ones((n_clients, 8), bool)
  valid[1, 5:] = False
  valid[2, 0] = False
  phi_b[1, 6] = phi_b[1, 7] = 0.0
  phi_b[2, 2] = phi_b[2, 3]  # A duplicate prototype in one client.
  tmask = np.ones((n_clients, 12), bool)
  tmask[0, 7:] = False

  batched = jax.jit(jax.vmap(krr.krr_loss, in_axes=(0, 0, 0, 0, 0, 0)))
  got = batched(phi_t, y_t, phi_b, y_b, valid, tmask)
  assert got.shape == (n_clients,)
  for k in range(n_clients):
    want = _loss(phi_t[k], y_t[k], phi_b[k], y_b[k], valid[k], tmask[k])
    np.testing.assert_allclose(got[k], want, rtol=1e-5)
  v, t = valid[1], tmask[0]
  np.testing.assert_allclose(
      got[1], _loss(phi_t[1], y_t[1], phi_b[1][v], y_b[1][v]), rtol=1e-4)
  np.testing.assert_allclose(
      got[0], _loss(phi_t[0][t], y_t[0][t], phi_b[0], y_b[0]), rtol=1e-5)

  preds = jax.jit(jax.vmap(krr.krr_predict))(phi_t, phi_b, y_b, valid)
  assert preds.shape == (n_clients, 12, 5)
  grads = jax.jit(jax.vmap(jax.grad(krr.krr_loss, argnums=2)))(
      phi_t, y_t, phi_b, y_b, valid, tmask)
  assert grads.shape == phi_b.shape
  assert np.all(np.isfinite(grads))
  np.testing.assert_array_equal(np.asarray(grads)[~valid], 0.0)

  # Vmapped solve over a batch of kernels; reg passed positionally (traced).
  k_bb = jnp.einsum('kbd,ked->kbe', phi_b, phi_b)
  alphas = jax.jit(jax.vmap(krr.krr_solve))(k_bb, y_b, valid)
  np.testing.assert_array_equal(np.asarray(alphas)[~valid], 0.0)
  np.testing.assert_allclose(_solve(k_bb[2], y_b[2], valid[2], 1e-6),
                             alphas[2], rtol=1e-5, atol=1e-6)
