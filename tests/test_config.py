"""Bad input stops before any compute with one message naming the field."""

import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.running import experiment
from tests.shared import tiny_config


def tiny(**overrides):
  """The shared tiny experiment with one model everywhere and any field overridden
  (``algorithm`` included)."""
  return config_lib.override(tiny_config(**{'data.num_public': 100, 'clients.models': ['mlp@0.25'],
                                           'server.model': 'mlp@0.25'}), overrides)


@pytest.mark.parametrize('field,value,message', [
    ('algorithm', 'fedyogi', "algorithm='fedyogi'"),
    ('data.partition', 'pathological', 'data.partition'),
    ('data.alpha', 0.0, 'data.alpha'),
    ('data.alpha', -1.0, 'data.alpha'),
    ('clients.models', ['vgg@1.0'], 'clients.models'),
    ('clients.models', ['cnn@0'], 'clients.models'),
    ('server.model', 'transformer', 'server.model'),
    ('clients.participation', 1.5, 'clients.participation'),
    ('clients.assignment', '0,0,3,0', 'clients.assignment'),
    ('clients.assignment', 'random', 'clients.assignment'),
    ('dsfl.aggregation', 'median', 'dsfl.aggregation'),
    ('dsfl.temperature', 0.0, 'dsfl.temperature'),
    ('train.optimizer', 'lamb', 'train.optimizer'),
    ('train.learning_rate', -0.1, 'train.learning_rate'),
    ('train.batch_size', 0, 'train.batch_size'),
    ('rounds', 0, 'rounds'),
    ('comm.rules', 'exact', 'comm.rules'),
])
def test_validate_names_field_and_allowed(field, value, message):
  with pytest.raises(ConfigError) as e:
    config_lib.validate(tiny(**{field: value}))
  assert message in str(e.value)
  assert 'expected' in str(e.value)


def test_unknown_algorithm_lists_allowed_names():
  with pytest.raises(ConfigError, match="'dsfl', 'fedavg', 'fd', 'single'"):
    config_lib.validate(tiny(algorithm='nope'))


def test_fedavg_needs_one_architecture():
  c = tiny(algorithm='fedavg')
  c.clients.models = ['mlp@0.25', 'mlp@0.5']
  with pytest.raises(ConfigError, match='clients.models'):
    config_lib.validate(c)


@pytest.mark.parametrize('field,value,message', [
    ('data.num_public', 10_000, 'data.num_public'),        # public larger than the data
    ('data.num_private', 10_000, 'data.num_private'),
    ('clients.num_clients', 1_000, 'clients.num_clients'),    # more clients than samples
    ('data.source', 'mnist', 'data.source'),
    ('data.source', 'npz:/nonexistent/mnist.npz', '/nonexistent/mnist.npz'),
])
def test_build_rejects_impossible_data_before_training(field, value, message):
  spec = config_lib.validate(tiny(**{field: value}))
  with pytest.raises((ConfigError, DataError), match=message):
    experiment.build(spec)


def test_corrupt_npz_is_a_clear_error(tmp_path):
  bad = tmp_path / 'bad.npz'
  bad.write_bytes(b'this is not a zip file')
  spec = config_lib.validate(tiny(**{'data.source': f'npz:{bad}'}))
  with pytest.raises(DataError, match='bad.npz'):
    experiment.build(spec)


def test_model_spec_canonicalised_and_assignment():
  c = tiny()
  c.clients.models = ['mlp@0.50', 'mlp']
  spec = config_lib.validate(c)
  assert spec.clients.models == ('mlp@0.5', 'mlp@1', 'mlp@0.5', 'mlp@1')
  c.clients.assignment = '1,1,0,1'
  assert config_lib.validate(c).clients.models == ('mlp@1', 'mlp@1', 'mlp@0.5', 'mlp@1')
  c.clients.assignment = 'blocks'
  assert config_lib.validate(c).clients.models == ('mlp@0.5', 'mlp@0.5', 'mlp@1', 'mlp@1')


def test_participants_sampling():
  spec = config_lib.validate(tiny(**{'clients.num_clients': 10, 'clients.participation': 0.3}))
  masks = [experiment.participants(spec, t) for t in (1, 2, 1)]
  assert all(m.sum() == 3 for m in masks)
  np.testing.assert_array_equal(masks[0], masks[2])    # seeded by round
  full = config_lib.validate(tiny())
  assert experiment.participants(full, 5).all()
