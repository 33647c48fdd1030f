"""benchmarks/torch_dsfl.py: the independent PyTorch DS-FL that fedjax_kd's curve is read against.

PyTorch is a benchmark extra: the tests that run it skip where it is not installed, and the
real-MNIST one where the file is absent. The setting it shares with fedjax_kd needs neither.
"""

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

from tests.conftest import mnist_path
from fedjax_kd import sweep

REPO = pathlib.Path(__file__).resolve().parents[1]


def _module():
  name = 'torch_dsfl_under_test'
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, REPO / 'benchmarks' / 'torch_dsfl.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


def test_setting_is_fixed_by_the_seed():
  """A pair of runs shares data, partition and open-set draws: all three follow the seed."""
  ref = _module()
  a = ref.export_setting(ref.build_config('configs/default.py', 0, 'era', rounds=3))
  b = ref.export_setting(ref.build_config('configs/default.py', 0, 'sa', rounds=3))
  c = ref.export_setting(ref.build_config('configs/default.py', 1, 'era', rounds=3))
  assert (a.aggregation, b.aggregation, a.temperature) == ('era', 'sa', 0.1)
  assert a.train == (2, 20, 0.1) and a.distill == (5, 50, 0.1)   # presets.digits
  rows = np.concatenate(a.client_rows)   # 30 shards of 34 (the 1,037 digits' tail is left)
  assert len(a.client_rows) == 10 and len(rows) == len(np.unique(rows)) == 1020
  for name in ('x_private', 'y_private', 'x_public', 'x_test', 'draws'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
  for ra, rb in zip(a.client_rows, b.client_rows):
    np.testing.assert_array_equal(ra, rb)
  assert any(len(ra) != len(rc) or (ra != rc).any() for ra, rc in zip(a.client_rows,
                                                                      c.client_rows))
  # o_r: 300 distinct open samples a round, a new draw every round.
  assert a.draws.shape == (3, 300) and (np.diff(a.draws, axis=1) > 0).all()
  assert a.draws.max() < len(a.x_public) and (a.draws[0] != a.draws[1]).any()


def test_torch_model_has_the_papers_parameter_count():
  pytest.importorskip('torch')
  model = _module().make_model(10)
  trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
  running = sum(b.numel() for n, b in model.named_buffers() if 'running' in n)
  assert trainable == 583_242 and trainable + running == 584_458   # DS-FL's MNIST CNN


def test_tiny_reference_run_is_a_sweep(tmp_path):
  """Two rounds on real MNIST with 4 clients: a sweep directory that aggregate reads, that
  learns, and that a rerun skips."""
  pytest.importorskip('torch')
  path = mnist_path()
  if not path.exists():
    pytest.skip(f'{path} not found')
  ref = _module()
  out = tmp_path / 'ref'
  r = ref.main([f'--mnist={path}', '--seeds=0', '--aggregations=era', '--rounds=2',
                f'--out={out}', '--set', 'clients.num_clients=4', '--set',
                'data.num_private=800', '--set', 'data.num_public=2000', '--threads=2'])
  assert r == 0
  wd = out / 'runs' / 'pytorch-ds-fl-era' / 'seed0'
  rows = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert [row['round'] for row in rows] == [1, 2]
  assert rows[-1]['test_acc'] > 0.5 and 0 <= rows[-1]['upload_acc'] <= 1
  assert json.loads((wd / 'config.json').read_text())['clients']['num_clients'] == 4
  (cell,) = sweep.aggregate(str(out))
  assert cell['variant'] == 'PyTorch DS-FL ERA' and cell['n'] == 1
  assert cell['stats']['final_acc']['mean'] == rows[-1]['test_acc']
  assert (out / 'compare.md').exists()
  before = (wd / 'metrics.jsonl').read_text()
  assert ref.main([f'--mnist={path}', '--seeds=0', '--aggregations=era', '--rounds=2',
                   f'--out={out}', '--set', 'clients.num_clients=4', '--set',
                   'data.num_private=800', '--set', 'data.num_public=2000']) == 0
  assert (wd / 'metrics.jsonl').read_text() == before      # finished: skipped


def test_bad_flags_exit_2(tmp_path, capsys):
  ref = _module()
  assert ref.main([f'--mnist={tmp_path / "none.npz"}', f'--out={tmp_path}']) == 2
  assert 'none.npz' in capsys.readouterr().err
