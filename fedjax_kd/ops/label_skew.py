"""Local losses for label-distribution skew: FedRS's restricted softmax and FedLC's
logit calibration.

* FedRS: X.-C. Li, D.-C. Zhan, "FedRS: Federated Learning with Restricted Softmax for
  Label Distribution Non-IID Data", KDD 2021. Client k's logit of class c is scaled by
  ``s_{k,c}`` before the softmax: ``s_{k,c} = 1`` for a class it has samples of and
  ``alpha`` for a class it has none of (the paper's restricted softmax); the authors' code
  (FedRepo, ``algorithms/fedrs.py``) scales by ``alpha + (1 - alpha) n_{k,c} / max_c
  n_{k,c}`` instead (:func:`fedrs_scales` ``proportional=True``).
* FedLC: J. Zhang, Z. Li, B. Li, J. Xu, S. Wu, S. Ding, C. Wu, "Federated Learning with
  Label Distribution Skew via Logits Calibration", ICML 2022: the calibrated cross-entropy
  ``-log softmax(f(x) - tau n_k^{-1/4})_y`` with client k's label counts ``n_k``. A class
  with ``n_{k,c} = 0`` has an infinite margin: its term leaves the softmax (the limit of
  the formula, and what the public implementations compute, where ``0 ** -0.25 = inf``).

All losses return per-sample values ``[B]`` (``fedjax_kd.core.kernels.LossFn``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def fedrs_scales(counts, alpha: float, proportional: bool = False) -> np.ndarray:
  """``[K, C]`` float32 logit scales of FedRS's restricted softmax.

  Args:
    counts: ``[K, C]`` non-negative label counts of each client's training data.
    alpha: the scale of a class the client has no sample of, in ``[0, 1]``.
    proportional: ``alpha + (1 - alpha) n_{k,c} / max_c n_{k,c}`` (the authors' code)
      instead of the paper's ``1`` for a present class and ``alpha`` for a missing one.

  Returns:
    The scales; a client with no data at all gets 1 everywhere (it never trains).
  """
  counts = np.asarray(counts, np.float64)
  if proportional:
    top = counts.max(axis=-1, keepdims=True)
    frac = np.divide(counts, top, out=np.ones_like(counts), where=top > 0)
  else:
    frac = (counts > 0).astype(np.float64)
    frac[counts.sum(axis=-1) == 0] = 1.0
  return (alpha + (1.0 - alpha) * frac).astype(np.float32)


@jax.jit
def restricted_cross_entropy(logits: Array, labels: Array, scales: Array) -> Array:
  """FedRS's per-sample loss ``-log softmax(s * logits)_y``.

  Args:
    logits: ``[B, C]``.
    labels: ``[B]`` integer labels.
    scales: ``[C]`` (or ``[B, C]``) the client's per-class logit scales.

  Returns:
    ``[B]``.
  """
  logp = jax.nn.log_softmax(logits * scales, axis=-1)
  return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def fedlc_margins(counts, tau: float) -> tuple[np.ndarray, np.ndarray]:
  """``([K, C] tau n^{-1/4}, [K, C] n > 0)`` float32: FedLC's margins and present classes.

  A class with ``n = 0`` gets margin 0 and ``present = 0``: it is left out of the softmax
  (:func:`calibrated_cross_entropy`), the ``n -> 0`` limit of an infinite margin.
  """
  counts = np.asarray(counts, np.float64)
  present = counts > 0
  margin = tau * np.power(np.where(present, counts, 1.0), -0.25)
  return np.where(present, margin, 0.0).astype(np.float32), present.astype(np.float32)


@jax.jit
def calibrated_cross_entropy(logits: Array, labels: Array, margins: Array,
                             present: Array) -> Array:
  """FedLC's per-sample loss ``logsumexp_{c: n_c > 0}(f_c - m_c) - (f_y - m_y)``.

  Args:
    logits: ``[B, C]``.
    labels: ``[B]`` integer labels (a class the client has samples of).
    margins: ``[C]`` the client's ``tau n_c^{-1/4}`` (0 where ``n_c = 0``).
    present: ``[C]`` 1 where ``n_c > 0``, else 0 (left out of the softmax).

  Returns:
    ``[B]``.
  """
  z = logits - margins
  lse = jax.nn.logsumexp(z, axis=-1, b=jnp.broadcast_to(present, z.shape))
  zy = jnp.take_along_axis(z, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
  return lse - zy
