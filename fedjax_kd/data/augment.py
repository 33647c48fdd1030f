"""Standard CIFAR augmentation used by SCARLET's code, applied per sample on device.

SCARLET's code (Azuma et al., 2025) trains with
``RandomCrop(size, padding=4)`` for 32x32 images (``padding=8`` for 64x64),
zero padding, followed by ``RandomHorizontalFlip(0.5)``. This module gives a
pure, jittable JAX version: every sample of a batch gets its own crop offset
and its own flip bit, derived from a single PRNG key.

Padding note: torchvision pads the ``[0, 1]`` tensor before normalisation, so
its zero padding is black, which after a mean-.5/std-.5 normalisation is -1.
Here images are already normalised, so the pad value is the explicit ``fill``
argument of :func:`flip_crop` (default ``0.0``, i.e. zero in the normalised
space); pass the normalised value of black to reproduce torchvision exactly.

FedEntOpt (arXiv 2411.01240 v2, §V) trains with color jitter (strengths not
given; ours are ``ColorJitter(0.2, 0.2, 0.2, 0.05)``), ``RandomHorizontalFlip(0.5)``
and ``RandomGrayscale(0.1)`` on ``[0, 1]`` images: :func:`jitter_flip_gray`
(``data.augment = 'jitter_flip_gray'``). This library does not standardize
images, so the inputs are the ``[0, 1]`` images themselves.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array

AUGMENTATIONS = ('none', 'flip_crop', 'jitter_flip_gray')

# ITU-R 601-2 luma, as PIL's convert('L') (torchvision's rgb_to_grayscale: 0.2989).
_LUMA = (0.299, 0.587, 0.114)


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


def _gray(x: Array) -> Array:
  """``[..., 3]`` RGB -> ``[...]`` luma."""
  return x[..., 0] * _LUMA[0] + x[..., 1] * _LUMA[1] + x[..., 2] * _LUMA[2]


def _rgb_to_hsv(x: Array) -> Array:
  """``[..., 3]`` RGB in ``[0, 1]`` -> HSV in ``[0, 1]`` (torchvision's ``_rgb2hsv``)."""
  r, g, b = x[..., 0], x[..., 1], x[..., 2]
  maxc = jnp.max(x, axis=-1)
  minc = jnp.min(x, axis=-1)
  cr = maxc - minc
  s = cr / jnp.where(maxc == 0, 1.0, maxc)
  crd = jnp.where(cr == 0, 1.0, cr)
  rc, gc, bc = (maxc - r) / crd, (maxc - g) / crd, (maxc - b) / crd
  is_r = maxc == r
  is_g = (maxc == g) & ~is_r
  hue = jnp.where(is_r, bc - gc, jnp.where(is_g, 2.0 + rc - bc, 4.0 + gc - rc))
  hue = jnp.where(cr == 0, 0.0, hue)
  hue = jnp.mod(hue / 6.0 + 1.0, 1.0)
  return jnp.stack([hue, s, maxc], axis=-1)


def _hsv_to_rgb(x: Array) -> Array:
  """``[..., 3]`` HSV in ``[0, 1]`` -> RGB (torchvision's ``_hsv2rgb``)."""
  h, s, v = x[..., 0], x[..., 1], x[..., 2]
  i = jnp.floor(h * 6.0)
  f = h * 6.0 - i
  i = jnp.mod(i.astype(jnp.int32), 6)
  p = jnp.clip(v * (1.0 - s), 0.0, 1.0)
  q = jnp.clip(v * (1.0 - s * f), 0.0, 1.0)
  t = jnp.clip(v * (1.0 - s * (1.0 - f)), 0.0, 1.0)
  r = jnp.choose(i, [v, q, p, p, t, v], mode='clip')
  g = jnp.choose(i, [t, v, v, q, p, p], mode='clip')
  b = jnp.choose(i, [p, p, t, v, v, q], mode='clip')
  return jnp.stack([r, g, b], axis=-1)


def _jitter_flip_gray_one(img: Array, brightness: Array, contrast: Array,
                          saturation: Array, hue: Array, flip: Array,
                          gray: Array) -> Array:
  """ColorJitter with given factors, then flip and grayscale, of one image.

  Args:
    img: ``[H, W, C]`` image in ``[0, 1]``.
    brightness, contrast, saturation: blend factors (1 = identity).
    hue: hue shift in turns (0 = identity).
    flip: mirror horizontally if True.
    gray: replace by the luma, replicated to the 3 channels, if True.

  Returns:
    ``[H, W, C]`` float image in ``[0, 1]``. Saturation, hue and grayscale
    apply to 3-channel images only.
  """
  x = img.astype(jnp.float32)
  rgb = x.shape[-1] == 3
  x = jnp.clip(x * brightness, 0.0, 1.0)
  mean = jnp.mean(_gray(x)) if rgb else jnp.mean(x)
  x = jnp.clip(contrast * x + (1.0 - contrast) * mean, 0.0, 1.0)
  if rgb:
    x = jnp.clip(saturation * x + (1.0 - saturation) * _gray(x)[..., None],
                 0.0, 1.0)
    hsv = _rgb_to_hsv(x)
    hsv = hsv.at[..., 0].set(jnp.mod(hsv[..., 0] + hue, 1.0))
    x = jnp.clip(_hsv_to_rgb(hsv), 0.0, 1.0)
  x = jnp.where(flip, x[:, ::-1, :], x)
  if rgb:
    x = jnp.where(gray, jnp.repeat(_gray(x)[..., None], 3, axis=-1), x)
  return x.astype(img.dtype)


def jitter_flip_gray(key: Array, x: Array) -> Array:
  """ColorJitter(0.2, 0.2, 0.2, 0.05) + RandomHorizontalFlip(0.5) +
  RandomGrayscale(0.1), per sample (FedEntOpt's augmentation; the jitter strengths are ours).

  torchvision semantics on ``[0, 1]`` images, each op clipped to ``[0, 1]``:
  brightness multiplies by ``b ~ U[0.8, 1.2]``; contrast blends with the mean
  luma of the image by ``c ~ U[0.8, 1.2]``; saturation blends with the luma
  image by ``s ~ U[0.8, 1.2]``; hue adds ``h ~ U[-0.05, 0.05]`` turns to the
  HSV hue. torchvision applies the four jitters in a random order; here the
  order is fixed (brightness, contrast, saturation, hue). Then a horizontal
  flip with probability 0.5, then with probability 0.1 the image is replaced
  by its luma ``0.299 R + 0.587 G + 0.114 B`` on all three channels.

  Images with a channel count other than 3 (e.g. grayscale digits) get only
  brightness, contrast (blend with the mean of all values) and the flip.

  Pure function of ``(key, x)``: safe under ``jax.jit``, ``jax.vmap`` and
  ``jax.lax.scan``.

  Args:
    key: PRNG key; split into one key per sample.
    x: ``[B, H, W, C]`` float batch in ``[0, 1]``.

  Returns:
    ``[B, H, W, C]`` augmented batch in ``[0, 1]``, same dtype as ``x``.
  """
  b = x.shape[0]

  def one(k: Array, img: Array) -> Array:
    k_bcs, k_hue, k_flip, k_gray = jax.random.split(k, 4)
    bcs = jax.random.uniform(k_bcs, (3,), minval=0.8, maxval=1.2)
    hue = jax.random.uniform(k_hue, (), minval=-0.05, maxval=0.05)
    flip = jax.random.bernoulli(k_flip, 0.5)
    gray = jax.random.bernoulli(k_gray, 0.1)
    return _jitter_flip_gray_one(img, bcs[0], bcs[1], bcs[2], hue, flip, gray)

  return jax.vmap(one)(jax.random.split(key, b), x)


def get_augment(name: str, stats: tuple[Any, Any] | None = None
                ) -> Callable[..., Array] | None:
  """The augmentation named by ``data.augment``.

  The augmentations work on [0, 1] pixels (zero padding is black, ColorJitter
  clips to [0, 1]), as torchvision's do before ``Normalize``. For normalised
  inputs (``data.normalize``) the returned function undoes the normalisation,
  augments and normalises again, so the result is what torchvision's
  ``[augment, ToTensor, Normalize]`` pipeline gives.

  Args:
    name: one of :data:`AUGMENTATIONS`.
    stats: the per-channel ``(mean, std)`` the inputs were normalised with
      (:func:`fedjax_kd.data.sources.input_stats`); None for [0, 1] inputs.

  Returns:
    ``None`` for ``'none'``. Without ``stats``: the module-level
    :func:`flip_crop` or :func:`jitter_flip_gray` (the same object every call,
    so it is stable as a jit static argument); with ``stats``, a new wrapper
    (build it once per run).
  """
  if name == 'none':
    return None
  if name == 'flip_crop':
    fn = flip_crop
  elif name == 'jitter_flip_gray':
    fn = jitter_flip_gray
  else:
    raise ValueError(f'data.augment must be one of {AUGMENTATIONS}, got {name!r}')
  if stats is None:
    return fn
  mean = tuple(float(m) for m in stats[0])
  std = tuple(float(s) for s in stats[1])

  def normalized(key: Array, x: Array) -> Array:
    m = jnp.asarray(mean, x.dtype)
    s = jnp.asarray(std, x.dtype)
    return ((fn(key, x * s + m) - m) / s).astype(x.dtype)

  return normalized
