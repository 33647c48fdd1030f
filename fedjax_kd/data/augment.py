"""Standard CIFAR augmentation used by SCARLET's code, applied per sample on device.

SCARLET (Azuma et al., 2025; spec ``scarlet.md`` §2.8) trains with
``RandomCrop(size, padding=4)`` for 32x32 images (``padding=8`` for 64x64),
zero padding, followed by ``RandomHorizontalFlip(0.5)``. This module gives a
pure, jittable JAX version: every sample of a batch gets its own crop offset
and its own flip bit, derived from a single PRNG key.

Padding note: torchvision pads the ``[0, 1]`` tensor before normalisation, so
its zero padding is black, which after a mean-.5/std-.5 normalisation is -1.
Here images are already normalised, so the pad value is the explicit ``fill``
argument of :func:`flip_crop` (default ``0.0``, i.e. zero in the normalised
space); pass the normalised value of black to reproduce torchvision exactly.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array

AUGMENTATIONS = ('none', 'flip_crop')


def _one(key: Array, padded: Array, h: int, w: int, pad: int) -> Array:
  """Random ``h x w`` window of one padded ``[H+2p, W+2p, C]`` image, maybe mirrored."""
  k_dy, k_dx, k_flip = jax.random.split(key, 3)
  dy = jax.random.randint(k_dy, (), 0, 2 * pad + 1)
  dx = jax.random.randint(k_dx, (), 0, 2 * pad + 1)
  flip = jax.random.bernoulli(k_flip, 0.5)
  c = padded.shape[-1]
  crop = jax.lax.dynamic_slice(padded, (dy, dx, 0), (h, w, c))
  return jnp.where(flip, crop[:, ::-1, :], crop)


def flip_crop(key: Array, x: Array, pad: int | None = None,
              fill: float = 0.0) -> Array:
  """RandomCrop(H, padding=pad) + RandomHorizontalFlip(0.5), per sample.

  Pure function of ``(key, x)``: safe under ``jax.jit``, ``jax.vmap`` (e.g.
  over clients) and ``jax.lax.scan`` (over steps). The crop is a
  ``jax.lax.dynamic_slice`` of the padded image under ``vmap``.

  Args:
    key: PRNG key; split into one key per sample.
    x: ``[B, H, W, C]`` batch of (already normalised) images.
    pad: static padding on each side; ``None`` means ``H // 8`` (4 for 32x32,
      8 for 64x64). Offsets ``dy, dx`` are uniform in ``[0, 2 * pad]``.
    fill: constant used for the padded border (see the module docstring).

  Returns:
    ``[B, H, W, C]`` augmented batch, same dtype as ``x``.
  """
  b, h, w, _ = x.shape
  if pad is None:
    pad = h // 8
  pad = int(pad)
  if pad < 0:
    raise ValueError(f'flip_crop: pad must be >= 0, got {pad}')
  padded = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)),
                   constant_values=jnp.asarray(fill, x.dtype))
  keys = jax.random.split(key, b)
  return jax.vmap(lambda k, im: _one(k, im, h, w, pad))(keys, padded)


def get_augment(name: str) -> Callable[..., Array] | None:
  """The augmentation named by ``data.augment``.

  Args:
    name: one of :data:`AUGMENTATIONS`.

  Returns:
    ``None`` for ``'none'``; the module-level :func:`flip_crop` (the same
    object every call, so it is stable as a jit static argument) for
    ``'flip_crop'``.
  """
  if name == 'none':
    return None
  if name == 'flip_crop':
    return flip_crop
  raise ValueError(
      f'data.augment must be one of {AUGMENTATIONS}, got {name!r}')
