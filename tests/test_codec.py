"""FedCache 2.0 sample codecs: quantization round trip and PNG/JPEG/raw sizes."""

import io

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from fedjax_kd.ops import codec


def _smooth(n=2, h=32, w=32, c=3):
  """A smooth gradient image batch (what JPEG handles well)."""
  yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing='ij')
  base = np.stack([xx, yy, 0.5 * (xx + yy)], -1)[..., :c]
  imgs = np.stack([base * (0.5 + 0.5 * i / max(n - 1, 1)) for i in range(n)])
  return np.round(imgs * 255).astype(np.uint8)


def test_value_range():
  assert codec.value_range(np.asarray([0.0, 0.3, 1.0])) == (0.0, 1.0)
  assert codec.value_range(np.asarray([0.2, 0.4])) == (0.0, 1.0)      # inside [0, 1]
  assert codec.value_range(np.asarray([-2.0, 0.5, 3.0])) == (-2.0, 3.0)
  assert codec.value_range(np.asarray([0.0, 1.5])) == (0.0, 1.5)
  lo, hi = codec.value_range(np.full(4, 7.0))                          # constant
  assert lo == 7.0 and hi > lo


def test_is_image_shape():
  assert codec.is_image_shape((32, 32, 3))
  assert codec.is_image_shape((28, 28, 1))
  assert not codec.is_image_shape((28, 28))
  assert not codec.is_image_shape((32, 32, 4))
  assert not codec.is_image_shape((60,))


@pytest.mark.parametrize('lo,hi', [(0.0, 1.0), (-2.0, 3.0)])
def test_quantize_round_trip(lo, hi):
  x = jnp.asarray(np.random.default_rng(0).uniform(lo, hi, (500,)), jnp.float32)
  q = codec.quantize(x, lo, hi)
  assert q.dtype == jnp.uint8
  y = codec.dequantize(q, lo, hi)
  assert y.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(y - x))) <= 0.5 / 255 * (hi - lo) + 1e-6


def test_quantize_by_hand():
  x = jnp.asarray([-1.0, 0.0, 0.5, 1.0, 2.0, 0.1])
  np.testing.assert_array_equal(codec.quantize(x, 0.0, 1.0), [0, 0, 128, 255, 255, 26])
  np.testing.assert_allclose(codec.dequantize(jnp.asarray([0, 51, 255], jnp.uint8), -1.0, 4.0),
                             [-1.0, 0.0, 4.0], atol=1e-6)


def test_raw_sizes():
  np.testing.assert_array_equal(
      codec.encoded_sizes(np.zeros((3, 32, 32, 3), np.uint8), 'raw'), [3072] * 3)
  sizes = codec.encoded_sizes(np.zeros((2, 28, 28, 1), np.uint8), 'raw')
  np.testing.assert_array_equal(sizes, [784, 784])
  assert sizes.dtype == np.int64


@pytest.mark.parametrize('c', [1, 3])
@pytest.mark.parametrize('fmt', ['png', 'jpeg'])
def test_encoded_sizes_positive_and_constant_smaller_than_noise(fmt, c):
  const = np.full((2, 32, 32, c), 128, np.uint8)
  noise = np.random.default_rng(1).integers(0, 256, (2, 32, 32, c), dtype=np.uint8)
  s_const = codec.encoded_sizes(const, fmt)
  s_noise = codec.encoded_sizes(noise, fmt)
  assert s_const.dtype == np.int64 and s_const.shape == (2,)
  assert (s_const > 0).all() and (s_noise > 0).all()
  assert (s_const < s_noise).all(), (s_const, s_noise)
  if fmt == 'png':   # much smaller; noise does not compress (about raw size or more)
    assert (s_const * 5 < s_noise).all(), (s_const, s_noise)
    assert (s_noise >= 0.95 * 32 * 32 * c).all()


@pytest.mark.parametrize('c', [1, 3])
def test_png_is_lossless(c):
  imgs = np.random.default_rng(2).integers(0, 256, (2, 16, 16, c), dtype=np.uint8)
  # Encode exactly as encoded_sizes does and decode with PIL.
  for im, size in zip(imgs, codec.encoded_sizes(imgs, 'png')):
    buf = io.BytesIO()
    pil = Image.fromarray(im[..., 0] if c == 1 else im)
    assert pil.mode == ('L' if c == 1 else 'RGB')
    pil.save(buf, format='PNG', optimize=True)
    assert len(buf.getvalue()) == size
    dec = np.asarray(Image.open(io.BytesIO(buf.getvalue())))
    np.testing.assert_array_equal(dec.reshape(im.shape), im)


@pytest.mark.parametrize('c', [1, 3])
def test_jpeg_roundtrip_smooth(c):
  imgs = _smooth(c=c)
  out = codec.jpeg_roundtrip(imgs, quality=75)
  assert out.shape == imgs.shape and out.dtype == np.uint8
  err = np.abs(out.astype(np.float64) - imgs).mean()
  assert err < 3.0, err
  # Higher quality -> more bytes.
  assert codec.encoded_sizes(imgs, 'jpeg', 95).sum() > codec.encoded_sizes(imgs, 'jpeg', 20).sum()


def test_bad_inputs_raise():
  imgs = np.zeros((1, 8, 8, 3), np.uint8)
  with pytest.raises(ValueError, match='png'):
    codec.encoded_sizes(imgs, 'gif')
  with pytest.raises(ValueError, match=r'\(1, 3\)'):
    codec.encoded_sizes(np.zeros((1, 8, 8, 4), np.uint8), 'png')
  with pytest.raises(ValueError, match=r'\(1, 3\)'):
    codec.jpeg_roundtrip(np.zeros((1, 8, 8, 2), np.uint8))
  with pytest.raises(ValueError, match='uint8'):
    codec.encoded_sizes(np.zeros((1, 8, 8, 3), np.float32), 'jpeg')
