"""flip_crop (SCARLET's code: RandomCrop + RandomHorizontalFlip) against brute force, and
jitter_flip_gray (FedEntOpt's ColorJitter + flip + RandomGrayscale)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.data import augment
from fedjax_kd.data.augment import flip_crop, get_augment, jitter_flip_gray


def _batch(b: int, h: int = 6, w: int = 6, c: int = 2) -> np.ndarray:
  """``b`` copies of one image with distinct (non-zero) values."""
  img = np.arange(1, h * w * c + 1, dtype=np.float32).reshape(h, w, c)
  return np.broadcast_to(img, (b, h, w, c)).copy()


def _match(out: np.ndarray, img: np.ndarray, pad: int, fill: float):
  """All (dy, dx, flip) whose window of the padded image equals ``out``."""
  h, w, _ = img.shape
  p = np.pad(img, ((pad, pad), (pad, pad), (0, 0)), constant_values=fill)
  hits = []
  for dy in range(2 * pad + 1):
    for dx in range(2 * pad + 1):
      win = p[dy:dy + h, dx:dx + w]
      for flip in (False, True):
        cand = win[:, ::-1] if flip else win
        if np.array_equal(out, cand):
          hits.append((dy, dx, flip))
  return hits


def test_pad0_is_identity_or_mirror_with_fair_flips():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 8, 8, 3)).astype(np.float32)
  out = np.asarray(flip_crop(jax.random.PRNGKey(0), jnp.asarray(x), pad=0))
  flips = 0
  for i in range(200):
    same = np.array_equal(out[i], x[i])
    mirror = np.array_equal(out[i], x[i][:, ::-1])
    assert same != mirror  # exactly one (random images are not symmetric)
    flips += mirror
  assert 0.35 <= flips / 200 <= 0.65


@pytest.mark.parametrize('fill', [0.0, -1.0])
def test_pad2_windows_brute_force(fill):
  x = _batch(200)
  out = np.asarray(
      flip_crop(jax.random.PRNGKey(1), jnp.asarray(x), pad=2, fill=fill))
  offsets, flips = set(), 0
  for i in range(200):
    hits = _match(out[i], x[i], 2, fill)
    assert len(hits) == 1, (i, hits)  # distinct values -> unique explanation
    dy, dx, flip = hits[0]
    offsets.add((dy, dx))
    flips += flip
  assert len(offsets) > 10
  assert 0.35 <= flips / 200 <= 0.65


def test_default_pad_is_h_over_8():
  x = _batch(300, 16, 16, 1)  # pad=None -> 2
  out = np.asarray(flip_crop(jax.random.PRNGKey(2), jnp.asarray(x)))
  offsets = set()
  for i in range(0, 300, 3):
    hits = _match(out[i], x[i], 2, 0.0)
    assert len(hits) == 1
    offsets.add(hits[0][:2])
  assert max(max(o) for o in offsets) == 4  # offsets reach 2 * pad


def test_determinism_and_key_dependence():
  x = jnp.asarray(_batch(32, 8, 8, 3))
  a = flip_crop(jax.random.PRNGKey(3), x, pad=2)
  b = flip_crop(jax.random.PRNGKey(3), x, pad=2)
  c = flip_crop(jax.random.PRNGKey(4), x, pad=2)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(a), np.asarray(c))
  assert a.shape == x.shape and a.dtype == x.dtype


@pytest.mark.slow
def test_jit_and_vmap_match_eager():
  x = jnp.asarray(_batch(16, 8, 8, 3))
  key = jax.random.PRNGKey(5)
  eager = flip_crop(key, x, pad=2)
  jitted = jax.jit(flip_crop, static_argnames='pad')(key, x, pad=2)
  np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))

  keys = jax.random.split(key, 3)
  xs = jnp.stack([x, x + 100.0, x - 100.0])
  vm = jax.jit(jax.vmap(lambda k, b: flip_crop(k, b, pad=2)))(keys, xs)
  assert vm.shape == (3, 16, 8, 8, 3)
  for j in range(3):
    np.testing.assert_array_equal(
        np.asarray(vm[j]), np.asarray(flip_crop(keys[j], xs[j], pad=2)))


def test_get_augment():
  assert augment.AUGMENTATIONS == ('none', 'flip_crop', 'jitter_flip_gray')
  assert get_augment('none') is None
  assert get_augment('flip_crop') is flip_crop
  assert get_augment('flip_crop') is get_augment('flip_crop')
  with pytest.raises(ValueError, match='data.augment'):
    get_augment('cutout')


# ---------------------------------------------------------------- jitter_flip_gray (FedEntOpt)


def _uniform(b: int, h: int = 6, w: int = 5, c: int = 3, lo: float = 0.0,
             hi: float = 1.0, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.uniform(lo, hi, size=(b, h, w, c)).astype(np.float32)


def _one(img, brightness=1.0, contrast=1.0, saturation=1.0, hue=0.0, flip=False,
         gray=False):
  return np.asarray(augment._jitter_flip_gray_one(
      jnp.asarray(img), jnp.float32(brightness), jnp.float32(contrast),
      jnp.float32(saturation), jnp.float32(hue), jnp.bool_(flip), jnp.bool_(gray)))


@pytest.mark.slow
def test_jitter_flip_gray_shapes_range_determinism():
  x = _uniform(64)
  x[0] = 0.0
  x[1] = 1.0
  key = jax.random.PRNGKey(0)
  a = jitter_flip_gray(key, jnp.asarray(x))
  assert a.shape == x.shape and a.dtype == jnp.float32
  a = np.asarray(a)
  assert a.min() >= 0.0 and a.max() <= 1.0
  np.testing.assert_array_equal(a, np.asarray(jitter_flip_gray(key, jnp.asarray(x))))
  assert not np.array_equal(a, np.asarray(jitter_flip_gray(jax.random.PRNGKey(1),
                                                           jnp.asarray(x))))
  # Copies of one image get different augmentations.
  same = np.broadcast_to(x[5], x.shape).copy()
  out = np.asarray(jitter_flip_gray(key, jnp.asarray(same)))
  assert len({out[i].tobytes() for i in range(64)}) == 64
  # 1-channel images: brightness, contrast and flip only.
  g = jitter_flip_gray(key, jnp.asarray(_uniform(8, c=1)))
  assert g.shape == (8, 6, 5, 1) and float(g.min()) >= 0 and float(g.max()) <= 1


def test_jitter_identity_brightness_and_hue():
  x = _uniform(1)[0]
  # All factors at identity (hue shift 0): identity up to the HSV round trip.
  np.testing.assert_allclose(_one(x), x, atol=1e-5)
  # Only brightness: clip(x * f).
  for f in (0.8, 1.0, 1.2, 1.7):
    np.testing.assert_allclose(_one(x, brightness=f), np.clip(x * f, 0, 1), atol=1e-5)
  # Contrast 0 -> the mean luma everywhere; saturation 0 -> the luma on every channel.
  luma = x @ np.array([0.299, 0.587, 0.114], np.float32)
  np.testing.assert_allclose(_one(x, contrast=0.0), np.full_like(x, luma.mean()), atol=1e-5)
  np.testing.assert_allclose(_one(x, saturation=0.0), np.repeat(luma[..., None], 3, -1),
                             atol=1e-5)
  # Contrast 1.2 by hand: clip(1.2 x - 0.2 mean).
  np.testing.assert_allclose(_one(x, contrast=1.2), np.clip(1.2 * x - 0.2 * luma.mean(), 0, 1),
                             atol=1e-5)
  # Flip and grayscale flags.
  np.testing.assert_allclose(_one(x, flip=True), x[:, ::-1], atol=1e-5)
  np.testing.assert_allclose(_one(x, gray=True), np.repeat(luma[..., None], 3, -1), atol=1e-5)


@pytest.mark.parametrize('shift', [0.05, -0.05, 0.5])
def test_hue_shift_matches_colorsys(shift):
  import colorsys  # pylint: disable=g-import-not-at-top
  x = _uniform(1, seed=3)[0]
  out = _one(x, hue=shift)
  ref = np.empty_like(x)
  for i in range(x.shape[0]):
    for j in range(x.shape[1]):
      h, s_, v = colorsys.rgb_to_hsv(*x[i, j])
      ref[i, j] = colorsys.hsv_to_rgb((h + shift) % 1.0, s_, v)
  np.testing.assert_allclose(out, ref, atol=1e-5)


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_flip_and_grayscale_per_sample():
  # 1 channel, values in [0.3, 0.6]: brightness and contrast are increasing affine maps
  # without clipping, so every output is an increasing map of x or of its mirror.
  b = 400
  x = _uniform(b, 5, 7, 1, 0.3, 0.6, seed=1)
  key = jax.random.PRNGKey(7)
  out = np.asarray(jitter_flip_gray(key, jnp.asarray(x)))
  keys = jax.random.split(key, b)
  flips = 0
  for i in range(b):
    plain = np.corrcoef(out[i].ravel(), x[i].ravel())[0, 1]
    mirror = np.corrcoef(out[i].ravel(), x[i][:, ::-1].ravel())[0, 1]
    flipped = mirror > 0.999999
    assert flipped != (plain > 0.999999), i
    # The documented key use: one key per sample, split in 4 (factors, hue, flip, gray).
    k_flip = jax.random.split(keys[i], 4)[2]
    assert flipped == bool(jax.random.bernoulli(k_flip, 0.5)), i
    flips += flipped
  assert 0.4 <= flips / b <= 0.6
  # RGB: about 10 % of the samples come out gray (three equal channels).
  rgb = _uniform(b, seed=2)
  out = np.asarray(jitter_flip_gray(key, jnp.asarray(rgb)))
  gray = np.array([np.allclose(o[..., 0], o[..., 1]) and np.allclose(o[..., 1], o[..., 2])
                   for o in out])
  assert 0.05 <= gray.mean() <= 0.16
  expect = np.array([bool(jax.random.bernoulli(jax.random.split(keys[i], 4)[3], 0.1))
                     for i in range(b)])
  np.testing.assert_array_equal(gray, expect)


@pytest.mark.slow
def test_jitter_flip_gray_jit_and_vmap():
  x = jnp.asarray(_uniform(16))
  key = jax.random.PRNGKey(5)
  eager = jitter_flip_gray(key, x)
  np.testing.assert_allclose(np.asarray(jax.jit(jitter_flip_gray)(key, x)), np.asarray(eager),
                             atol=1e-6)
  keys = jax.random.split(key, 3)
  xs = jnp.stack([x, x * 0.5, 1.0 - x])
  vm = jax.jit(jax.vmap(jitter_flip_gray))(keys, xs)
  assert vm.shape == (3, 16, 6, 5, 3)
  for j in range(3):
    np.testing.assert_allclose(np.asarray(vm[j]), np.asarray(jitter_flip_gray(keys[j], xs[j])),
                               atol=1e-6)
  assert get_augment('jitter_flip_gray') is jitter_flip_gray
  assert get_augment('jitter_flip_gray') is get_augment('jitter_flip_gray')
