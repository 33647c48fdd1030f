"""benchmarks/references/pytorch/scarlet.py: the plain-PyTorch SCARLET and DS-FL in SCARLET's order."""

import json

import numpy as np
import pytest

from benchmarks.references.pytorch import common
from benchmarks.references.pytorch import scarlet
from fedjax_kd import sweep
from fedjax_kd.config import presets
from tests.test_torch_reference import write_npz


def test_enhanced_era_and_era_by_hand():
  torch = pytest.importorskip('torch')
  mean = torch.tensor([[0.6, 0.3, 0.1, 0.0]])
  # beta = 2: (0.36, 0.09, 0.01, 0) / 0.46; a zero stays zero.
  np.testing.assert_allclose(scarlet.enhanced_era(mean, 2.0).numpy(),
                             [[0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(scarlet.enhanced_era(mean, 1.0).numpy(), mean.numpy(), rtol=1e-6)
  # ERA at T = 0.1 on probabilities: softmax(6, 3, 1, 0).
  e = np.exp([6.0, 3.0, 1.0, 0.0])
  np.testing.assert_allclose(scarlet.era(mean, 0.1).numpy(), [e / e.sum()], rtol=1e-5)


def test_label_cache_follows_algorithm_2_by_hand():
  """D = 1: an entry cached in round t_c is reused while t - t_c <= 1; an expired entry is
  dropped and its fresh label used once; the next draw stores it again."""
  cache = scarlet.LabelCache(duration=1)
  fresh = lambda t, ids: {i: f'{i}@{t}' for i in ids}
  labels, hits = cache.merge(np.array([0, 1]), fresh(1, [0, 1]), 1)
  assert labels == ['0@1', '1@1'] and hits == 0
  assert cache.valid(1, 2) and not cache.valid(2, 2)
  labels, hits = cache.merge(np.array([1, 2]), fresh(2, [2]), 2)
  assert labels == ['1@1', '2@2'] and hits == 1
  assert not cache.valid(0, 3) and not cache.valid(1, 3) and cache.valid(2, 3)
  labels, hits = cache.merge(np.array([0, 1, 2]), fresh(3, [0, 1]), 3)
  assert labels == ['0@3', '1@3', '2@2'] and hits == 1
  assert set(cache.entries) == {2}                       # 0 and 1 expired: dropped
  labels, hits = cache.merge(np.array([0]), fresh(4, [0]), 4)
  assert labels == ['0@4'] and hits == 0 and cache.entries[0] == ('0@4', 4)


def _tiny(path, algorithm):
  cfg = presets.scarlet_cpu(f'npz:{path}', algorithm)
  return sweep.apply_overrides(cfg, [
      ('rounds', 3), ('clients.num_clients', 3), ('data.num_private', 300),
      ('data.num_public', 200), ('distill.public_per_round', 60), ('cache.duration', 1),
      ('train.epochs', 1), ('distill.epochs', 1)])


@pytest.mark.parametrize('algorithm', ['scarlet', 'dsfl'])
def test_reference_runs_and_its_hit_ratio_is_fedjax_kds(tmp_path, algorithm):
  """Three rounds on a learnable 28x28 task: finite rows, and the share of each round's draw
  served from the cache is exactly what fedjax_kd's cache computes from the same draws."""
  pytest.importorskip('torch')
  from fedjax_kd.ops import cache as cache_ops  # pylint: disable=g-import-not-at-top
  path = write_npz(tmp_path / 'm.npz')
  setting = common.export_setting(_tiny(path, algorithm), scarlet.ALGORITHMS)
  summary = common.run(scarlet, setting, common.RefOptions(), 0, str(tmp_path / 'run'),
                       threads=1, log=lambda *_: None)
  rows = [json.loads(line) for line in (tmp_path / 'run' / 'metrics.jsonl').read_text()
          .splitlines()]
  assert summary['rounds'] == 3 and [r['round'] for r in rows] == [1, 2, 3]
  for r in rows:
    assert 0 <= r['test_acc'] <= 1 and 0 <= r['client_acc'] <= 1
    assert np.isfinite(r['train_loss']) and np.isfinite(r['server_distill_loss'])
  want = []
  c = cache_ops.empty_cache(200, 10)
  for t, draw in enumerate(setting.draws, start=1):
    if algorithm == 'dsfl':        # DS-FL runs without the cache
      want.append(0.0)
      continue
    c, _, signals = cache_ops.update_global(c, draw, np.zeros((len(draw), 10), np.float32),
                                            np.ones(len(draw), bool), t, 1)
    want.append(float(np.mean(np.asarray(signals) == cache_ops.CACHED)))
  assert [r['hit_ratio'] for r in rows] == pytest.approx(want)
  assert algorithm == 'dsfl' or max(want) > 0         # the cache was hit at all


def test_a_run_in_use_is_refused_not_interleaved(tmp_path):
  """Two processes given the same reference run used to write their rows into one
  metrics.jsonl (found when a restarted sweep met the one it replaced): the run directory is
  now locked as fedjax_kd's are, and the second is refused with one line naming the holder."""
  pytest.importorskip('torch')
  from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.errors import DataError  # pylint: disable=g-import-not-at-top
  path = write_npz(tmp_path / 'm.npz')
  setting = common.export_setting(_tiny(path, 'dsfl'), scarlet.ALGORITHMS)
  run_dir = tmp_path / 'run'
  with workdir_lib.DirLock(str(run_dir)):
    with pytest.raises(DataError, match='is in use by another fedjax_kd run'):
      common.run(scarlet, setting, common.RefOptions(), 0, str(run_dir), threads=1,
                 log=lambda *_: None)
  assert not (run_dir / 'metrics.jsonl').exists()
