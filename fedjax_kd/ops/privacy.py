"""Noise mechanisms for label-count vectors and top-K soft predictions.

ACE-pFL (K. He, H. Bai, Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation", IEEE/ACM
Transactions on Networking 2025) mentions differential privacy only
qualitatively (§III-E): no mechanism, epsilon, delta or noise scale is given.
So both mechanisms here are our choice, optional and off by default: a formal one
for the label histogram, and plain noise injection for the soft predictions:

  * :func:`laplace_counts` (host-side numpy): the Laplace mechanism on
    label-count vectors, ``c~_c = max(c_c + Lap(0, 1 / epsilon), 0)``. One
    sample added or removed changes one count by 1 (L1 sensitivity 1), so the
    noisy vector is epsilon-DP; clipping and the later normalisation are
    post-processing.
  * :func:`noisy_topk_probs` (JAX, jit-friendly): Gaussian or Laplace noise of
    a given scale added to the kept (top-K) entries of each soft-prediction
    row, clipped to ``[0, 1]`` and renormalised over the kept entries. This is
    **noise injection, no formal epsilon accounting** -- the paper provides
    none, and a real guarantee for soft predictions would need DP training or
    a PATE-style analysis.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MECHANISMS = ('gaussian', 'laplace')


def laplace_counts(rng: np.random.Generator, counts,
                   epsilon: float) -> np.ndarray:
  """Label counts plus ``Laplace(0, 1 / epsilon)`` noise, clipped at 0.

  Args:
    rng: the numpy generator that draws the noise (one draw per entry).
    counts: label-count vector(s) of any shape, e.g. ``[C]`` or ``[K, C]``.
    epsilon: the privacy budget, a finite number > 0.

  Returns:
    The noisy counts, float64, of the shape of ``counts``. A row may become all
    zero (tiny ``epsilon``); callers that normalise must handle that.

  Raises:
    ValueError: ``epsilon`` is not a finite number > 0 or ``counts`` is not
      finite.
  """
  if (not isinstance(epsilon, numbers.Real) or isinstance(epsilon, bool)
      or not math.isfinite(epsilon) or epsilon <= 0):
    raise ValueError(f'epsilon={epsilon!r} must be a finite number > 0')
  counts = np.asarray(counts, dtype=np.float64)
  if not np.all(np.isfinite(counts)):
    raise ValueError('counts must be finite')
  noise = rng.laplace(0.0, 1.0 / epsilon, size=counts.shape)
  return np.maximum(counts + noise, 0.0)


def noisy_topk_probs(key: Array, probs: Array, kept: Array, mechanism: str,
                     scale, renormalize: bool = True) -> Array:
  """Adds noise to the kept entries of top-K soft predictions (no accounting).

  Each kept entry gets independent ``N(0, scale^2)`` (``'gaussian'``) or
  ``Laplace(0, scale)`` (``'laplace'``) noise; the result is clipped to
  ``[0, 1]``, entries not kept are 0, and each row is renormalised over its
  kept entries. A row whose kept mass becomes 0 falls back to uniform over its
  kept entries (a row with nothing kept stays all zero). With ``scale = 0``
  this returns ``probs`` renormalised over the kept entries, i.e. the input
  itself for properly filtered rows.

  Jit-friendly: ``mechanism`` must be static (a Python string), ``scale`` may
  be traced; call it inside ``jax.jit`` / ``vmap``.

  Args:
    key: PRNG key.
    probs: ``[..., C]`` probabilities (top-K filtered rows).
    kept: ``[..., C]`` bool, which entries were kept by top-K.
    mechanism: ``'gaussian'`` or ``'laplace'``.
    scale: the noise standard deviation (Gaussian) or Laplace scale ``b``,
      >= 0.
    renormalize: rescale each row over its kept entries (static). ``False``
      returns the clipped noisy kept values as they are (e.g. for a receiver
      that completes the row itself, :func:`fedjax_kd.ops.aggregate.complete_top_k`).

  Returns:
    ``[..., C]`` noisy probabilities in the dtype of ``probs``.
  """
  if mechanism not in MECHANISMS:
    raise ValueError(f'mechanism={mechanism!r} must be one of {MECHANISMS}')
  if isinstance(scale, numbers.Real) and not scale >= 0:
    raise ValueError(f'scale={scale!r} must be >= 0')
  probs = jnp.asarray(probs)
  dtype = probs.dtype if jnp.issubdtype(probs.dtype, jnp.floating) \
      else jnp.float32
  probs = probs.astype(dtype)
  kept = jnp.asarray(kept, dtype=bool)
  if mechanism == 'gaussian':
    unit = jax.random.normal(key, probs.shape, dtype)
  else:
    unit = jax.random.laplace(key, probs.shape, dtype)
  noisy = jnp.clip(probs + jnp.asarray(scale, dtype) * unit, 0.0, 1.0)
  noisy = jnp.where(kept, noisy, 0.0)
  if not renormalize:
    return noisy
  mass = jnp.sum(noisy, axis=-1, keepdims=True)
  num_kept = jnp.sum(kept, axis=-1, keepdims=True).astype(dtype)
  uniform = kept.astype(dtype) / jnp.maximum(num_kept, 1.0)
  return jnp.where(mass > 0, noisy / jnp.where(mass > 0, mass, 1.0), uniform)
