"""uint8 pixels in memory, float32 model inputs in the compiled step (fedjax_kd.data.inputs).

The uint8 path must give the model exactly the inputs the float path gave: hand-checked pixel
values, every pixel value of every channel against NumPy's formula, a kernel's predictions and
training on uint8 against pre-normalised float inputs, and whole runs from a uint8 npz against
the same images written as float32. The stored arrays are uint8 on the device, and a run with
many clients on the host store completes.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.core.kernels import CohortKernels
from fedjax_kd.core.program import SGD, Rows
from fedjax_kd.data import sources
from fedjax_kd.data.inputs import Normalize, as_float, pixel_stats, stored_inputs
from fedjax_kd.models import registry
from fedjax_kd.running import experiment
from tests.conftest import mnist_path
from tests.shared import tiny_config


def _images(n: int, shape=(8, 8, 1), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """uint8 images of 10 classes (class prototypes plus noise) and their labels."""
  rng = np.random.default_rng(seed)
  protos = rng.uniform(0, 255, size=(10,) + shape)
  y = rng.permutation(np.arange(n) % 10)
  x = np.clip(protos[y] + rng.normal(0, 40, size=(n,) + shape), 0, 255).astype(np.uint8)
  return x, y.astype(np.int64)


# ------------------------------------------------------------------ the map
def test_hand_checked_pixel_values():
  x = jnp.asarray([[0], [255], [51], [128]], jnp.uint8)          # [4, 1]: one channel
  unit = np.asarray(jax.jit(Normalize())(x))
  assert unit.dtype == np.float32
  assert unit[0, 0] == 0.0 and unit[1, 0] == 1.0                  # 0 -> 0.0, 255 -> 1.0
  assert unit[2, 0] == np.float32(0.2)                            # 51 / 255 = 1 / 5
  assert unit[3, 0] == np.float32(128) / np.float32(255)          # 0.50196...
  sym = np.asarray(Normalize((0.5,), (0.5,))(x))                  # data.normalize='symmetric'
  assert sym[0, 0] == -1.0 and sym[1, 0] == 1.0
  assert sym[2, 0] == np.float32(-0.6)                            # (0.2 - 0.5) / 0.5
  # Float arrays are model inputs already: unchanged, on the device and on the host.
  f = jnp.asarray([[0.25]], jnp.float32)
  assert Normalize((0.5,), (0.5,))(f) is f
  np.testing.assert_array_equal(Normalize((0.5,), (0.5,)).host(np.float32([[0.25]])), [[0.25]])


def test_every_pixel_of_every_channel_equals_numpys_formula():
  """The in-graph map is the host formula bit for bit (XLA's own x / 255 is not, on CPU)."""
  mean, std = np.float32([0.4914, 0.4822, 0.4465]), np.float32([0.2470, 0.2435, 0.2616])
  norm = Normalize.from_stats((mean, std))
  v = np.arange(256, dtype=np.uint8)
  x = np.stack([v, v[::-1], np.roll(v, 7)], axis=-1).reshape(16, 16, 3)   # [16, 16, 3]
  want = ((x.astype(np.float32) / np.float32(255) - mean) / std).astype(np.float32)
  got = np.asarray(jax.jit(norm)(jnp.asarray(x)))
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(norm.host(x), want)
  np.testing.assert_array_equal(as_float(jnp.asarray(x), norm), want)
  # The table: row v is pixel v of each channel.
  assert norm.table(3).shape == (256, 3) and norm.table(3)[255, 2] == want.reshape(-1, 3)[
      np.flatnonzero(x.reshape(-1, 3)[:, 2] == 255)[0], 2]


def test_stored_inputs_keep_pixels_as_uint8():
  u8 = np.arange(6, dtype=np.uint8).reshape(2, 3)
  assert stored_inputs(u8) is u8                                   # no copy
  wide = np.asarray([[0, 17, 255]], np.int64)                      # pixels in a wider dtype
  assert stored_inputs(wide).dtype == np.uint8
  np.testing.assert_array_equal(stored_inputs(wide), [[0, 17, 255]])
  big = np.asarray([[0, 510]], np.int64)                           # not pixels: float as before
  out = stored_inputs(big)
  assert out.dtype == np.float32 and out[0, 1] == np.float32(2.0)
  assert stored_inputs(np.asarray([[0.5]], np.float64)).dtype == np.float32


def test_pixel_statistics_equal_the_float_path():
  x, _ = _images(500, shape=(6, 6, 3), seed=3)
  mean, std = pixel_stats(x)
  flat = (x.astype(np.float32) / np.float32(255)).astype(np.float64).reshape(-1, 3)
  np.testing.assert_allclose(mean, flat.mean(0), rtol=1e-13)
  np.testing.assert_allclose(std, flat.std(0), rtol=1e-12)
  # data.normalize='standardize' gets the same float32 statistics from uint8 or float inputs.
  a = sources.input_stats('standardize', x)
  b = sources.input_stats('standardize', Normalize().host(x))
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  # Hand check: half black, half white pixels: mean 0.5, std 0.5.
  bw = np.asarray([0, 255, 0, 255], np.uint8).reshape(4, 1)
  m, s = pixel_stats(bw)
  assert m[0] == 0.5 and s[0] == 0.5


# ----------------------------------------------------------------- kernels
@pytest.mark.parametrize('norm', [Normalize(), Normalize((0.45,), (0.22,))])
@pytest.mark.slow
def test_kernel_predictions_and_training_equal_on_uint8_and_float(norm):
  x, y = _images(40, shape=(8, 8, 1))
  xf = norm.host(x)                                   # pre-normalised float inputs
  module = registry.get_model('cnn@0.25', num_classes=10, input_shape=(8, 8, 1))
  opt = {'train': optax.sgd(0.1)}
  kernels = CohortKernels(module, opt, normalize=norm)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  slots = jnp.arange(2, dtype=jnp.int32)
  state = kernels.init(keys, (8, 8, 1))
  p_u8 = np.asarray(kernels.predict(state, slots, jnp.asarray(x), chunk=16))
  p_f = np.asarray(kernels.predict(state, slots, jnp.asarray(xf), chunk=16))
  np.testing.assert_array_equal(p_u8, p_f)
  assert p_u8.shape == (2, 40, 10) and np.allclose(p_u8.sum(-1), 1.0, atol=1e-5)
  acc_u8 = kernels.evaluate(state, slots, jnp.asarray(x), jnp.asarray(y), chunk=16)
  acc_f = kernels.evaluate(state, slots, jnp.asarray(xf), jnp.asarray(y), chunk=16)
  for a, b in zip(acc_u8, acc_f):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def fit(inputs):
    st = kernels.init(keys, (8, 8, 1))
    idx = jnp.asarray(np.arange(40).reshape(2, 20), jnp.int32)
    st, _, loss = kernels.run(
        SGD(_ce, 2, 8), st, slots, jnp.ones(2, bool), keys,
        Rows({'x': jnp.asarray(inputs), 'y': jnp.asarray(y, jnp.int32)}, idx,
             jnp.full(2, 20, jnp.int32)))
    return jax.tree.leaves(st.params), np.asarray(loss)

  (w_u8, l_u8), (w_f, l_f) = fit(x), fit(xf)
  np.testing.assert_array_equal(l_u8, l_f)
  assert np.all(np.isfinite(l_u8)) and l_u8[0] != l_u8[1]
  for a, b in zip(w_u8, w_f):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _ce(logits, batch, aux):
  del aux
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])


# -------------------------------------------------------------- experiments
def _npz(path, x_train, y_train, x_test, y_test):
  np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
  return str(path)


def _pair(tmp_path, n=400, shape=(8, 8, 1)):
  """The same images as a uint8 npz and as a float32 npz of their unit values x / 255."""
  x, y = _images(n + 100, shape=shape)
  unit = Normalize().host(x)
  u8 = _npz(tmp_path / 'u8.npz', x[:n], y[:n], x[n:], y[n:])
  f32 = _npz(tmp_path / 'f32.npz', unit[:n], y[:n], unit[n:], y[n:])
  return u8, f32


def _config(source: str, **fields):
  """The shared tiny experiment on an npz source, CNN clients on its images; ``fields`` as
  ``group__name=value``."""
  return tiny_config(rounds=2, **{
      'data.source': f'npz:{source}', 'data.num_public': 100, 'data.partition': 'iid',
      'clients.models': ('cnn@0.25',), 'train.batch_size': 20, 'distill.batch_size': 25,
      'distill.public_per_round': 50, 'checkpoint.every': 0, 'log.tensorboard': False,
      **{k.replace('__', '.'): v for k, v in fields.items()}})


def test_device_arrays_are_uint8(tmp_path):
  u8, f32 = _pair(tmp_path)
  d = experiment.build(config_lib.validate(_config(u8))).ctx.data
  for a in (d.x_private, d.x_public, d.x_test):
    assert isinstance(a, jax.Array) and a.dtype == jnp.uint8
  assert d.x_private.shape == (300, 8, 8, 1) and d.x_public.shape == (100, 8, 8, 1)
  assert d.x_private.nbytes == 300 * 64                            # one byte per pixel
  np.testing.assert_array_equal(d.normalize.host(np.asarray(d.x_private))[0],
                                np.asarray(d.x_private)[0].astype(np.float32) / np.float32(255))
  f = experiment.build(config_lib.validate(_config(f32))).ctx.data
  assert f.x_private.dtype == jnp.float32                        # float sources stay float
  np.testing.assert_array_equal(np.asarray(f.x_private), d.normalize.host(np.asarray(d.x_private)))
  s = experiment.build(config_lib.validate(_config(u8, data__normalize='symmetric'))).ctx.data
  assert s.x_private.dtype == jnp.uint8 and s.normalize == Normalize((0.5,), (0.5,))


def _rows(workdir):
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


@pytest.mark.parametrize('algorithm,fields', [
    ('dsfl', {'data__normalize': 'standardize'}),
    ('scarlet', {'data__augment': 'flip_crop', 'data__normalize': 'symmetric',
                 'clients__store': 'host', 'clients__participation': 0.5}),
    ('fedcache2', {'data__normalize': 'standardize'}),
])
@pytest.mark.slow
def test_uint8_and_float_sources_give_the_same_run(tmp_path, algorithm, fields):
  """Every metric of every round equal (public set, augmentation, host store, KRR).

  CI runs SCARLET (public set, augmentation, host store); ``FEDJAX_KD_GOLDEN=all`` runs all.
  """
  if algorithm != 'scarlet' and os.environ.get('FEDJAX_KD_GOLDEN') != 'all':
    pytest.skip('outside the CI subset; FEDJAX_KD_GOLDEN=all runs it')
  u8, f32 = _pair(tmp_path)
  out = []
  for name, source in (('u8', u8), ('f32', f32)):
    c = _config(source, **fields)
    c.algorithm = algorithm
    if algorithm == 'fedcache2':
      c.data.num_public = 0
      c.fedcache2.dd_epochs = 1
      c.fedcache2.dd_batch_size = 20
    workdir = tmp_path / name
    runner.run(config_lib.validate(c), str(workdir), resume=False, progress=False)
    out.append(_rows(workdir))
  assert out[0] == out[1]
  assert 0.0 < out[0][-1]['test_acc'] <= 1.0


@pytest.mark.slow
def test_many_clients_on_the_host_store(tmp_path):
  """K = 2,000 clients at 1% participation with a tiny model: 20 clients a round."""
  x, y = _images(2000 * 3 + 200, shape=(8, 8, 1))
  path = _npz(tmp_path / 'many.npz', x[:6100], y[:6100], x[6100:], y[6100:])
  c = _config(path, clients__num_clients=2000, clients__participation=0.01,
              clients__store='host', clients__models=('mlp@0.05',))
  c.algorithm = 'fedavg'
  c.train.batch_size = 3
  c.eval.clients = False
  spec = config_lib.validate(c)
  exp = experiment.build(spec)
  assert exp.ctx.data.x_private.dtype == jnp.uint8 and exp.ctx.data.client_idx.shape == (2000, 3)
  workdir = tmp_path / 'run'
  summary = runner.run(spec, str(workdir), resume=False, progress=False)
  rows = _rows(workdir)
  assert [r['round'] for r in rows] == [1, 2] and all(r['participants'] == 20 for r in rows)
  assert summary['rounds_run_this_call'] == 2 and 0.0 <= rows[-1]['test_acc'] <= 1.0


def test_real_mnist_is_stored_as_uint8():
  path = mnist_path()
  if not path.exists():
    pytest.skip(f'{path} is absent (real MNIST for this test)')
  ds = sources.load_source(f'npz:{path}')
  assert ds.x_train.dtype == np.uint8 and ds.x_train.nbytes == 60000 * 784
  # standardize: the statistics of x / 255 (MNIST's well-known 0.1307 / 0.3081) from the
  # pixel histogram, equal to the float path's.
  mean, std = sources.input_stats('standardize', ds.x_train)
  assert abs(float(mean[0]) - 0.1307) < 1e-4 and abs(float(std[0]) - 0.3081) < 1e-4
  fmean, fstd = sources.input_stats('standardize', Normalize().host(ds.x_train[:20000]))
  m20, s20 = sources.input_stats('standardize', ds.x_train[:20000])
  np.testing.assert_array_equal(m20, fmean)
  np.testing.assert_array_equal(s20, fstd)
