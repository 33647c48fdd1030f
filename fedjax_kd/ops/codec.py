"""How FedCache 2.0's distilled samples travel: quantization and image codecs.

Q. Pan, S. Sun, Z. Wu, Y. Wang, M. Liu, B. Gao, J. Wang, "FedCache 2.0:
Federated Edge Learning with Knowledge Caching and Dataset Distillation",
arXiv 2405.13378.

Spec notes on the byte counts:
  * the paper counts the JPEG bytes of 32x32x3 uint8 images;
  * the authors' code saves each prototype as a PNG file (PIL,
    ``optimize=True``) and counts the file sizes;
  * raw uint8 images are ``H * W * C`` bytes;
  * tabular data is sent as float32 (``4 * D`` bytes) without quantization.

:func:`quantize` / :func:`dequantize` are jittable (device side); the codecs
(:func:`encoded_sizes`, :func:`jpeg_roundtrip`) run on the host with PIL over
in-memory ``io.BytesIO`` buffers.
"""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

Array = jax.Array

FORMATS = ('png', 'jpeg', 'raw')
CHANNELS = (1, 3)


def value_range(x: np.ndarray | Array) -> tuple[float, float]:
  """The range used to quantize ``x``.

  Args:
    x: the data (any shape, numpy or jax).

  Returns:
    ``(0.0, 1.0)`` if all values lie in ``[0, 1]`` (our image sources), else
    ``(min, max)``; ``hi > lo`` is guaranteed (a constant array gets
    ``hi = lo + 1``).
  """
  if x.size == 0:
    return 0.0, 1.0
  lo, hi = float(jnp.nanmin(x)), float(jnp.nanmax(x))   # on device for a jax array
  if lo >= 0.0 and hi <= 1.0:
    return 0.0, 1.0
  if not hi > lo:
    hi = lo + 1.0
  return lo, hi


def is_image_shape(shape: tuple[int, ...]) -> bool:
  """Whether a per-sample shape is an image ``(H, W, C)`` with ``C in {1, 3}``."""
  return len(shape) == 3 and shape[-1] in CHANNELS


def quantize(x: Array, lo: float, hi: float) -> Array:
  """``uint8 round((clip(x, lo, hi) - lo) / (hi - lo) * 255)``.

  Args:
    x: float data.
    lo: low end of the range.
    hi: high end (``> lo``).

  Returns:
    ``uint8`` array of ``x``'s shape.
  """
  x = jnp.clip(jnp.asarray(x, jnp.float32), lo, hi)
  return jnp.round((x - lo) / (hi - lo) * 255.0).astype(jnp.uint8)


def dequantize(q: Array, lo: float, hi: float) -> Array:
  """Inverse of :func:`quantize`: ``float32 q / 255 * (hi - lo) + lo``."""
  return (jnp.asarray(q, jnp.float32) / 255.0 * (hi - lo) + lo).astype(jnp.float32)


def _check_images(images: np.ndarray) -> np.ndarray:
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] not in CHANNELS:
    raise ValueError(f'images must be [N, H, W, C] with C in {CHANNELS}, '
                     f'got shape {images.shape}')
  if images.dtype != np.uint8:
    raise ValueError(f'images must be uint8, got {images.dtype}')
  return images


def _to_pil(image: np.ndarray) -> Image.Image:
  # uint8 [H, W] is inferred as mode 'L' and uint8 [H, W, 3] as 'RGB'.
  if image.shape[-1] == 1:
    return Image.fromarray(np.ascontiguousarray(image[..., 0]))
  return Image.fromarray(np.ascontiguousarray(image))


def _encode(image: np.ndarray, fmt: str, quality: int) -> bytes:
  buf = io.BytesIO()
  if fmt == 'png':
    _to_pil(image).save(buf, format='PNG', optimize=True)
  else:
    _to_pil(image).save(buf, format='JPEG', quality=quality)
  return buf.getvalue()


def encoded_sizes(images: np.ndarray, fmt: str, quality: int = 75) -> np.ndarray:
  """Bytes each image takes on the wire.

  Args:
    images: ``uint8 [N, H, W, C]`` with ``C in {1, 3}``.
    fmt: ``'png'`` (PIL, ``optimize=True``, as the authors' code saves each
      prototype), ``'jpeg'`` (PIL, ``quality``) or ``'raw'`` (``H * W * C``).
    quality: JPEG quality.

  Returns:
    ``int64 [N]`` bytes per image.

  Raises:
    ValueError: unknown ``fmt``, bad shape/channel count or dtype.
  """
  if fmt not in FORMATS:
    raise ValueError(f'fmt must be one of {FORMATS}, got {fmt!r}')
  images = _check_images(images)
  n, h, w, c = images.shape
  if fmt == 'raw':
    return np.full((n,), h * w * c, np.int64)
  return np.asarray([len(_encode(im, fmt, quality)) for im in images], np.int64)


def jpeg_roundtrip(images: np.ndarray, quality: int = 75) -> np.ndarray:
  """What a JPEG receiver decodes.

  Args:
    images: ``uint8 [N, H, W, C]`` with ``C in {1, 3}``.
    quality: JPEG quality.

  Returns:
    ``uint8 [N, H, W, C]`` decoded images.

  Raises:
    ValueError: bad shape/channel count or dtype.
  """
  images = _check_images(images)
  out = np.empty_like(images)
  for i, im in enumerate(images):
    with Image.open(io.BytesIO(_encode(im, 'jpeg', quality))) as dec:
      arr = np.asarray(dec, np.uint8)
    out[i] = arr.reshape(im.shape)
  return out
