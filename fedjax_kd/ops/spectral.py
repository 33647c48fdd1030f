"""Fourier spectra of model weights and the spectral distillation distance (SCDPFL).

Z. Chen, H. H. Yang, T. Q. S. Quek, K. F. E. Chong, "Spectral Co-Distillation for
Personalized Federated Learning", NeurIPS 2023, distil one model into another through the
Fourier spectrum of their weights. The spectrum of a model, as the authors' public code
builds it (``util/update.py`` of github.com/jimmyc96/spectral-dis-FL; written here from that
description, not copied):

* every *weight* tensor (a layer's ``weight`` in PyTorch: the kernels of dense and
  convolution layers, the scales of normalisation layers, embeddings; never biases) in the
  model's parameter order;
* a kernel in PyTorch's layout ``[out, in, kh, kw]`` (Flax stores ``[kh, kw, in, out]``),
  reshaped to the matrix ``[out, in * kh * kw]``; its 2-D DFT; a 1-D weight's 1-D DFT;
* the magnitudes ``|F|``, flattened row-major, concatenated, divided by their sum: a
  probability vector over the spectral entries.

The *truncated* spectrum keeps the first ``floor(ratio * size)`` entries (at least one) of each
weight's flattened spectrum: the lowest output-axis frequencies of every layer (the authors'
code truncates the concatenation of all layers instead, which keeps whole early layers and
depends on the parameter order; we truncate per layer and say so in the algorithm). The
truncated vector is renormalised to sum 1.

The distance is ``KL(q || p) = sum_i q_i log(q_i / p_i)`` with the teacher's spectrum ``q``
(held fixed) and the student's ``p``: a divergence >= 0, zero iff the spectra are
proportional. Magnitudes are ``sqrt(re^2 + im^2 + 1e-20)`` so the gradient is finite at a
zero coefficient.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

Array = jax.Array

# Parameter names of weight tensors (PyTorch's ``layer.weight``); biases are left out.
WEIGHT_NAMES = ('kernel', 'scale', 'embedding')
_EPS = 1e-20


def _leaf_name(path) -> str | None:
  last = path[-1]
  return getattr(last, 'key', getattr(last, 'name', None))


def weight_leaves(params: Any) -> list[Array]:
  """The weight tensors of a parameter tree (names in :data:`WEIGHT_NAMES`), in tree order."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  return [leaf for path, leaf in leaves if _leaf_name(path) in WEIGHT_NAMES]


def as_matrix(w: Array, name: str = 'kernel') -> Array:
  """A weight as the authors' code sees it: a kernel in PyTorch's layout ``[out, in, ...]``
  reshaped to ``[out, -1]``; 1-D weights and non-kernel matrices unchanged."""
  if w.ndim == 1 or (name != 'kernel' and w.ndim == 2):
    return w
  if name == 'kernel':   # Flax [..., in, out] -> PyTorch [out, in, ...]
    w = jnp.transpose(w, (w.ndim - 1, w.ndim - 2) + tuple(range(w.ndim - 2)))
  return w.reshape(w.shape[0], -1)


def keep_count(size: int, ratio: float) -> int:
  """``floor(ratio * size)``, at least 1 (a tolerance keeps ``0.3 * 10`` at 3)."""
  return max(1, int(ratio * size + 1e-9))


def leaf_spectrum(w: Array, ratio: float = 1.0, name: str = 'kernel') -> Array:
  """``|DFT|`` of one weight (2-D DFT of its matrix, 1-D DFT of a vector), flattened
  row-major, its first :func:`keep_count` entries."""
  m = as_matrix(w.astype(jnp.float32), name)
  f = jnp.fft.fft2(m) if m.ndim == 2 else jnp.fft.fft(m)
  mag = jnp.sqrt(jnp.square(f.real) + jnp.square(f.imag) + _EPS).reshape(-1)
  return mag[:keep_count(mag.shape[0], ratio)]


def weight_spectrum(params: Any, ratio: float = 1.0) -> Array:
  """The concatenated (per-weight truncated) magnitude spectrum of a model ``[M]``."""
  leaves, _ = jax.tree_util.tree_flatten_with_path(params)
  parts = [leaf_spectrum(leaf, ratio, _leaf_name(path)) for path, leaf in leaves
           if _leaf_name(path) in WEIGHT_NAMES]
  if not parts:
    raise ValueError('weight_spectrum: the parameter tree has no weight tensors '
                     f'(leaves named {WEIGHT_NAMES})')
  return jnp.concatenate(parts)


@functools.partial(jax.jit, static_argnames=('ratio',))
def spectral_distribution(params: Any, ratio: float = 1.0) -> Array:
  """:func:`weight_spectrum` divided by its sum: a probability vector ``[M]``."""
  s = weight_spectrum(params, ratio)
  return s / jnp.sum(s)


def spectral_kl(q: Array, params: Any, ratio: float = 1.0) -> Array:
  """``KL(q || p)``: ``q`` the teacher's distribution (no gradient), ``p`` the spectral
  distribution of ``params`` at the same ``ratio``."""
  q = jax.lax.stop_gradient(q)
  p = spectral_distribution(params, ratio)
  return jnp.sum(xlogy(q, q) - q * jnp.log(p))


@functools.partial(jax.jit, static_argnames=('ratio',))
def spectral_distance(student: Any, teacher: Any, ratio: float = 1.0) -> Array:
  """``KL(spectrum(teacher) || spectrum(student))`` at ``ratio`` (SCDPFL's distillation)."""
  return spectral_kl(spectral_distribution(teacher, ratio), student, ratio)


@functools.partial(jax.jit, static_argnames=('ratio',))
def stacked_distributions(params: Any, ratio: float = 1.0) -> Array:
  """:func:`spectral_distribution` of every row of a stacked parameter tree ``[S, M]``."""
  return jax.vmap(lambda p: spectral_distribution(p, ratio))(params)
