"""LEAF's FEMNIST and Shakespeare from JSON files in LEAF's layout, generated here, end to end."""

import json

import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.config import presets
from fedjax_kd.data import leaf, sources
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.running import experiment
from tests.conftest import shipped_config

WRITERS = {'f0003_41': 30, 'f0001_07': 24, 'f0002_12': 36, 'f0004_99': 18, 'f0000_03': 27}
SPEAKERS = {'THE_TEMPEST_PROSPERO': 40, 'HAMLET_HAMLET': 34, 'KING_LEAR_FOOL': 26}
LINE = 'to be, or not to be: that is the question* whether tis nobler in the mind to suffer '


def femnist_fixture(root, seed=0):
  """5 writers, 4 of the 62 classes; a class is a prototype plus noise, in steps of 1/255."""
  rng = np.random.default_rng(seed)
  protos = rng.integers(0, 256, (4, 784))

  def rows(n, writer):
    y = (np.arange(n) + writer) % 4
    noise = rng.integers(-20, 21, (n, 784))
    x = np.clip(protos[y] + noise, 0, 255) / 255.0
    return x.tolist(), (y * 10).tolist()      # classes 0, 10, 20, 30 of 62

  for split, scale in (('train', 1.0), ('test', 0.25)):
    users = {u: rows(max(int(n * scale), 2), i) for i, (u, n) in enumerate(WRITERS.items())}
    names = list(users)
    # LEAF writes several files per split; users are split over two here.
    leaf.write_split(str(root / split / f'all_data_0_niid_0_keep_0_{split}_9.json'),
                     {u: users[u] for u in names[:3]})
    leaf.write_split(str(root / split / f'all_data_1_niid_0_keep_0_{split}_9.json'),
                     {u: users[u] for u in names[3:]})
  return root


def shakespeare_fixture(root):
  """3 speakers; each line is 80 characters of a repeated verse and y the next one."""
  text = LINE * 8       # '*' is outside LEAF's alphabet

  def rows(n, offset):
    xs = [text[i:i + 80] for i in range(offset, offset + n)]
    ys = [text[i + 80] for i in range(offset, offset + n)]
    return xs, ys

  for split, scale in (('train', 1.0), ('test', 0.25)):
    users = {u: rows(max(int(n * scale), 2), 7 * i) for i, (u, n) in enumerate(SPEAKERS.items())}
    leaf.write_split(str(root / split / f'all_data_niid_2_keep_0_{split}_8.json'), users)
  return root


def test_femnist_loads_writers_as_clients(tmp_path):
  root = femnist_fixture(tmp_path / 'femnist')
  d = sources.load_source(f'femnist:{root}')
  assert d.num_classes == 62 and d.declared_classes
  assert d.x_train.dtype == np.uint8 and d.x_train.shape == (135, 28, 28, 1)
  # Users in sorted name order: f0000_03 (27 rows) is client 0, f0004_99 (18) client 4.
  np.testing.assert_array_equal(np.bincount(d.client_ids), [27, 24, 36, 30, 18])
  assert set(np.unique(d.y_train)) == {0, 10, 20, 30}
  # The pixels are LEAF's floats times 255, exactly.
  blob = json.loads((root / 'train' / 'all_data_0_niid_0_keep_0_train_9.json').read_text())
  first = np.asarray(blob['user_data']['f0001_07']['x'][0])
  row = int(np.flatnonzero(d.client_ids == 1)[0])
  np.testing.assert_array_equal(d.x_train[row].reshape(-1), np.rint(first * 255))


def test_shakespeare_characters_and_oov(tmp_path):
  root = shakespeare_fixture(tmp_path / 'shakespeare')
  d = sources.load_source(f'shakespeare:{root}')
  assert (d.num_classes, d.vocab_size, d.bytes_per_sample) == (81, 81, 80.0)
  assert d.x_train.dtype == np.int32 and d.x_train.shape == (100, 80)
  assert leaf.char_ids('to $\n') == [leaf.LETTERS.index('t'), leaf.LETTERS.index('o'), 1, 80, 0]
  np.testing.assert_array_equal(np.bincount(d.client_ids), [34, 26, 40])
  # Row 0 is HAMLET_HAMLET's first line (the sorted first speaker; its lines start at 7).
  assert d.x_train[0].tolist() == leaf.char_ids((LINE * 2)[7:87])
  assert (d.x_train == 80).sum(1).min() == 1     # every line holds one '*': the OOV id


def test_leaf_errors(tmp_path):
  with pytest.raises(DataError, match='train is missing'):
    sources.load_source(f'femnist:{tmp_path}')
  (tmp_path / 'train').mkdir()
  (tmp_path / 'train' / 'x.json').write_text('{"users": [')
  with pytest.raises(DataError, match=r'x\.json: not a LEAF JSON file'):
    sources.load_source(f'femnist:{tmp_path}')
  leaf.write_split(str(tmp_path / 'train' / 'x.json'), {'u': ([[0.5] * 10], [3])})
  (tmp_path / 'test').mkdir()
  leaf.write_split(str(tmp_path / 'test' / 'x.json'), {'u': ([[0.5] * 10], [3])})
  with pytest.raises(DataError, match='784 pixel values'):
    sources.load_source(f'femnist:{tmp_path}')
  with pytest.raises(DataError, match='x must be strings'):
    sources.load_source(f'shakespeare:{tmp_path}')


@pytest.mark.slow
def test_femnist_runs_end_to_end_with_writers_as_clients(tmp_path):
  root = femnist_fixture(tmp_path / 'femnist')
  c = presets.leaf('femnist', str(root), num_clients=5)
  c.rounds = 2
  c.data.num_public = 30
  c.distill.public_per_round = 30
  c.clients.models = ['leaf_cnn@0.125']
  c.server.model = 'leaf_cnn@0.125'
  c.train.learning_rate = c.distill.learning_rate = 0.1
  spec = config_lib.validate(c)
  exp = experiment.build(spec)
  sizes = exp.ctx.fed.data.client_n
  assert len(sizes) == 5 and sizes.sum() == 135 - 30
  summary = runner.run(spec, str(tmp_path / 'run'), progress=False)
  rows = [json.loads(r) for r in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in rows] == [1, 2]
  assert rows[1]['train_loss'] < rows[0]['train_loss']
  assert 0.0 <= summary['final_acc'] <= 1.0

  c.clients.num_clients = 6
  with pytest.raises(ConfigError, match='clients.num_clients.*5, the number of distinct'):
    experiment.build(config_lib.validate(c))


@pytest.mark.slow
def test_shakespeare_runs_end_to_end_with_speakers_as_clients(tmp_path):
  root = shakespeare_fixture(tmp_path / 'shakespeare')
  c = presets.leaf('shakespeare', str(root), num_clients=3, algorithm='fedavg')
  c.rounds = 2
  c.data.num_public = 10
  c.clients.models = ['char_lstm@0.125']
  c.server.model = 'char_lstm@0.125'
  spec = config_lib.validate(c)
  summary = runner.run(spec, str(tmp_path / 'run'), progress=False)
  rows = [json.loads(r) for r in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in rows] == [1, 2] and rows[1]['train_loss'] < rows[0]['train_loss']
  # FedAvg's bytes: 3 uploads + 1 broadcast of every number of the char-LSTM at width 1/8
  # (embedding 8 -> 1, LSTMs 256 -> 32).
  params = 81 * 1 + 4 * (1 * 32 + 32 * 32 + 32) + 4 * (2 * 32 * 32 + 32) + 32 * 81 + 81
  assert rows[0]['round_bytes'] == 4 * params * 4
  assert 0.0 <= summary['final_acc'] <= 1.0


def test_shipped_configs_count_the_users(tmp_path):
  root = femnist_fixture(tmp_path / 'femnist')
  c = config_lib.validate(shipped_config('leaf_femnist').get_config(str(root)))
  assert (c.clients.num_clients, c.algorithm, c.data.source) == (5, 'dsfl', f'femnist:{root}')
  assert c.data.partition == 'natural' and set(c.clients.models) == {'leaf_cnn@1'}
  root = shakespeare_fixture(tmp_path / 'shakespeare')
  c = config_lib.validate(shipped_config('leaf_shakespeare').get_config(f'{root},fedavg'))
  assert (c.clients.num_clients, c.algorithm) == (3, 'fedavg') and set(c.clients.models) == {
      'char_lstm@1'}
  assert leaf.count_users(str(tmp_path / 'femnist')) == 5
