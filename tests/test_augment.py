"""flip_crop (SCARLET §2.8 RandomCrop + RandomHorizontalFlip) against brute force."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.data import augment
from fedjax_kd.data.augment import flip_crop, get_augment


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
  assert augment.AUGMENTATIONS == ('none', 'flip_crop')
  assert get_augment('none') is None
  assert get_augment('flip_crop') is flip_crop
  assert get_augment('flip_crop') is get_augment('flip_crop')
  with pytest.raises(ValueError, match='data.augment'):
    get_augment('cutout')
