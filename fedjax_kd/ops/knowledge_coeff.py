"""KT-pFL's knowledge coefficient matrix: personalised soft targets and the update of ``c``.

J. Zhang, S. Guo, X. Ma, H. Wang, W. Xu, F. Wu, "Parameterized Knowledge Transfer for
Personalized Federated Learning", NeurIPS 2021. The server keeps ``c`` ``[N, N]`` (rows on
the probability simplex); client ``n``'s personalised soft target on a public sample ``x`` is
``t_n(x) = sum_m c_nm s_m(x)``, and ``c`` descends

  ``L(c) = lam * sum_n mean_x KL(t_n(x) || s_n(x)) + rho * sum_nm (c_nm - 1/N)^2``

(the clients' distillation loss with their uploaded predictions fixed, plus the pull towards
the uniform matrix), one gradient step of size ``lr`` (plain, or with each row's gradient
scaled to L1 norm 1), after which each row is projected back onto the simplex
(:func:`project_simplex`).

With partial participation everything runs on the block of the participants ``mask``: a
target mixes the participants' predictions only, with the row's weights renormalised over
them; only the block's entries move, and each row's block keeps its mass (its projection is
onto ``{x >= 0, sum x = mass}``), so the full rows still sum to 1. With every client taking
part this is the plain rule above.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def _pair_mask(mask: Array) -> Array:
  m = mask.astype(bool)
  return m[:, None] & m[None, :]


@jax.jit
def personalised_targets(c: Array, s: Array, mask: Array) -> Array:
  """``[S, m, C]``: row n is ``sum_{j in mask} c_nj s_j / sum_{j in mask} c_nj`` (zero for
  clients outside ``mask``).

  Args:
    c: ``[S, S]`` coefficients (rows: receivers, columns: senders).
    s: ``[S, m, C]`` uploaded soft predictions.
    mask: ``[S]`` which clients take part.
  """
  w = jnp.where(_pair_mask(mask), c, 0.0)
  w = w / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-30)
  return jnp.einsum('nj,jmc->nmc', w, s)


def coefficient_loss(c: Array, s: Array, mask: Array, lam: float | Array, rho: float | Array,
                     population: int) -> Array:
  """``lam * sum_{n in mask} mean_x KL(t_n || s_n) + rho * sum_{n, j in mask} (c_nj - 1/N)^2``
  with ``N = population`` (all clients of the experiment).

  Its gradient is the paper's: ``t_n = sum_j c_nj s_j``, each row's block mass held fixed
  (the mass the step keeps). Differentiating through :func:`personalised_targets`'
  renormalisation instead gives the paper's gradient less a constant per row: a plain step
  would not care (the projection onto the simplex removes it), but a normalised step would
  scale the shifted gradient and move ``c`` elsewhere."""
  w = jnp.where(_pair_mask(mask), c, 0.0)
  mass = jax.lax.stop_gradient(jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-30))
  t = jnp.einsum('nj,jmc->nmc', w / mass, s)
  logt = jnp.log(jnp.maximum(t, 1e-30))
  logs = jnp.log(jnp.maximum(s, 1e-30))
  kl = jnp.mean(jnp.sum(jnp.where(t > 0, t * (logt - logs), 0.0), axis=-1), axis=-1)   # [S]
  pair = _pair_mask(mask)
  reg = jnp.sum(jnp.where(pair, (c - 1.0 / population) ** 2, 0.0))
  return lam * jnp.sum(jnp.where(mask.astype(bool), kl, 0.0)) + rho * reg


def project_simplex(v: Array, mask: Array, mass: Array) -> Array:
  """Euclidean projection of each row's ``mask`` entries onto ``{x >= 0, sum x = mass}``
  (entries outside ``mask`` are returned unchanged).

  Args:
    v: ``[S, S]``.
    mask: ``[S, S]`` bool, the entries each row projects.
    mass: ``[S]`` each row's target sum.
  """
  big = jnp.where(mask, v, -jnp.inf)
  u = -jnp.sort(-big, axis=1)                                # descending; masked last
  real = jnp.isfinite(u)
  css = jnp.cumsum(jnp.where(real, u, 0.0), axis=1)
  j = jnp.arange(1, v.shape[1] + 1, dtype=v.dtype)
  ok = real & (u - (css - mass[:, None]) / j > 0)
  rho = jnp.maximum(jnp.sum(ok, axis=1), 1)                  # the support's size
  tau = (jnp.take_along_axis(css, (rho - 1)[:, None], axis=1)[:, 0] - mass) / rho
  return jnp.where(mask, jnp.maximum(v - tau[:, None], 0.0), v)


@functools.partial(jax.jit, static_argnames=('normalize',))
def coefficient_step(c: Array, s: Array, mask: Array, lam: float | Array, rho: float | Array,
                     lr: float | Array, population: int | Array,
                     normalize: bool = False) -> tuple[Array, Array]:
  """One projected gradient step on :func:`coefficient_loss` over the participants' block.

  Each row's gradient is first taken along the row's constraint (its mean over the block
  subtracted): the projection onto the simplex removes that constant anyway, so a plain step
  does not change, but the normalised step would otherwise spend its length on it. The KL
  term's gradient carries about ``lam`` in every entry (the derivative of ``t log t``), with
  differences between entries of a thousandth of that where predictions are soft, so a
  normalised step of the uncentred gradient moved a row by about a thousandth of ``lr``.

  Args:
    normalize: scale each row's centred gradient (over the block) to L1 norm 1 before the
      step, so a row moves by ``lr`` in L1 (before the projection clips an entry at 0; a
      scale-free step; the authors' code rescales its steps to a fixed size too); False: the
      plain step ``lr * grad``.

  Returns:
    ``(new c [S, S], the loss before the step)``.
  """
  pair = _pair_mask(mask)
  value, g = jax.value_and_grad(coefficient_loss)(c, s, mask, lam, rho, population)
  g = jnp.where(pair, g, 0.0)
  size = jnp.maximum(jnp.sum(pair, axis=1, keepdims=True), 1)
  g = jnp.where(pair, g - jnp.sum(g, axis=1, keepdims=True) / size, 0.0)
  if normalize:
    g = g / jnp.maximum(jnp.sum(jnp.abs(g), axis=1, keepdims=True), 1e-30)
  mass = jnp.sum(jnp.where(pair, c, 0.0), axis=1)
  stepped = jnp.where(pair, c - lr * g, c)
  return project_simplex(stepped, pair, mass), value
