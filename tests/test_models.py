"""Tests of the model zoo: parameter counts, the im2col convolution, pooling, masked BatchNorm,
vmapped application and the registry."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops.errors import ParamError
from fedjax_kd.models import layers, registry, resnet
from fedjax_kd.models import CNN, DSFLCNN, CifarResNet, count_params, get_model, init_variables


def _random_variables(model, input_shape, seed=0, clients=None):
  """Variables with the model's structure, filled by numpy (no init compilation: faster)."""
  shapes = jax.eval_shape(lambda k: init_variables(model, k, input_shape),
                          jax.random.PRNGKey(0))
  rng = np.random.default_rng(seed)
  lead = () if clients is None else (clients,)

  def fill(path, a):
    name = jax.tree_util.keystr(path)
    if "'var'" in name or "'scale'" in name:
      v = rng.uniform(0.5, 1.5, lead + a.shape)
    else:
      fan_in = max(1, int(np.prod(a.shape[:-1])))
      v = rng.normal(size=lead + a.shape) / np.sqrt(fan_in if len(a.shape) > 1 else 10)
    return jnp.asarray(v, jnp.float32)

  return jax.tree_util.tree_map_with_path(fill, shapes)


def _shapes(spec, num_classes, input_shape):
  model = get_model(spec, num_classes=num_classes, input_shape=input_shape)
  variables = jax.eval_shape(lambda k: init_variables(model, k, input_shape),
                             jax.random.PRNGKey(0))
  return variables, count_params(variables)


# ------------------------------------------------------------------------------ param counts

@pytest.mark.parametrize('spec,classes,shape,trainable,total', [
    ('mlp', 10, (28, 28, 1), 199_210, 199_210),
    ('cnn', 10, (28, 28, 1), 215_370, 215_370),
    ('cnn', 10, (8, 8, 1), 31_050, 31_050),
    ('dsfl_cnn', 10, (28, 28, 1), 583_242, 584_458),
    ('dsfl_fmnist_cnn', 10, (28, 28, 1), 2_760_228, 2_762_272),
    # Option-A shortcuts have no parameters: 269,722 = convs 268,336 (no bias) + BN 2 * 688
    # + Dense 650. (272,474 would need option-B 1x1 projections: +2,752.)
    ('resnet20', 10, (32, 32, 3), 269_722, 271_098),
    ('resnet32', 10, (32, 32, 3), 464_154, 466_426),
    ('lenet5', 10, (32, 32, 3), 62_006, 62_006),
    ('lenet5', 20, (32, 32, 3), 62_856, 62_856),
    # FedCache 2.0 (arXiv 2405.13378) Table XIV, K = 1024: 171.0K, 265.9K, 360.8K, 455.8K.
    # 1x1-conv shortcuts without BN on the two stride-2 blocks: 16*32 + 32*64 = 2,560 weights.
    ('resnet_t', 10, (32, 32, 3), 175_066, 175_994),
    ('resnet_s', 10, (32, 32, 3), 272_282, 273_658),
    ('resnet_m', 10, (32, 32, 3), 369_498, 371_322),
    ('resnet_l', 10, (32, 32, 3), 466_714, 468_986),
    ('fcn', 10, (40,), 154_890, 154_890),  # FCN-U, 151.3K
    ('fcn', 5, (65,), 166_405, 166_405),  # FCN-T, 162.5K
])
def test_param_counts(spec, classes, shape, trainable, total):
  variables, counts = _shapes(spec, classes, shape)
  assert counts == (trainable, total)
  assert ('batch_stats' in variables) == (total != trainable)


def test_width_multiplier_counts():
  # cnn@0.5: conv 8 (208) + conv 16 (3,216) + dense 784->64 (50,240) + dense 64->10 (650).
  assert _shapes('cnn@0.5', 10, (28, 28, 1))[1] == (54_314, 54_314)
  # mlp@0.5: 784*100+100 + 100*100+100 + 100*10+10.
  assert _shapes('mlp@0.5', 10, (28, 28, 1))[1] == (89_610, 89_610)
  assert _shapes('mlp@1', 10, (28, 28, 1))[1] == _shapes('mlp', 10, (28, 28, 1))[1]
  big = _shapes('resnet20@2', 10, (32, 32, 3))[1][0]
  assert 4 * 269_722 * 0.95 < big < 4 * 269_722  # convs scale ~ width^2
  assert _shapes('dsfl_cnn@0.01', 10, (28, 28, 1))[1][0] > 0  # every size at least 1


# ------------------------------------------------------------------------------ convolution

CONV_CASES = [
    # (x shape, kernel hw, strides, padding)
    ((2, 9, 7, 3), (3, 3), 1, 'SAME'),
    ((2, 9, 7, 3), (5, 5), 2, 'SAME'),
    ((3, 10, 11, 2), (3, 2), (2, 1), 'VALID'),
    ((2, 8, 8, 4), (3, 3), 2, 1),
    ((2, 8, 9, 3), (4, 4), 2, 'SAME'),
    ((2, 6, 6, 3), (1, 1), 1, 'VALID'),
    ((2, 7, 7, 2), (3, 3), 3, ((1, 2), (0, 1))),
    ((2, 8, 8, 4), (1, 1), 2, 0),  # the 'conv' shortcut of the FedCache 2.0 ResNets
]


@pytest.mark.parametrize('shape,khw,strides,padding', CONV_CASES)
@pytest.mark.slow
def test_conv_im2col_matches_xla(shape, khw, strides, padding):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=shape), jnp.float32)
  w = jnp.asarray(rng.normal(size=khw + (shape[-1], 5)), jnp.float32)
  ref = lambda x, w: layers.conv_xla(x, w, strides, padding)
  got = lambda x, w: layers.conv_im2col(x, w, strides, padding)

  @jax.jit
  def both(x, w, g):
    out = []
    for f in (got, ref):
      y, vjp = jax.vjp(f, x, w)
      out.append((y,) + vjp(g))
    return out

  y_shape = jax.eval_shape(ref, x, w).shape
  g = jnp.asarray(rng.normal(size=y_shape), jnp.float32)
  mine, theirs = both(x, w, g)
  assert mine[0].shape == y_shape
  for a, b in zip(mine, theirs):  # y, dx, dw
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)


def test_conv_padding_matches_lax_same():
  for n, k, s in [(28, 5, 1), (32, 3, 2), (9, 4, 2), (7, 3, 3)]:
    pads = layers.resolve_padding('SAME', (n, n), (k, k), (s, s))
    assert list(pads) == jax.lax.padtype_to_pads((n, n), (k, k), (s, s), 'SAME')


def test_conv_chunked_and_vmapped(monkeypatch):
  # Tiny chunks: several chunks per batch and a padded last chunk (7 examples, 3 per chunk).
  monkeypatch.setitem(layers.IM2COL_CONFIG, 'chunk_bytes', 3 * 6 * 6 * 9 * 2 * 4)
  rng = np.random.default_rng(1)
  xs = jnp.asarray(rng.normal(size=(3, 7, 6, 6, 2)), jnp.float32)
  ws = jnp.asarray(rng.normal(size=(3, 3, 3, 2, 4)), jnp.float32)
  gs = jnp.asarray(rng.normal(size=(3, 7, 3, 3, 4)), jnp.float32)
  conv = lambda f: (lambda x, w: f(x, w, 2, 'SAME'))

  def vjp(f, x, w, g):
    y, back = jax.vjp(conv(f), x, w)
    return (y,) + back(g)

  vm = jax.jit(jax.vmap(lambda x, w, g: vjp(layers.conv_im2col, x, w, g)))(xs, ws, gs)
  for k in range(3):
    ref = vjp(layers.conv_xla, xs[k], ws[k], gs[k])
    for a, b in zip(vm, ref):
      np.testing.assert_allclose(a[k], b, rtol=1e-5, atol=2e-5)
  # Only the kernel batched (same data, K models), and only the data batched.
  y_w = jax.vmap(conv(layers.conv_im2col), (None, 0))(xs[0], ws)
  y_x = jax.vmap(conv(layers.conv_im2col), (0, None))(xs, ws[0])
  dw_x = jax.vmap(jax.grad(lambda x, w: jnp.sum(conv(layers.conv_im2col)(x, w) ** 2), 1),
                  (0, None))(xs, ws[0])
  for k in range(3):
    np.testing.assert_allclose(y_w[k], layers.conv_xla(xs[0], ws[k], 2), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(y_x[k], layers.conv_xla(xs[k], ws[0], 2), rtol=1e-5, atol=2e-5)
    ref = jax.grad(lambda w: jnp.sum(layers.conv_xla(xs[k], w, 2) ** 2))(ws[0])
    np.testing.assert_allclose(dw_x[k], ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('lowering', ['im2col', 'xla'])
@pytest.mark.slow
def test_conv_module_matches_flax(lowering):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 10, 10, 3))  # two leading batch dims
  for kw in [dict(kernel_size=(3, 3), strides=2, padding='SAME'),
             dict(kernel_size=(5, 5), padding='VALID', use_bias=False)]:
    ref = nn.Conv(4, **kw)
    mine = layers.Conv(4, lowering=lowering, **kw)
    v = ref.init(jax.random.PRNGKey(1), x)
    v_mine = mine.init(jax.random.PRNGKey(1), x)
    assert jax.tree.map(jnp.shape, v) == jax.tree.map(jnp.shape, v_mine)
    np.testing.assert_allclose(mine.apply(v, x), ref.apply(v, x), rtol=1e-5, atol=1e-5)


def test_conv_bad_config():
  with pytest.raises(ParamError, match='lowering'):
    layers.Conv(4, 3, lowering='fast').init(jax.random.PRNGKey(0), jnp.zeros((1, 5, 5, 1)))
  with pytest.raises(ParamError, match='padding'):
    layers.resolve_padding('CIRCULAR', (5, 5), (3, 3), (1, 1))


# ------------------------------------------------------------------------------ pooling

def test_max_pool2_matches_flax():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 7, 6, 3))  # odd height is cropped
  ref = lambda x: nn.max_pool(x, (2, 2), (2, 2))
  np.testing.assert_array_equal(layers.max_pool2(x), ref(x))
  g = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 3, 3))
  a, b = jax.jit(lambda x, g: [jax.vjp(f, x)[1](g)[0] for f in (layers.max_pool2, ref)])(x, g)
  np.testing.assert_allclose(a, b)
  # Ties: exactly one element per window receives the gradient.
  z = jnp.zeros((1, 4, 4, 1))
  dz = jax.grad(lambda z: layers.max_pool2(z).sum())(z)
  assert float(dz.sum()) == 4.0 and float(dz.max()) == 1.0


# ------------------------------------------------------------------------------ BatchNorm

def test_batchnorm_matches_flax_with_mask():
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 4, 4, 3)) * 2 + 1
  mask = jnp.array([1, 1, 0, 1, 0, 1], jnp.float32)
  ref = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5,
                     use_fast_variance=False)
  mine = layers.BatchNorm(momentum=0.9, epsilon=1e-5)
  v = ref.init(jax.random.PRNGKey(0), x)
  y_ref, s_ref = ref.apply(v, x, mask=layers.expand_mask(mask, x), mutable=['batch_stats'])
  y, s = mine.apply(v, x, train=True, mask=mask, mutable=['batch_stats'])
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  for k in ('mean', 'var'):
    np.testing.assert_allclose(s['batch_stats'][k], s_ref['batch_stats'][k], rtol=1e-5,
                               atol=1e-6)
  # No valid row: finite output, running statistics unchanged.
  y0, s0 = mine.apply(v, x, train=True, mask=jnp.zeros(6), mutable=['batch_stats'])
  assert bool(jnp.all(jnp.isfinite(y0)))
  for k in ('mean', 'var'):
    np.testing.assert_array_equal(s0['batch_stats'][k], v['batch_stats'][k])


@pytest.mark.parametrize('masked', [False, True])
def test_batchnorm_gradient_equals_autodiff_of_flax(masked):
  # The fused backward of layers.BatchNorm against autodiff through flax's BatchNorm: the
  # gradients of x, scale and bias of a loss that weights every output differently, and of a
  # loss on the new running statistics too (their cotangents enter the closed form).
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 4, 4, 3)) * 2 + 1
  c = jax.random.normal(jax.random.PRNGKey(1), x.shape)
  mask = jnp.array([1, 1, 0, 1, 0, 1], jnp.float32) if masked else None
  ref = nn.BatchNorm(use_running_average=False, momentum=0.9, epsilon=1e-5,
                     use_fast_variance=False)
  mine = layers.BatchNorm(momentum=0.9, epsilon=1e-5)
  v = ref.init(jax.random.PRNGKey(0), x)
  params = {'scale': jnp.array([0.5, 1.5, -2.0]), 'bias': jnp.array([0.1, -0.2, 0.3])}

  def loss(apply_fn, x, p):
    y, s = apply_fn({'params': p, 'batch_stats': v['batch_stats']}, x)
    return jnp.sum(y * c) + 3.0 * jnp.sum(s['batch_stats']['mean']) + jnp.sum(
        s['batch_stats']['var'] ** 2)

  ref_fn = lambda vv, x: ref.apply(vv, x, mask=layers.expand_mask(mask, x),
                                   mutable=['batch_stats'])
  mine_fn = lambda vv, x: mine.apply(vv, x, train=True, mask=mask, mutable=['batch_stats'])
  g_ref = jax.grad(lambda x, p: loss(ref_fn, x, p), argnums=(0, 1))(x, params)
  g = jax.grad(lambda x, p: loss(mine_fn, x, p), argnums=(0, 1))(x, params)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  if masked:   # masked-out rows reach the loss only through their own normalized output
    assert float(jnp.abs(g[0][2]).sum()) > 0


@pytest.mark.parametrize('spec', ['dsfl_cnn@0.5', 'resnet8'])
@pytest.mark.slow
def test_bn_mask_equals_sliced_batch(spec):
  shape = (16, 16, 1)
  model = _resnet8() if spec == 'resnet8' else get_model(spec, num_classes=10,
                                                           input_shape=shape)
  v = _random_variables(model, shape)
  x = jax.random.normal(jax.random.PRNGKey(1), (6,) + shape)
  mask = jnp.array([1, 0, 1, 1, 0, 1], bool)
  idx = np.flatnonzero(np.asarray(mask))
  apply = jax.jit(lambda x, m: model.apply(v, x, train=True, mask=m, mutable=['batch_stats']))
  logits, s = apply(x, mask)
  # Garbage in the masked-out rows must not matter; float masks work too.
  x_bad = x.at[np.flatnonzero(~np.asarray(mask))].set(1e3)
  logits_bad, s_bad = apply(x_bad, mask.astype(jnp.float32))
  logits_ref, s_ref = apply(x[idx], None)
  np.testing.assert_allclose(logits[idx], logits_ref, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(logits_bad[idx], logits_ref, rtol=1e-4, atol=1e-4)
  for a, b, c in zip(jax.tree.leaves(s), jax.tree.leaves(s_ref), jax.tree.leaves(s_bad)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_models_without_bn_ignore_mask():
  for spec, shape in [('mlp', (8, 8, 1)), ('cnn@0.5', (8, 8, 1)), ('lenet5@0.5', (16, 16, 3))]:
    model = get_model(spec, num_classes=4, input_shape=shape)
    v = _random_variables(model, shape)
    assert set(v) == {'params'}
    x = jnp.ones((3,) + shape)
    out, state = jax.jit(lambda v, x, m: model.apply(v, x, train=True, mask=m,
                                                     mutable=['batch_stats']))(
                                                         v, x, jnp.array([1., 0., 1.]))
    assert out.shape == (3, 4) and not state
    np.testing.assert_allclose(out, jax.jit(model.apply)(v, x), rtol=1e-6)


# ------------------------------------------------------------------------------ vmap over clients

@pytest.mark.slow
def test_vmapped_clients_match_loop():
  shape = (16, 16, 1)
  model = get_model('dsfl_cnn@0.25', num_classes=10, input_shape=shape)
  vs = _random_variables(model, shape, clients=3)
  xs = jax.random.normal(jax.random.PRNGKey(1), (3, 5) + shape)
  ys = jnp.arange(15).reshape(3, 5) % 10
  masks = jnp.array([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 1, 1, 1, 1]], jnp.float32)

  def step(v, x, y, m):
    def loss(p):
      logits, new = model.apply({'params': p, 'batch_stats': v['batch_stats']}, x, train=True,
                                mask=m, mutable=['batch_stats'])
      ce = -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1)[:, 0]
      return jnp.sum(ce * m) / jnp.sum(m), (logits, new)
    (_, (logits, new)), g = jax.value_and_grad(loss, has_aux=True)(v['params'])
    return logits, new['batch_stats'], g, model.apply(v, x)

  batched = jax.jit(jax.vmap(step))(vs, xs, ys, masks)
  for k in range(3):
    single = jax.jit(step)(jax.tree.map(lambda a: a[k], vs), xs[k], ys[k], masks[k])
    for a, b in zip(jax.tree.leaves(batched), jax.tree.leaves(single)):
      np.testing.assert_allclose(a[k], b, rtol=1e-4, atol=1e-5)


def _resnet8(lowering='auto'):
  # ResNet-8 (one block per stage): the ResNet-20 code path (stride 2, option A) compiles fast.
  return CifarResNet(num_classes=10, blocks_per_stage=1, width=0.5, lowering=lowering)


@pytest.mark.parametrize('spec,shape', [('cnn@0.5', (8, 8, 1)), ('resnet8', (8, 8, 3))])
@pytest.mark.slow
def test_lowerings_agree(spec, shape):
  x = jax.random.normal(jax.random.PRNGKey(1), (4,) + shape)
  if spec == 'resnet8':
    m_fast, m_xla = _resnet8('im2col'), _resnet8('xla')
  else:
    m_fast = get_model(spec, num_classes=10, input_shape=shape, lowering='im2col')
    m_xla = get_model(spec, num_classes=10, input_shape=shape, lowering='xla')
  v = _random_variables(m_xla, shape)

  def loss(model, p):
    out = model.apply({**v, 'params': p}, x, train=True, mutable=['batch_stats'])[0]
    return jnp.sum(out ** 2), out

  grad = lambda m: jax.jit(jax.value_and_grad(lambda p: loss(m, p), has_aux=True))
  (_, o1), g1 = grad(m_fast)(v['params'])
  (_, o2), g2 = grad(m_xla)(v['params'])
  np.testing.assert_allclose(o1, o2, rtol=1e-4, atol=1e-4 * float(jnp.abs(o2).max()))
  # Conv biases before a BatchNorm have zero gradient up to rounding: use a global atol.
  scale = max(float(jnp.abs(b).max()) for b in jax.tree.leaves(g2))
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * scale)


# ------------------------------------------------------------------------------ registry

def _builtin():
  """The names of the built-in models."""
  return {n for n in registry.available() if registry.entry(n).builtin}


def test_parse_spec():
  assert registry.parse_spec('cnn', 'f') == ('cnn', 1.0)
  assert registry.parse_spec('resnet20@0.5', 'f') == ('resnet20', 0.5)
  assert registry.parse_spec(' LeNet5@2 ', 'f') == ('lenet5', 2.0)
  assert registry.parse_spec('ResNet_T@0.5', 'f') == ('resnet_t', 0.5)
  assert _builtin() == {'mlp', 'cnn', 'dsfl_cnn', 'dsfl_fmnist_cnn', 'resnet20',
                                  'resnet32', 'lenet5', 'resnet_t', 'resnet_s', 'resnet_m',
                                  'resnet_l', 'fcn', 'googlenet', 'vgg16', 'resnet34',
                                  'resnet50', 'vgg11', 'blazefl_cnn', 'imdb_lstm', 'text_dnn',
                                  'char_lstm', 'leaf_cnn'}


@pytest.mark.slow
def test_builtin_entries_declare_what_their_modules_are():
  # Each built-in's declared properties hold of the module its builder makes: BatchNorm
  # statistics exactly for batch_norm=True, and the smallest side it accepts.
  for name in sorted(_builtin()):
    e = registry.entry(name)
    if e.inputs == 'tokens':
      shape, dtype, vocab = (6,), jnp.int32, 9
    else:
      shape, dtype, vocab = (max(8, e.min_side),) * 2 + (1,), jnp.float32, None
    module = get_model(f'{name}@0.125', num_classes=3, input_shape=shape, vocab_size=vocab)
    v = jax.eval_shape(lambda k: init_variables(module, k, shape, dtype), jax.random.PRNGKey(0))
    assert ('batch_stats' in v) == e.batch_norm, name
    if e.inputs == 'image' and e.min_side > 1:
      small = (e.min_side - 1, e.min_side, 1)
      with pytest.raises(ParamError, match=f'at least {e.min_side}x{e.min_side} pixels'):
        get_model(name, num_classes=3, input_shape=small)


@pytest.mark.parametrize('spec', ['vgg13', 'cnn@0', 'cnn@abc', 'cnn@-1', 'cnn@nan', 'cnn@',
                                  '@1', 'cnn@inf'])
def test_registry_errors(spec):
  with pytest.raises(ParamError) as err:
    get_model(spec, num_classes=10, input_shape=(28, 28, 1), field='clients.models[2]')
  assert 'clients.models[2]' in str(err.value)
  assert err.value.param == 'clients.models[2]'
  assert 'resnet20' in str(err.value)  # names the allowed models


def test_registry_input_errors():
  with pytest.raises(ParamError, match='^spec='):
    get_model('dsfl_cnn', num_classes=10, input_shape=(12, 12, 1))
  with pytest.raises(ParamError, match='^spec='):
    get_model('lenet5', num_classes=10, input_shape=(32,))
  with pytest.raises(ParamError, match='num_classes'):
    get_model('cnn', num_classes=0, input_shape=(28, 28, 1))
  with pytest.raises(ParamError, match='input_shape'):
    get_model('mlp', num_classes=10, input_shape=(0, 3))
  get_model('dsfl_cnn', num_classes=10, input_shape=(16, 16, 1))
  get_model('resnet20', num_classes=10, input_shape=(8, 8, 1))
  get_model('cnn', num_classes=10, input_shape=(8, 8))
  # 'fcn' flattens any input, like 'mlp'; the FedCache 2.0 ResNets need images.
  get_model('fcn', num_classes=10, input_shape=(40,))
  get_model('fcn', num_classes=10, input_shape=(2, 3, 4, 5))
  with pytest.raises(ParamError, match='^spec='):
    get_model('resnet_t', num_classes=10, input_shape=(40,))


def test_cnn_on_small_inputs():
  model = CNN(num_classes=10)
  v = init_variables(model, jax.random.PRNGKey(0), (8, 8, 1))
  assert jax.jit(model.apply)(v, jnp.ones((2, 8, 8, 1))).shape == (2, 10)
  assert jax.jit(model.apply)(v, jnp.ones((2, 8, 8))).shape == (2, 10)  # [B, H, W] input
  # DS-FL's CNN comes wrapped with its PyTorch-default init (its entry declares init='torch').
  m = get_model('dsfl_cnn', num_classes=3, input_shape=(28, 28, 1))
  assert isinstance(m, layers.WithOptions) and m.init_family == 'torch'
  assert isinstance(m.model, DSFLCNN)


# ------------------------------------------------------------------------------ embeddings

def _final_dense(params):
  """The parameters of the last-created top-level Dense layer (the highest Dense_N)."""
  names = [k for k in params if k.startswith('Dense_')]
  return params[max(names, key=lambda k: int(k.split('_')[1]))]


# (spec, input shape, embedding size at that spec)
EMBED_CASES = [
    ('mlp', (8, 8, 1), 200),
    ('mlp@0.5', (8, 8, 1), 100),
    ('cnn@0.5', (8, 8, 1), 64),
    ('dsfl_cnn@0.25', (16, 16, 1), 128),
    ('dsfl_fmnist_cnn@0.25', (8, 8, 1), 48),
    ('resnet20@0.5', (8, 8, 3), 32),
    ('resnet32@0.25', (8, 8, 3), 16),
    ('lenet5@0.5', (16, 16, 3), 42),
    ('resnet_t', (8, 8, 3), 64),
    ('resnet_s', (8, 8, 3), 64),
    ('resnet_m@0.5', (8, 8, 3), 32),
    ('resnet_l', (8, 8, 3), 64),
    ('fcn', (40,), 256),
    ('fcn@0.5', (65,), 128),
    ('vgg11@0.125', (8, 8, 3), 64),  # FedEntOpt's VGG-11: dropout + hidden Dense 512 * width
    ('blazefl_cnn@0.25', (16, 16, 3), 128),
    ('leaf_cnn@0.125', (8, 8, 1), 256),
    ('text_dnn@0.25', (40,), 32),
]


def test_blazefl_cnn_param_count():
  # FedLab CNN_CIFAR10 / BlazeFL's CNN: 2,432 + 51,264 + 819,712 + 5,130 on 32x32x3.
  module = registry.get_model('blazefl_cnn', num_classes=10, input_shape=(32, 32, 3))
  shapes = jax.eval_shape(lambda: registry.init_variables(
      module, jax.random.PRNGKey(0), (32, 32, 3)))
  assert registry.count_params(shapes) == (878_538, 878_538)
  with pytest.raises(ParamError):
    registry.get_model('blazefl_cnn', num_classes=10, input_shape=(12, 12, 3))


# ACE-pFL's CIFAR networks: embed, masking and counts are tested in test_paper_models.py; the
# token models (imdb_lstm, char_lstm) in test_text.py.
PAPER_MODELS = {'googlenet', 'vgg16', 'resnet34', 'resnet50', 'imdb_lstm', 'char_lstm'}


def test_embed_cases_cover_registry():
  covered = {registry.parse_spec(spec)[0] for spec, _, _ in EMBED_CASES} | PAPER_MODELS
  assert covered == _builtin()


@pytest.mark.parametrize('spec,shape,dim', EMBED_CASES)
@pytest.mark.slow
def test_embed_is_final_dense_input(spec, shape, dim):
  classes = 7
  # XLA's convolution compiles faster than im2col (same function, see test_lowerings_agree).
  model = get_model(spec, num_classes=classes, input_shape=shape, lowering='xla')
  v = _random_variables(model, shape)
  x = jax.random.normal(jax.random.PRNGKey(1), (3,) + shape)
  mask = jnp.array([1., 0., 1.])

  @jax.jit
  def both(v, x):
    out = {}
    for train in (False, True):
      kw = dict(train=train, mask=mask, rngs={'dropout': jax.random.PRNGKey(2)})
      if train:
        kw['mutable'] = ['batch_stats']
      logits = model.apply(v, x, **kw)
      feats = model.apply(v, x, embed=True, **kw)
      if train:
        logits, feats = logits[0], feats[0]
      out[train] = (logits, feats)
    return out

  dense = _final_dense(v['params'])
  assert dense['kernel'].shape == (dim, classes)
  for train, (logits, feats) in both(v, x).items():
    assert logits.shape == (3, classes)
    assert feats.shape == (3, dim), (train, feats.shape)
    manual = feats @ dense['kernel'] + dense['bias']
    np.testing.assert_allclose(logits, manual, rtol=1e-4,
                               atol=1e-4 * float(jnp.abs(logits).max()))


def test_embed_paper_sizes():
  # Full-width embedding sizes: 64 for the ResNets, 256 for the FCN, 84 for LeNet-5, ...
  for spec, shape, dim in [('resnet_t', (32, 32, 3), 64), ('resnet_l', (32, 32, 3), 64),
                           ('resnet20', (32, 32, 3), 64), ('fcn', (40,), 256),
                           ('mlp', (28, 28, 1), 200), ('cnn', (28, 28, 1), 128),
                           ('dsfl_cnn', (28, 28, 1), 512), ('dsfl_fmnist_cnn', (28, 28, 1), 192),
                           ('lenet5', (32, 32, 3), 84)]:
    model = get_model(spec, num_classes=10, input_shape=shape)
    v = jax.eval_shape(lambda k: init_variables(model, k, shape), jax.random.PRNGKey(0))
    out = jax.eval_shape(lambda v, x: model.apply(v, x, embed=True), v,
                         jax.ShapeDtypeStruct((2,) + shape, jnp.float32))
    assert out.shape == (2, dim), spec


# ------------------------------------------------------------------------------ FCN dropout

def test_fcn_dropout():
  model = get_model('fcn', num_classes=10, input_shape=(40,))
  v = _random_variables(model, (40,))
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 40))
  apply = jax.jit(lambda x, key, train, embed: model.apply(
      v, x, train=train, embed=embed, rngs={'dropout': key}), static_argnums=(2, 3))
  k1, k2 = jax.random.PRNGKey(5), jax.random.PRNGKey(6)
  # train=True: different keys give different outputs; the same key the same output.
  assert not np.allclose(apply(x, k1, True, False), apply(x, k2, True, False))
  np.testing.assert_array_equal(apply(x, k1, True, False), apply(x, k1, True, False))
  # Dropout(0.5): about half the features are zeroed, the others scaled by 2.
  clean, dropped = apply(x, k1, False, True), apply(x, k1, True, True)
  kept = np.asarray(dropped) != 0
  assert 0.3 < kept[np.asarray(clean) != 0].mean() < 0.7
  np.testing.assert_allclose(np.asarray(dropped)[kept], 2 * np.asarray(clean)[kept], rtol=1e-5)
  # train=False: deterministic, no rng needed.
  np.testing.assert_array_equal(apply(x, k1, False, False), apply(x, k2, False, False))
  np.testing.assert_array_equal(apply(x, k1, False, False), model.apply(v, x))
  assert set(v) == {'params'}
  np.testing.assert_array_equal(model.apply(v, x, mask=jnp.zeros(4)), model.apply(v, x))


# ------------------------------------------------------------------------------ FedCache ResNets

@pytest.mark.slow
def test_conv_shortcut_block():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 16, 32))
  down = resnet.BasicBlock(64, strides=2, lowering='xla', shortcut='conv')
  v = down.init(jax.random.PRNGKey(1), x, False, None)
  # The projection is a bias-free 1x1 conv without BN: 2 BNs, 3 convs, 1x1x32x64 kernel.
  assert sorted(v['params']) == ['BatchNorm_0', 'BatchNorm_1', 'Conv_0', 'Conv_1', 'Conv_2']
  assert set(v['params']['Conv_2']) == {'kernel'}
  assert v['params']['Conv_2']['kernel'].shape == (1, 1, 32, 64)
  y = down.apply(v, x, False, None)
  assert y.shape == (2, 8, 8, 64)
  # Zero the main path's second BN scale and bias: the block is relu(conv1x1_stride2(x)).
  p = dict(v['params'])
  p['BatchNorm_1'] = jax.tree.map(jnp.zeros_like, p['BatchNorm_1'])
  y0 = down.apply({**v, 'params': p}, x, False, None)
  ref = jax.nn.relu(layers.conv_xla(x, p['Conv_2']['kernel'], 2, 0))
  np.testing.assert_allclose(y0, ref, rtol=1e-5, atol=1e-5)
  # Option A on the same shapes has no parameters in the shortcut.
  a = resnet.BasicBlock(64, strides=2, lowering='xla')
  assert sorted(a.init(jax.random.PRNGKey(1), x, False, None)['params']) == [
      'BatchNorm_0', 'BatchNorm_1', 'Conv_0', 'Conv_1']
  # Identity where the shape is unchanged: no projection.
  same = resnet.BasicBlock(32, lowering='xla', shortcut='conv')
  assert 'Conv_2' not in same.init(jax.random.PRNGKey(1), x, False, None)['params']
  with pytest.raises(ValueError, match='shortcut'):
    resnet.BasicBlock(64, shortcut='b').init(jax.random.PRNGKey(1), x, False, None)


def test_fedcache_resnet_feature_map():
  # 32x32 input -> 8x8x64 before the global pool (two stride-2 stages).
  model = get_model('resnet_t', num_classes=10, input_shape=(32, 32, 3))
  assert isinstance(model, CifarResNet) and model.shortcut == 'conv'
  assert model.blocks_per_stage == 2
  v = jax.eval_shape(lambda k: init_variables(model, k, (32, 32, 3)), jax.random.PRNGKey(0))
  x = jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)
  _, inter = jax.eval_shape(
      lambda v, x: model.apply(v, x, capture_intermediates=True, mutable=['intermediates']),
      v, x)
  last = inter['intermediates']['BasicBlock_5']['__call__'][0]
  assert last.shape == (2, 8, 8, 64)
  # The projections sit in the first blocks of stages 2 and 3 only.
  shortcuts = {k: v['params'][k]['Conv_2']['kernel'].shape for k in v['params']
               if k.startswith('BasicBlock_') and 'Conv_2' in v['params'][k]}
  assert shortcuts == {'BasicBlock_2': (1, 1, 16, 32), 'BasicBlock_4': (1, 1, 32, 64)}
  # resnet20 keeps option A.
  r20 = get_model('resnet20', num_classes=10, input_shape=(32, 32, 3))
  assert r20.shortcut == 'a'


@pytest.mark.parametrize('spec', ['resnet_t', 'resnet_l'])
@pytest.mark.slow
def test_fedcache_resnet_forward_with_mask(spec):
  shape = (8, 8, 3)
  model = get_model(spec, num_classes=10, input_shape=shape, lowering='xla')
  v = _random_variables(model, shape)
  x = jax.random.normal(jax.random.PRNGKey(1), (4,) + shape)
  mask = jnp.array([1, 1, 0, 1], jnp.float32)
  apply = jax.jit(lambda x, m: model.apply(v, x, train=True, mask=m, mutable=['batch_stats']))
  logits, state = apply(x, mask)
  assert logits.shape == (4, 10) and bool(jnp.all(jnp.isfinite(logits)))
  # Masked-out rows do not change the valid rows or the BN statistics.
  logits_bad, state_bad = apply(x.at[2].set(1e3), mask)
  idx = np.array([0, 1, 3])
  np.testing.assert_allclose(logits_bad[idx], logits[idx], rtol=1e-4, atol=1e-4)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state_bad)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert jax.jit(model.apply)(v, x).shape == (4, 10)


@pytest.mark.parametrize('spec,shape', [('cnn@0.5', (8, 8, 1)), ('resnet20@0.25', (16, 16, 3)),
                                        ('imdb_lstm@0.25', (12,))])
@pytest.mark.slow
def test_initialisation_compiled_light_gives_the_same_bits(spec, shape):
  """`registry.INIT_COMPILER_OPTIONS` compiles a model's initialisation faster and changes no
  bit of its variables (every built-in model gave the same bits when measured; level 0 does
  not: it leaves multiplies and adds uncontracted, ~5 % of an MLP's weights 1 ulp apart)."""
  tokens = len(shape) == 1
  model = get_model(spec, num_classes=10, input_shape=shape, vocab_size=50 if tokens else None)
  dtype = jnp.int32 if tokens else jnp.float32
  x = jnp.zeros((1,) + shape, dtype)
  assert registry.init_compiler_options() == registry.INIT_COMPILER_OPTIONS   # on the CPU
  for key in jax.random.split(jax.random.PRNGKey(3), 2):
    default = jax.jit(lambda k: model.init(k, x, train=False))(key)
    light = init_variables(model, key, shape, dtype)
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), default, light)
    assert jax.tree.structure(default) == jax.tree.structure(light)
    assert all(jax.tree.leaves(same)), same
