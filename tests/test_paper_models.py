"""Tests of the ACE-pFL image models (He et al., IEEE/ACM ToN 2025): GoogLeNet, VGG-16,
ResNet-34 and ResNet-50 in kuangliu/pytorch-cifar's CIFAR variants.

Width-1 models are only traced (`jax.eval_shape`); forward passes use width 0.125 and XLA's
convolution (it compiles faster than im2col on CPU; the two agree, see test_models.py)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.models import (GoogLeNet, ResNet, VGG, count_params, get_model, googlenet,
                              init_variables, registry, vgg)

PAPER_MODELS = ('googlenet', 'vgg16', 'resnet34', 'resnet50')


def _shapes(spec, num_classes=10, input_shape=(32, 32, 3)):
  model = get_model(spec, num_classes=num_classes, input_shape=input_shape)
  variables = jax.eval_shape(lambda k: init_variables(model, k, input_shape),
                             jax.random.PRNGKey(0))
  return model, variables


def _random_variables(model, input_shape, seed=0):
  """Variables with the model's structure, filled by numpy (no init compilation: faster)."""
  shapes = jax.eval_shape(lambda k: init_variables(model, k, input_shape),
                          jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)

  def fill(path, a):
    name = jax.tree_util.keystr(path)
    if "'var'" in name or "'scale'" in name:
      v = rng.uniform(0.5, 1.5, a.shape)
    else:
      fan_in = max(1, int(np.prod(a.shape[:-1])))
      v = rng.normal(size=a.shape) / np.sqrt(fan_in if len(a.shape) > 1 else 10)
    return jnp.asarray(v, jnp.float32)

  return jax.tree_util.tree_map_with_path(fill, shapes)


# ------------------------------------------------------------------------------ param counts

# Trainable = PyTorch's sum(p.numel() for p in model.parameters()) for kuangliu's models;
# total adds the BN running mean/var.
COUNTS = {  # (trainable, total, embedding size) at width 1, 10 classes, 32x32x3
    'googlenet': (6_166_250, 6_182_058, 1024),
    'vgg16': (14_728_266, 14_736_714, 512),
    'resnet34': (21_282_122, 21_299_146, 512),
    'resnet50': (23_520_842, 23_573_962, 2048),
}


@pytest.mark.parametrize('spec', PAPER_MODELS)
def test_param_counts_and_embed_size(spec):
  trainable, total, dim = COUNTS[spec]
  model, variables = _shapes(spec)
  assert count_params(variables) == (trainable, total)
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  assert jax.eval_shape(lambda v, x: model.apply(v, x, embed=True), variables, x).shape == (
      2, dim)
  assert jax.eval_shape(model.apply, variables, x).shape == (2, 10)


@pytest.mark.slow
def test_width_multiplier_counts():
  for name in PAPER_MODELS:
    half = count_params(_shapes(f'{name}@0.5')[1])[0]
    assert 0.2 * COUNTS[name][0] < half < 0.3 * COUNTS[name][0], name  # convs ~ width^2
    assert count_params(_shapes(f'{name}@0.001')[1])[0] > 0  # every size at least 1


def test_structure():
  # VGG-16: 13 biased 3x3 convs + 13 BNs + 1 Dense.
  _, v = _shapes('vgg16')
  convs = [k for k in v['params'] if k.startswith('Conv_')]
  assert len(convs) == 13 and all(set(v['params'][k]) == {'kernel', 'bias'} for k in convs)
  assert v['params']['Dense_0']['kernel'].shape == (512, 10)
  # ResNets: projections (1x1 conv + BN) only where the shape changes.
  for spec, first, proj_blocks in [('resnet34', 64, {3, 7, 13}),
                                   ('resnet50', 64, {0, 3, 7, 13})]:
    _, v = _shapes(spec)
    assert v['params']['Conv_0']['kernel'].shape == (3, 3, 3, first)
    blocks = {int(k.split('_')[1]): v['params'][k] for k in v['params']
              if k.startswith('ProjBlock_')}
    assert len(blocks) == 16
    n_convs = 2 if spec == 'resnet34' else 3
    projected = {i for i, b in blocks.items() if f'Conv_{n_convs}' in b}
    assert projected == proj_blocks, spec
    for i in projected:
      k = blocks[i][f'Conv_{n_convs}']['kernel']
      assert k.shape[:2] == (1, 1) and set(blocks[i][f'Conv_{n_convs}']) == {'kernel'}
      assert f'BatchNorm_{n_convs}' in blocks[i]
  # GoogLeNet: 9 Inception modules of 7 biased convs; b5 outputs 384 + 384 + 128 + 128.
  _, v = _shapes('googlenet')
  inc = [k for k in v['params'] if k.startswith('Inception_')]
  assert sorted(inc) == sorted(f'Inception_{n}' for n in googlenet.INCEPTION_CFG)
  assert all(len([c for c in v['params'][k] if c.startswith('Conv_')]) == 7 for k in inc)
  assert v['params']['Conv_0']['kernel'].shape == (3, 3, 3, 192)


# ------------------------------------------------------------------------------ pooling

@pytest.mark.parametrize('shape', [(2, 7, 6, 3), (2, 8, 8, 2), (1, 1, 1, 2), (1, 2, 3, 1)])
def test_max_pool3_matches_flax(shape):
  x = jax.random.normal(jax.random.PRNGKey(0), shape)
  for s in (1, 2):
    ref = nn.max_pool(x, (3, 3), (s, s), padding=((1, 1), (1, 1)))
    np.testing.assert_array_equal(googlenet.max_pool3(x, s), ref)


def test_max_pool2_clamped():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 4, 3))
  np.testing.assert_array_equal(vgg.max_pool2_clamped(x), nn.max_pool(x, (2, 2), (2, 2)))
  one = x[:, :1, :1]
  np.testing.assert_array_equal(vgg.max_pool2_clamped(one), one)
  col, row = x[:, :, :1], x[:, :1, :]
  np.testing.assert_array_equal(vgg.max_pool2_clamped(col), nn.max_pool(col, (2, 1), (2, 1)))
  np.testing.assert_array_equal(vgg.max_pool2_clamped(row), nn.max_pool(row, (1, 2), (1, 2)))
  # VGG-16 on 8x8 (sklearn digits) and 28x28: the map ends at 1x1, never 0.
  for side in (8, 28, 1):
    model, v = _shapes('vgg16@0.125', input_shape=(side, side, 1))
    x = jax.ShapeDtypeStruct((2, side, side, 1), jnp.float32)
    _, inter = jax.eval_shape(lambda v, x: model.apply(
        v, x, capture_intermediates=True, mutable=['intermediates']), v, x)
    last_bn = max((k for k in inter['intermediates'] if k.startswith('BatchNorm_')),
                  key=lambda k: int(k.split('_')[1]))
    assert inter['intermediates'][last_bn]['__call__'][0].shape[1:3] == (1, 1)


# ------------------------------------------------------------------------------ forward passes

@pytest.mark.parametrize('name', PAPER_MODELS)
@pytest.mark.parametrize('shape', [(32, 32, 3), (8, 8, 1)])
@pytest.mark.slow
def test_forward_embed_and_mask(name, shape):
  classes = 7
  model = get_model(f'{name}@0.125', num_classes=classes, input_shape=shape, lowering='xla')
  v = _random_variables(model, shape)
  x = jax.random.normal(jax.random.PRNGKey(1), (4,) + shape)
  mask = jnp.array([1, 1, 0, 1], jnp.float32)
  idx = np.array([0, 1, 3])
  x_bad = x.at[2].set(1e3)

  @jax.jit
  def run(x):
    logits, state = model.apply(v, x, train=True, mask=mask, mutable=['batch_stats'])
    feats = model.apply(v, x, train=True, mask=mask, embed=True, mutable=['batch_stats'])[0]
    return (model.apply(v, x), model.apply(v, x, embed=True)), (logits, feats, state)

  # One compilation for the clean and the garbage batch, to keep the test short.
  (eval_logits, eval_feats), (logits, feats, state) = run(x)
  _, (logits_bad, feats_bad, state_bad) = run(x_bad)
  dense = v['params']['Dense_0']
  for lg, ft in ((eval_logits, eval_feats), (logits, feats), (logits_bad, feats_bad)):
    assert lg.shape == (4, classes) and ft.shape == (4, dense['kernel'].shape[0])
    assert bool(jnp.all(jnp.isfinite(lg[idx])))
    np.testing.assert_allclose(lg, ft @ dense['kernel'] + dense['bias'], rtol=1e-4,
                               atol=1e-4 * float(jnp.abs(lg).max()))
  # A masked-out row (even garbage) changes neither the valid rows nor the BN statistics.
  np.testing.assert_allclose(logits_bad[idx], logits[idx], rtol=1e-4,
                             atol=1e-4 * float(jnp.abs(logits).max()))
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state_bad)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * float(jnp.abs(a).max()))


# ------------------------------------------------------------------------------ registry

def test_registry():
  assert set(PAPER_MODELS) <= set(registry.available())
  assert registry.parse_spec('VGG16@0.25') == ('vgg16', 0.25)
  assert registry.parse_spec(' GoogLeNet ') == ('googlenet', 1.0)
  for spec, cls in [('vgg16@0.25', VGG), ('googlenet@0.5', GoogLeNet), ('resnet34@0.25', ResNet),
                    ('resnet50@2', ResNet)]:
    for shape in [(32, 32, 3), (28, 28), (8, 8, 1), (1, 1, 3)]:
      model = get_model(spec, num_classes=10, input_shape=shape)
      assert isinstance(model, cls)
    assert model.width == registry.parse_spec(spec)[1]
  assert get_model('resnet34', num_classes=10, input_shape=(32, 32, 3)).block == 'basic'
  assert get_model('resnet50', num_classes=10, input_shape=(32, 32, 3)).block == 'bottleneck'
  with pytest.raises(registry.ParamError, match='^spec='):
    get_model('vgg16', num_classes=10, input_shape=(40,))


# ------------------------------------------------------------------------------ FedEntOpt VGG-11

def test_vgg11_param_counts_and_structure():
  # FedEntOpt's VGG-11 (arXiv 2411.01240; configuration A without BN, our reading of the
  # paper's "VGG-11"). By hand: convs 1,792 + 73,856 + 295,168 +
  # 590,080 + 1,180,160 + 3 * 2,359,808 = 9,220,480; hidden Dense 2 * (512 * 512 + 512) =
  # 525,312; final Dense 512 * C + C: 5,130 (C = 10) -> 9,750,922, 10,260 (C = 20) -> 9,756,052.
  for classes, count in ((10, 9_750_922), (20, 9_756_052)):
    model, v = _shapes('vgg11', num_classes=classes)
    assert isinstance(model, VGG) and not model.batch_norm
    assert count_params(v) == (count, count)  # no BN statistics
  model, v = _shapes('vgg11')
  assert set(v) == {'params'}
  convs = [k for k in v['params'] if k.startswith('Conv_')]
  assert len(convs) == 8 and all(set(v['params'][k]) == {'kernel', 'bias'} for k in convs)
  assert not any(k.startswith('BatchNorm') for k in v['params'])
  assert [v['params'][f'Dense_{i}']['kernel'].shape for i in range(3)] == [
      (512, 512), (512, 512), (512, 10)]
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  assert jax.eval_shape(lambda v, x: model.apply(v, x, embed=True), v, x).shape == (2, 512)
  assert jax.eval_shape(model.apply, v, x).shape == (2, 10)
  half = count_params(_shapes('vgg11@0.5')[1])[0]
  assert 0.2 * 9_750_922 < half < 0.3 * 9_750_922
  assert count_params(_shapes('vgg11@0.001')[1])[0] > 0
  # The VGG-16 defaults are untouched.
  assert vgg.vgg16(10).batch_norm and vgg.vgg16(10).hidden == ()


def test_vgg11_registry_and_small_inputs():
  assert 'vgg11' in registry.available() and registry.parse_spec('VGG11@0.5') == ('vgg11', 0.5)
  for shape in [(32, 32, 3), (28, 28), (8, 8, 1), (1, 1, 3)]:
    model, v = _shapes('vgg11@0.125', num_classes=20, input_shape=shape)
    assert isinstance(model, VGG) and model.width == 0.125
    out = jax.eval_shape(lambda v, x: model.apply(v, x), v,
                         jax.ShapeDtypeStruct((2,) + shape, jnp.float32))
    assert out.shape == (2, 20), shape
  with pytest.raises(registry.ParamError, match='^spec='):
    get_model('vgg11', num_classes=10, input_shape=(40,))


@pytest.mark.slow
def test_vgg11_dropout_embed_and_mask():
  shape = (8, 8, 3)
  model = get_model('vgg11@0.125', num_classes=7, input_shape=shape, lowering='xla')
  v = _random_variables(model, shape)
  x = jax.random.normal(jax.random.PRNGKey(1), (4,) + shape)
  apply = jax.jit(lambda x, key, train, embed, mask: model.apply(
      v, x, train=train, embed=embed, mask=mask, rngs={'dropout': key}),
                  static_argnums=(2, 3))
  k1, k2 = jax.random.PRNGKey(5), jax.random.PRNGKey(6)
  ones = jnp.ones(4)
  # train=True: dropout from the 'dropout' rng, the same key gives the same output.
  assert not np.allclose(apply(x, k1, True, False, ones), apply(x, k2, True, False, ones))
  np.testing.assert_array_equal(apply(x, k1, True, False, ones), apply(x, k1, True, False, ones))
  # train=False: deterministic, no rng needed; the mask is accepted and ignored (no BN).
  eval_logits = apply(x, k1, False, False, ones)
  np.testing.assert_array_equal(eval_logits, apply(x, k2, False, False, jnp.zeros(4)))
  np.testing.assert_allclose(eval_logits, model.apply(v, x), rtol=1e-6, atol=1e-6)
  # embed: the output of the second hidden ReLU, the input of the final Dense layer.
  dense = v['params']['Dense_2']
  for train in (False, True):
    feats = apply(x, k1, train, True, ones)
    assert feats.shape == (4, 64) and bool(jnp.all(feats >= 0))
    logits = apply(x, k1, train, False, ones)
    np.testing.assert_allclose(logits, feats @ dense['kernel'] + dense['bias'], rtol=1e-4,
                               atol=1e-4 * float(jnp.abs(logits).max()))
