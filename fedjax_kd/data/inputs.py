"""How stored inputs become model inputs: the one place that knows the pixel map.

Image sources are uint8 (MNIST, CIFAR and every ``tfds`` image data set), and
this library keeps them that way, on the host and on the device: one byte per
pixel, a quarter of float32, so a million MNIST images take 0.78 GB rather
than 3.1 GB. The map to the float32 inputs a model trains on happens where a
batch is gathered, inside the compiled step (:meth:`Normalize.__call__`), and
on the host where host code needs floats (:meth:`Normalize.host`).

The rule is by dtype, so one object serves every array of an experiment:

* a **uint8** array holds raw pixels ``0..255``; its model input is
  ``x.astype(float32) / 255`` and then, with ``data.normalize`` statistics,
  ``(x - mean) / std`` per channel (the last axis): exactly the host
  conversion this library has always done, same formula, same op order;
* a **float** array already holds model inputs (feature vectors, the digits
  source, synthetic images, FedCache 2.0's distilled images) and is used as
  it is. Float sources are normalised once on the host when they are loaded
  (:meth:`Normalize.prepare`), as before;
* any **other integer** array (int32) holds token ids of a text source (words
  of a review, characters of a line): they reach the model unchanged, and the
  text models look them up in their embedding tables
  (:mod:`fedjax_kd.models.text`). Sources only ever store integer images as
  uint8 (:func:`stored_inputs`), so the two integer kinds never mix.

Why a lookup table in the compiled step, not the arithmetic: XLA is free to
rewrite ``x / 255`` (it turns a division by a constant into a multiplication
by its reciprocal, and CPU code generation approximates division), and on a
2-core CPU 126 of the 256 pixel values came out one float32 ulp away from
NumPy's ``x / 255``. The in-graph map is therefore a gather from a ``[256, C]``
float32 table that :meth:`Normalize.host` fills on the host with NumPy: the
same values by construction, whatever the backend, and per pixel the cost of
a gather from a 1 KiB table.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ['Normalize', 'as_float', 'stored_inputs', 'pixel_stats', 'is_pixels', 'is_tokens',
           'PIXEL_MAX']

PIXEL_MAX = 255   # integer inputs are pixels 0..PIXEL_MAX; their unit value is x / PIXEL_MAX
# Rows per pass of the histogram of :func:`pixel_stats` (bounds its temporaries).
_STATS_CHUNK = 1 << 20


def is_pixels(x: Any) -> bool:
  """Whether ``x`` (NumPy or JAX) holds raw uint8 pixels rather than model inputs."""
  return x.dtype == jnp.uint8


def is_tokens(x: Any) -> bool:
  """Whether ``x`` (NumPy or JAX) holds token ids: an integer array that is not uint8."""
  return bool(jnp.issubdtype(x.dtype, jnp.integer)) and x.dtype != jnp.uint8


@dataclasses.dataclass(frozen=True)
class Normalize:
  """The map from stored inputs to model inputs (see the module docstring).

  Hashable and immutable: kernels hold it and jit sees it as a constant.

  Attributes:
    mean: per-channel means of ``data.normalize`` (float32 values), or ``()``
      for [0, 1] inputs.
    std: per-channel standard deviations, same length as ``mean``.
  """
  mean: tuple[float, ...] = ()
  std: tuple[float, ...] = ()

  @classmethod
  def from_stats(cls, stats: tuple[np.ndarray, np.ndarray] | None) -> 'Normalize':
    """From :func:`fedjax_kd.data.sources.input_stats`'s ``(mean, std)`` (None: [0, 1])."""
    if stats is None:
      return cls()
    mean, std = (np.asarray(s, np.float32).reshape(-1) for s in stats)
    return cls(tuple(float(m) for m in mean), tuple(float(s) for s in std))

  @property
  def stats(self) -> tuple[np.ndarray, np.ndarray] | None:
    """float32 ``(mean [C], std [C])``, or None for [0, 1] inputs."""
    if not self.mean:
      return None
    return np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)

  def host(self, x: np.ndarray) -> np.ndarray:
    """The float32 model inputs of a host array (NumPy; the reference formula).

    Pixels: ``x.astype(float32) / 255``, then ``((x - mean) / std).astype(float32)``.
    Float arrays are already model inputs and come back as float32, unchanged; token
    ids come back unchanged.
    """
    x = np.asarray(x)
    if is_tokens(x):
      return x
    if not is_pixels(x):
      return x.astype(np.float32, copy=False)
    out = x.astype(np.float32) / np.float32(PIXEL_MAX)
    stats = self.stats
    if stats is None:
      return out
    mean, std = stats
    return ((out - mean) / std).astype(np.float32)

  def prepare(self, x: np.ndarray) -> np.ndarray:
    """The stored form of a source's array: pixels stay pixels, floats are normalised now.

    Float sources have no pixel values to defer, so their statistics are
    applied once on the host, ``((x - mean) / std).astype(float32)`` as before.
    """
    x = np.asarray(x)
    if is_pixels(x) or is_tokens(x) or self.stats is None:
      return x
    mean, std = self.stats
    return ((x - mean) / std).astype(np.float32)

  def table(self, channels: int) -> np.ndarray:
    """float32 ``[256, channels]``: row ``v`` is the model input of pixel value ``v``."""
    return _table(self, int(channels))

  def __call__(self, x: jax.Array) -> jax.Array:
    """The model inputs of ``x`` inside a compiled step (float ``x``, token ids: unchanged).

    Pixels (uint8; sources store integer images as uint8, see
    :func:`stored_inputs`) are looked up in :meth:`table`, so the values equal
    :meth:`host`'s bit for bit.
    """
    if not is_pixels(x):
      return x
    c = x.shape[-1] if x.ndim else 1
    table = jnp.asarray(self.table(c))
    if c == 1 or not self.mean:
      return jnp.take(table[:, 0], x.astype(jnp.int32), axis=0)
    flat = table.reshape(-1)   # row-major: entry v * C + channel
    return jnp.take(flat, x.astype(jnp.int32) * c + jnp.arange(c, dtype=jnp.int32), axis=0)

  def extremes(self, x: Any) -> np.ndarray:
    """Model-input values spanning ``x``'s range: its min and max (a small float32 array).

    For pixels, the per-channel extreme pixels mapped through :meth:`host`
    (the map is increasing), so ``min`` and ``max`` of the result are those of
    the full converted array without converting it.
    """
    if x.size == 0:
      return np.zeros((0,), np.float32)
    if is_tokens(x):
      return np.asarray([jnp.min(x), jnp.max(x)], np.float32)
    if not is_pixels(x):
      return np.asarray(jnp.stack([jnp.nanmin(x), jnp.nanmax(x)]), np.float32)
    c = x.shape[-1]
    axes = tuple(range(x.ndim - 1))
    lo, hi = np.asarray(jnp.min(x, axis=axes)), np.asarray(jnp.max(x, axis=axes))
    return self.host(np.stack([lo, hi]).astype(np.uint8).reshape(2, c))


@functools.lru_cache(maxsize=64)
def _table(normalize: Normalize, channels: int) -> np.ndarray:
  values = np.repeat(np.arange(PIXEL_MAX + 1, dtype=np.uint8)[:, None], channels, axis=1)
  out = normalize.host(values)
  out.setflags(write=False)
  return out


def as_float(x: Any, normalize: Normalize | None = None) -> Any:
  """Model inputs of ``x``: :meth:`Normalize.host` for NumPy, the table lookup for JAX."""
  normalize = normalize or Normalize()
  if isinstance(x, np.ndarray):
    return normalize.host(x)
  return normalize(x)


def stored_inputs(x: np.ndarray) -> np.ndarray:
  """A source's inputs in their stored dtype: uint8 pixels or float32 model inputs.

  Integer arrays hold pixels: uint8 is kept as it is (no copy); other integer
  dtypes whose values all lie in ``0..255`` become uint8 (the same pixels);
  integers outside that range are converted to ``float32 / 255`` now, as
  before. Float arrays become float32.

  Args:
    x: a numeric array (the caller has checked dtype and rank).

  Returns:
    The stored array.
  """
  x = np.asarray(x)
  if not np.issubdtype(x.dtype, np.integer):
    return x.astype(np.float32, copy=False)
  if x.dtype == np.uint8:
    return x
  if x.size == 0 or (x.min() >= 0 and x.max() <= PIXEL_MAX):
    return x.astype(np.uint8)
  return x.astype(np.float32) / np.float32(PIXEL_MAX)


def pixel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel float64 ``(mean, std)`` of the unit values ``x / 255`` of uint8 pixels.

  The statistics of ``Normalize().host(x)`` without building it: a histogram
  of the 256 pixel values per channel (``O(256 C)`` memory, read in chunks of
  rows), then the mean and the population standard deviation of the float32
  unit values, in float64, as ``np.mean``/``np.std`` define them.

  Args:
    x: uint8 ``[..., C]`` pixels.

  Returns:
    float64 ``(mean [C], std [C])``.
  """
  c = x.shape[-1]
  flat = x.reshape(-1, c)
  counts = np.zeros((c, PIXEL_MAX + 1), np.float64)
  for lo in range(0, flat.shape[0], _STATS_CHUNK):
    part = flat[lo:lo + _STATS_CHUNK]
    for ch in range(c):
      counts[ch] += np.bincount(part[:, ch], minlength=PIXEL_MAX + 1)
  values = (np.arange(PIXEL_MAX + 1, dtype=np.float32) / np.float32(PIXEL_MAX)).astype(
      np.float64)
  n = np.maximum(counts.sum(1), 1.0)
  mean = counts @ values / n
  var = np.sum(counts * (values[None, :] - mean[:, None]) ** 2, axis=1) / n
  return mean, np.sqrt(var)
