"""Per-sample losses for local training and distillation.

* Cross-entropy with integer labels, DS-FL eq. (2) (mean over the batch, A4).
* Cross-entropy with soft targets, DS-FL eq. (10)/(11): ``-sum_c t_c log p_c``.
* KL(teacher || student) with temperature and the Hinton ``T^2`` scaling, used by
  the KD-style papers (FedCache 2.0, ACE-pFL).

All functions return per-sample values ``[B]`` so the engine can apply a
validity mask and average over the real samples of a padded batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def cross_entropy(logits: Array, labels: Array) -> Array:
  """Per-sample CE with integer labels: ``-log softmax(logits)[label]``."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def soft_cross_entropy(logits: Array, targets: Array) -> Array:
  """Per-sample CE with soft targets: ``-sum_c t_c log softmax(logits)_c``."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(targets * logp, axis=-1)


def kl_divergence(logits: Array, targets: Array, temperature: float = 1.0) -> Array:
  """Per-sample ``T^2 * KL(t || softmax(logits / T))`` with targets ``t``.

  ``targets`` are probabilities (already at temperature T where applicable).
  Terms with ``t_c = 0`` contribute 0.
  """
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  t = targets
  tlogt = jax.scipy.special.xlogy(t, t)
  return temperature**2 * jnp.sum(tlogt - t * logp, axis=-1)


def masked_mean(values: Array, mask: Array) -> Array:
  """Mean of ``values`` over entries with ``mask`` true; 0 when none is."""
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)
