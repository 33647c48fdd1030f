"""A researcher's own model and data: models.register, ArraySource, npz client ids and the
natural partition."""

import json

import flax.linen as nn
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import models
from fedjax_kd import runner
from fedjax_kd.data import partition as partition_lib
from fedjax_kd.data import sources
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.models import layers, registry
from fedjax_kd.ops.errors import ParamError
from fedjax_kd.running import experiment


class TwoLayer(nn.Module):
  """A model of the researcher's own, following the engine's contract."""
  num_classes: int
  hidden: int

  @nn.compact
  def __call__(self, x, train=False, mask=None, embed=False):
    del train, mask
    h = nn.relu(nn.Dense(self.hidden)(x.reshape(x.shape[0], -1)))
    return h if embed else nn.Dense(self.num_classes)(h)


def build_two_layer(num_classes, width, input_shape):
  del input_shape
  return TwoLayer(num_classes=num_classes, hidden=max(1, int(round(16 * width))))


@pytest.fixture
def registered():
  models.register('two_layer', build_two_layer)
  yield
  models.unregister('two_layer')


def writers_data(num_writers=5, seed=0):
  """Per-writer data: writer w holds 30 + 6 w images of mostly two classes, 8x8 uint8."""
  rs = np.random.RandomState(seed)
  proto = rs.randint(0, 256, (10, 8, 8)).astype(np.float64)
  xs, ys, ids = [], [], []
  for w in range(num_writers):
    n = 30 + 6 * w
    y = rs.choice([2 * w % 10, (2 * w + 1) % 10], n)
    x = np.clip(proto[y] + rs.normal(0, 25, (n, 8, 8)), 0, 255).astype(np.uint8)
    xs.append(x), ys.append(y), ids.append(np.full(n, 100 + 7 * w))   # ids need not be 0..K-1
  y_test = np.arange(200) % min(10, 2 * num_writers)   # the classes the writers hold
  x_test = np.clip(proto[y_test] + rs.normal(0, 25, (200, 8, 8)), 0, 255).astype(np.uint8)
  return (np.concatenate(xs), np.concatenate(ys).astype(np.int32), x_test,
          y_test.astype(np.int32), np.concatenate(ids))


def small_config(source, num_clients, model='two_layer@1'):
  """tests.test_main's tiny DS-FL run on ``source`` with the natural partition."""
  from tests.shared import tiny_config
  c = tiny_config(rounds=2)
  c.data.source = source
  c.data.partition = 'natural'
  c.data.num_public = 40
  c.clients.num_clients = num_clients
  c.clients.models = [model]
  c.server.model = model
  c.train.batch_size = 10
  c.distill.public_per_round = 20
  c.distill.batch_size = 10
  c.log.tensorboard = False
  return c


def test_register_adds_a_model_to_every_model_field(registered):
  assert 'two_layer' in models.available()
  m = models.get_model('two_layer@0.5', num_classes=10, input_shape=(8, 8, 1))
  assert isinstance(m, TwoLayer) and m.hidden == 8
  # 8*8*8 + 8 + 8*10 + 10 parameters at width 0.5.
  import jax
  variables = models.init_variables(m, jax.random.PRNGKey(0), (8, 8, 1))
  assert models.count_params(variables) == (64 * 8 + 8 + 8 * 10 + 10,) * 2


def test_register_refuses_builtin_taken_and_bad_names(registered):
  with pytest.raises(ValueError, match='built-in'):
    models.register('cnn', build_two_layer)
  models.register('two_layer', build_two_layer)   # the same builder again: a no-op
  with pytest.raises(ValueError, match='already registered to build_two_layer'):
    models.register('two_layer', lambda num_classes, width, input_shape: None)
  with pytest.raises(ValueError, match='lower-case'):
    models.register('Two Layer', build_two_layer)
  models.register('two_layer', build_two_layer, replace=True)   # explicit replacement is fine
  with pytest.raises(ParamError, match='^spec='):
    models.get_model('three_layer', num_classes=10, input_shape=(8, 8, 1))


def test_a_builder_that_fails_is_one_config_error_naming_the_field():
  def bad(num_classes, width, input_shape):
    raise ValueError(f'needs 28x28, got {input_shape}')
  models.register('needs_mnist', bad)
  try:
    with pytest.raises(ParamError, match=r"server.model.*needs 28x28, got \(8, 8, 1\)"):
      models.get_model('needs_mnist', num_classes=10, input_shape=(8, 8, 1), field='server.model')
  finally:
    models.unregister('needs_mnist')


def test_builtin_and_registered_models_are_entries_of_one_registry(registered):
  # A built-in model is registered with the same register() and read back the same way.
  cnn = models.entry('cnn@0.5')
  assert (cnn.name, cnn.init, cnn.batch_norm, cnn.inputs, cnn.min_side, cnn.lowering,
          cnn.builtin) == ('cnn', 'module', False, 'image', 4, True, True)
  dsfl = models.entry('dsfl_cnn')
  assert (dsfl.init, dsfl.batch_norm, dsfl.min_side) == ('torch', True, 16)
  assert (models.entry('mlp').inputs, models.entry('char_lstm').inputs) == ('any', 'tokens')
  # A user model declared with register's defaults: no input check, the module's own init.
  mine = models.entry('two_layer')
  assert (mine.builder, mine.init, mine.batch_norm, mine.inputs, mine.min_side, mine.lowering,
          mine.builtin) == (build_two_layer, 'module', False, 'any', 1, False, False)
  # Built-ins stay: unregister leaves them, register refuses them even with replace=True.
  models.unregister('cnn')
  assert models.entry('cnn') == cnn and models.available()[:2] == ('mlp', 'cnn')
  with pytest.raises(ValueError, match='built-in'):
    models.register('cnn', build_two_layer, replace=True)


def test_register_properties_are_honoured_like_a_builtin_models():
  seen = {}

  def build(num_classes, width, input_shape, lowering):
    seen.update(input_shape=input_shape, lowering=lowering)
    return TwoLayer(num_classes=num_classes, hidden=4)

  def build_tokens(num_classes, width, input_shape, vocab_size):
    seen.update(vocab_size=vocab_size)
    return TwoLayer(num_classes=num_classes, hidden=4)

  models.register('my_bn_cnn', build, init='torch', batch_norm=True, inputs='image',
                  min_side=8, lowering=True)
  models.register('my_lstm', build_tokens, inputs='tokens')
  try:
    e = models.entry('my_bn_cnn')
    assert (e.init, e.batch_norm, e.inputs, e.min_side, e.lowering) == ('torch', True, 'image',
                                                                         8, True)
    assert models.available()[-2:] == ('my_bn_cnn', 'my_lstm')
    # init='torch' is the model's 'auto' family, as init='torch' of dsfl_cnn is: it comes
    # wrapped with PyTorch's initializers.
    assert registry.init_family('my_bn_cnn@2') == registry.init_family('dsfl_cnn') == 'torch'
    m = models.get_model('my_bn_cnn', num_classes=3, input_shape=(8, 8, 1), lowering='xla')
    assert isinstance(m, layers.WithOptions) and m.init_family == 'torch'
    assert isinstance(m.model, TwoLayer) and seen == {'input_shape': (8, 8, 1), 'lowering': 'xla'}
    assert not isinstance(models.get_model('my_bn_cnn', num_classes=3, input_shape=(8, 8),
                                           init='module'), layers.WithOptions)
    # The image checks of the built-in image models, with their messages.
    with pytest.raises(ParamError, match=r"^spec=.*images of at least 8x8 pixels for 'my_bn_cnn'"):
      models.get_model('my_bn_cnn', num_classes=3, input_shape=(8, 7, 1))
    with pytest.raises(ParamError, match=r"\(H, W\) or \(H, W, C\) for 'my_bn_cnn'"):
      models.get_model('my_bn_cnn', num_classes=3, input_shape=(64,))
    with pytest.raises(ParamError, match=r"\(H, W\) or \(H, W, C\) for 'lenet5'"):
      models.get_model('lenet5', num_classes=3, input_shape=(64,))
    # A token model is given the vocabulary, and refused without one like imdb_lstm.
    models.get_model('my_lstm', num_classes=3, input_shape=(6,), vocab_size=9)
    assert seen['vocab_size'] == 9
    for name in ('my_lstm', 'imdb_lstm'):
      with pytest.raises(ParamError, match=f"token ids.*for '{name}'.*without a vocabulary"):
        models.get_model(name, num_classes=3, input_shape=(6,))
    for bad, match in (({'init': 'glorot'}, 'init'), ({'inputs': 'text'}, 'inputs'),
                       ({'min_side': 0, 'inputs': 'image'}, 'min_side'),
                       ({'min_side': 4}, "inputs='image' only"), ({'batch_norm': 1}, 'batch_norm')):
      with pytest.raises(ValueError, match=match):
        models.register('my_bad', build, **bad)
    assert 'my_bad' not in models.available()
  finally:
    models.unregister('my_bn_cnn')
    models.unregister('my_lstm')
  assert 'my_bn_cnn' not in models.available()


def test_natural_partition_gives_one_client_per_id_in_id_order():
  labels = np.array([0, 1, 1, 0, 2, 2, 1])
  ids = np.array([9, 3, 9, 3, 5, 9, 5])
  part = partition_lib.natural(labels, ids, 3, num_classes=3)
  assert [p.tolist() for p in part.client_indices] == [[1, 3], [4, 6], [0, 2, 5]]
  with pytest.raises(ParamError, match=r'^num_clients=4.*3, the number of distinct'):
    partition_lib.natural(labels, ids, 4, num_classes=3)
  with pytest.raises(ParamError, match="^name='natural'"):
    partition_lib.partition('natural', labels, 3, num_classes=3, seed=0)


@pytest.mark.slow
def test_experiment_from_arrays_with_a_registered_model_and_natural_partition(
    registered, tmp_path):
  x, y, x_test, y_test, ids = writers_data()
  sources.register_source('writers', sources.ArraySource(x, y, x_test, y_test, client_ids=ids))
  try:
    spec = config_lib.validate(small_config('writers', 5))
    exp = experiment.build(spec)
    # Every model is the registered one (clients and server: one spec, one module).
    assert [type(m) for m in exp.ctx.modules.values()] == [TwoLayer]
    assert exp.ctx.modules['two_layer@1'].hidden == 16
    # The public draw takes 40 rows; the 5 writers keep the others, writer by writer.
    assert len(exp.ctx.fed.data.client_n) == 5
    assert exp.ctx.fed.data.client_n.sum() == len(y) - 40
    summary = runner.run(spec, str(tmp_path / 'run'), progress=False)
    rows = [json.loads(line) for line in open(tmp_path / 'run' / 'metrics.jsonl')]
    assert [r['round'] for r in rows] == [1, 2]
    # Each writer holds 2 of the 10 classes: its model learns them (training loss falls) and
    # answers about 2/10 of the all-class test set, above chance.
    assert rows[1]['train_loss'] < 0.8 * rows[0]['train_loss']
    assert summary['final_client_acc'] > 0.15
    cfg = json.loads((tmp_path / 'run' / 'config.json').read_text())
    assert cfg['data']['source'] == 'writers' and cfg['data']['partition'] == 'natural'
    # The wrong client count is one error naming the field, before anything trains.
    with pytest.raises(ConfigError, match='clients.num_clients'):
      experiment.build(config_lib.validate(small_config('writers', 4)))
  finally:
    sources.unregister_source('writers')


def test_natural_partition_sizes_follow_the_npz_client_id_array(tmp_path):
  x, y, x_test, y_test, ids = writers_data(num_writers=4, seed=1)
  path = tmp_path / 'writers.npz'
  np.savez(path, x_train=x, y_train=y, x_test=x_test, y_test=y_test, client_id=ids)
  ds = sources.load_source(f'npz:{path}')
  np.testing.assert_array_equal(ds.client_ids, ids)
  spec = config_lib.validate(small_config(f'npz:{path}', 4, model='mlp@0.25'))
  exp = experiment.build(spec)
  # Which rows went public is the split's business; each client holds exactly the private
  # rows of its writer, in increasing id order.
  from fedjax_kd.data import splits
  split = splits.fd_split(ds, num_public=40, num_private=None, seed=spec.seed)
  want = [int(np.sum(split.client_ids_private == w)) for w in np.unique(ids)]
  assert list(exp.ctx.fed.data.client_n) == want and sum(want) == len(y) - 40


def test_bad_client_ids_are_one_data_error(tmp_path):
  x, y, x_test, y_test, ids = writers_data(num_writers=2)
  with pytest.raises(DataError, match='client_id must be one integer per training row'):
    sources.ArraySource(x, y, x_test, y_test, client_ids=ids[:-1]).load()
  with pytest.raises(DataError, match='client_id'):
    sources.ArraySource(x, y, x_test, y_test, client_ids=ids.astype(np.float32)).load()
  with pytest.raises(ValueError, match='ArraySource'):
    sources.register_source('bad', (x, y))
  with pytest.raises(ValueError, match="not 'digits'"):
    sources.register_source('digits', sources.ArraySource(x, y, x_test, y_test))
  # A name registered again (a config file executed twice) takes the newer arrays.
  try:
    sources.register_source('twice', sources.ArraySource(x, y, x_test, y_test))
    sources.register_source('twice', sources.ArraySource(x[:50], y[:50], x_test, y_test))
    assert len(sources.load_source('twice').y_train) == 50
  finally:
    sources.unregister_source('twice')
