"""Model options (initializer families, BatchNorm momentum/epsilon) and input normalisation."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.config import spec as spec_lib
from fedjax_kd.data import augment, sources
from fedjax_kd.errors import ConfigError
from fedjax_kd.models import layers, registry
from fedjax_kd.models.registry import count_params, get_model, init_variables
from fedjax_kd.ops.errors import ParamError

SHAPE = (28, 28, 1)


def _layers(params):
  """{path: (kernel, bias)} of every Dense/Conv layer."""
  out = {}
  for name, node in params.items():
    if not hasattr(node, 'items'):
      continue
    if 'kernel' in node:
      out[name] = (np.asarray(node['kernel']), np.asarray(node.get('bias')))
    else:
      out.update({f'{name}/{k}': v for k, v in _layers(node).items()})
  return out


def test_torch_family_bounds_and_bias():
  """PyTorch's defaults: kernel and bias uniform in +-1/sqrt(fan_in), fan_in = kh*kw*Cin."""
  model = get_model('dsfl_cnn', num_classes=10, input_shape=SHAPE, init='torch')
  params = init_variables(model, jax.random.PRNGKey(0), SHAPE)['params']
  got = _layers(params)
  fan_in = {'Conv_0': 25, 'Conv_1': 25 * 32, 'Dense_0': 1024, 'Dense_1': 512}
  assert set(got) == set(fan_in)
  for name, (w, b) in got.items():
    bound = 1 / math.sqrt(fan_in[name])
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    # U(-a, a) has std a / sqrt(3).
    assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3)
    assert np.abs(b).max() <= bound and np.abs(b).max() > 0  # biases are drawn, not zero


def test_keras_family_glorot_and_zero_bias():
  model = get_model('dsfl_cnn', num_classes=10, input_shape=SHAPE, init='keras')
  got = _layers(init_variables(model, jax.random.PRNGKey(0), SHAPE)['params'])
  fans = {'Conv_0': (25, 25 * 32), 'Conv_1': (25 * 32, 25 * 64), 'Dense_0': (1024, 512),
          'Dense_1': (512, 10)}
  for name, (w, b) in got.items():
    bound = math.sqrt(6 / sum(fans[name]))
    assert bound * 0.9 < np.abs(w).max() <= bound
    np.testing.assert_array_equal(b, 0)


def test_auto_is_torch_for_dsfl_and_module_elsewhere():
  assert registry.init_family('dsfl_cnn@0.5') == 'torch'
  assert registry.init_family('dsfl_fmnist_cnn') == 'torch'
  assert registry.init_family('resnet20') == 'module'
  assert registry.init_family('resnet20', 'keras') == 'keras'
  # 'auto' on a model without an entry returns the bare module (nothing wrapped).
  assert not isinstance(get_model('cnn', num_classes=10, input_shape=SHAPE), layers.WithOptions)
  with pytest.raises(ParamError, match='^init='):
    registry.init_family('cnn', 'glorot')


@pytest.mark.slow
def test_wrapper_keeps_variable_names_and_counts():
  bare = get_model('resnet20@0.5', num_classes=10, input_shape=(8, 8, 3))
  wrapped = get_model('resnet20@0.5', num_classes=10, input_shape=(8, 8, 3), init='torch',
                      bn_momentum=0.99, bn_epsilon=1e-3)
  assert isinstance(wrapped, layers.WithOptions)
  vb = init_variables(bare, jax.random.PRNGKey(0), (8, 8, 3))
  vw = init_variables(wrapped, jax.random.PRNGKey(0), (8, 8, 3))
  assert jax.tree.structure(vb) == jax.tree.structure(vw)
  assert count_params(vb['params']) == count_params(vw['params'])
  # BatchNorm scales stay ones: only Dense/Conv layers are redrawn.
  scales = [np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(vw['params'])
            if 'scale' in jax.tree_util.keystr(p)]
  assert scales and all(np.all(s == 1) for s in scales)


@pytest.mark.parametrize('momentum,epsilon', [(None, None), (0.99, 1e-3), (0.5, 0.25)])
@pytest.mark.slow
def test_bn_options_reach_every_batchnorm(momentum, epsilon):
  """One train step from the init stats (mean 0, var 1): running = m * init + (1 - m) * batch."""
  model = get_model('dsfl_cnn@0.25', num_classes=10, input_shape=SHAPE, bn_momentum=momentum,
                    bn_epsilon=epsilon)
  v = init_variables(model, jax.random.PRNGKey(0), SHAPE)
  x = jax.random.uniform(jax.random.PRNGKey(1), (8,) + SHAPE)
  _, upd = model.apply(v, x, train=True, mutable=['batch_stats'])
  m = 0.9 if momentum is None else momentum
  # BatchNorm_0 normalises conv1's output: its batch mean, recomputed here.
  conv = layers.Conv(8, 5, padding='VALID', lowering='xla')
  h = conv.apply({'params': v['params']['Conv_0']}, x)
  np.testing.assert_allclose(upd['batch_stats']['BatchNorm_0']['mean'],
                             (1 - m) * h.mean((0, 1, 2)), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(upd['batch_stats']['BatchNorm_0']['var'],
                             m + (1 - m) * h.var((0, 1, 2)), rtol=1e-4, atol=1e-6)
  # Epsilon: inference-mode output of a BN over running stats (0, 1) is x / sqrt(1 + eps).
  eps = 1e-5 if epsilon is None else epsilon
  y = layers.WithOptions(layers.BatchNorm(), bn_epsilon=epsilon).apply(
      {'params': {'scale': jnp.ones(3), 'bias': jnp.zeros(3)},
       'batch_stats': {'mean': jnp.zeros(3), 'var': jnp.ones(3)}}, jnp.ones((2, 3)))
  np.testing.assert_allclose(y, 1 / np.sqrt(1 + eps), rtol=1e-6)


def test_model_config_fields():
  c = config_lib.default_config()
  spec = config_lib.validate(c)
  assert spec.model == spec_lib.ModelOptions('auto', None, None)
  c.model.init = 'keras'
  c.model.bn_momentum = 0.99
  c.model.bn_epsilon = 1e-3
  assert config_lib.validate(c).model == spec_lib.ModelOptions('keras', 0.99, 1e-3)
  for field, value in (('model.init', 'glorot'), ('model.bn_momentum', 1.0),
                       ('model.bn_epsilon', 0.0)):
    bad = config_lib.default_config()
    config_lib.override(bad, {field: value})
    with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
      config_lib.validate(bad)


# ---------------------------------------------------------------------------- normalisation

def test_input_stats_modes():
  x = np.random.default_rng(0).uniform(size=(50, 4, 4, 3)).astype(np.float32)
  assert sources.input_stats('unit', x) is None
  mean, std = sources.input_stats('symmetric', x)
  y = sources.normalize(np.array([[0.0, 0.5, 1.0]], np.float32), (mean, std))
  np.testing.assert_allclose(y, [[-1.0, 0.0, 1.0]])
  z = sources.normalize(x, sources.input_stats('standardize', x))
  np.testing.assert_allclose(z.reshape(-1, 3).mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(z.reshape(-1, 3).std(0), 1, atol=1e-4)
  mean, std = sources.input_stats('standardize', x, (0.5, 0.25, 0.0), (0.5, 0.5, 2.0))
  np.testing.assert_allclose(sources.normalize(np.ones((1, 3), np.float32), (mean, std)),
                             [[1.0, 1.5, 0.5]])
  with pytest.raises(ParamError, match='^mean='):
    sources.input_stats('standardize', x, (0.5,), (0.5,))


@pytest.mark.parametrize('fields,match', [
    ({'data.normalize': 'minmax'}, 'data.normalize'),
    ({'data.mean': (0.5,)}, 'data.mean'),
    ({'data.normalize': 'standardize', 'data.mean': (0.5,), 'data.std': (0.5, 0.5)}, 'data.std'),
    ({'data.normalize': 'standardize', 'data.mean': (0.5,), 'data.std': (0.0,)}, 'data.std'),
])
def test_normalize_config_errors(fields, match):
  c = config_lib.default_config()
  config_lib.override(c, fields)
  with pytest.raises(ConfigError, match=match):
    config_lib.validate(c)


@pytest.mark.parametrize('name', ['flip_crop', 'jitter_flip_gray'])
@pytest.mark.slow
def test_augment_on_normalised_inputs_commutes(name):
  """Augmenting normalised inputs == normalising augmented [0, 1] inputs (same key)."""
  x = jax.random.uniform(jax.random.PRNGKey(0), (6, 8, 8, 3))
  stats = (np.array([0.4, 0.5, 0.6], np.float32), np.array([0.2, 0.25, 0.3], np.float32))
  key = jax.random.PRNGKey(3)
  ref = sources.normalize(np.asarray(augment.get_augment(name)(key, x)), stats)
  got = augment.get_augment(name, stats)(key, jnp.asarray(sources.normalize(np.asarray(x),
                                                                            stats)))
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_presets_normalise_as_the_authors_code():
  from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
  assert presets.scarlet_paper().data.normalize == 'symmetric'
  assert presets.scarlet_cpu('digits').data.normalize == 'symmetric'
  assert presets.dsfl_paper('tfds:mnist', 'dsfl_cnn').data.normalize == 'unit'
  assert presets.fedcache2_paper().data.normalize == 'unit'
  ace = presets.acepfl_paper()
  assert ace.data.normalize == 'standardize' and len(ace.data.mean) == 3
  fe = presets.fedentopt_paper()
  assert fe.data.normalize == 'standardize' and len(fe.data.std) == 3
  for c in (ace, fe, presets.scarlet_paper()):
    assert isinstance(c, ml_collections.ConfigDict)
    config_lib.validate(c)
