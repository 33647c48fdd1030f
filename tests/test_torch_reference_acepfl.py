"""benchmarks/references/pytorch/acepfl.py: the PyTorch ACE-pFL reference (its math by hand, a tiny run).

PyTorch is a benchmark extra: the tests skip where it is not installed. The run makes its own
28x28 data set (a Keras-layout npz), so it needs no download.
"""

import json
import math
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip('torch')

from benchmarks.references.pytorch import acepfl  # pylint: disable=g-import-not-at-top
from benchmarks.references.pytorch import common  # pylint: disable=g-import-not-at-top
from fedjax_kd import sweep  # pylint: disable=g-import-not-at-top
from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
from tests.test_torch_reference import write_npz  # pylint: disable=g-import-not-at-top

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_dynamic_temperature_by_hand():
  s = 1 / (1 + math.exp(-5))            # sigma(k2) with k2 = 5
  # r0 = 100 (the paper): stage 0, dr = 1/100: 30 + 10 sigma(0.05).
  assert acepfl.temperature(1) == pytest.approx(30 + 10 / (1 + math.exp(-0.05)))
  assert acepfl.temperature(1) == pytest.approx(35.1250, abs=1e-4)
  # r = 100: stage 1, dr = 0: 30 + 5 sigma(5) + 10 sigma(0) = 35 + 5 sigma(5).
  assert acepfl.temperature(100) == pytest.approx(35 + 5 * s)
  assert acepfl.temperature(300) == pytest.approx(49.8996, abs=1e-4)
  # r0 = 10 (the CPU preset): fedjax_kd's logged 36.2246 and 37.3106 of rounds 1-2.
  assert acepfl.temperature(1, r0=10) == pytest.approx(36.22459331201855, abs=1e-9)
  assert acepfl.temperature(2, r0=10) == pytest.approx(37.31058578630005, abs=1e-9)
  # As printed (floor(r / T0), raw dr): r = 50 is stage 1, dr = 50: 30 + 5 s + 10 sigma(250).
  assert acepfl.temperature(50, stage_div='T0', normalize_delta=False) == pytest.approx(
      30 + 5 * s + 10)
  assert acepfl.temperature(77, curve='fixed') == 30.0
  # f5: linear between f1(1) and f1(rounds).
  ts, te = acepfl.temperature(1, rounds=11), acepfl.temperature(11, rounds=11)
  assert acepfl.temperature(6, curve='f5', rounds=11) == pytest.approx((ts + te) / 2)
  temps = [acepfl.temperature(r) for r in range(1, 301)]
  assert all(b >= a for a, b in zip(temps, temps[1:]))   # the text's "continuously increase"


def test_clustering_and_eq3_weights_by_hand():
  p, q = [.5, .5, 0, 0], [0, 0, .5, .5]
  assert acepfl.label_distance(p, q, 'tv') == 1.0
  assert acepfl.label_distance(p, q, 'l1') == 2.0
  assert acepfl.label_distance(p, q, 'sorted_literal') == 0.0
  assert acepfl.label_distance(p, q, 'emd1d') == pytest.approx(0.5 + 1 + 0.5)
  assert acepfl.label_distance([.2, .8], [.6, .4]) == pytest.approx(0.4)
  labels = acepfl.kmeans_1d([0, .1, .12, .5, .55, 1, .98, .97], 3)
  np.testing.assert_array_equal(labels, [0, 0, 0, 1, 1, 2, 2, 2])
  # ids by centroid, whatever the input order; fewer distinct values than k: one cluster each.
  np.testing.assert_array_equal(acepfl.kmeans_1d([1, 0, .5, 0, 1], 3), [2, 0, 1, 0, 2])
  np.testing.assert_array_equal(acepfl.kmeans_1d([.3, .3, .9], 3), [0, 0, 1])
  # {0, 1} + {9, 10} (SSE 0.5 + 0.5) beats {0} + {1, 9, 10} (SSE 0 + 42.67).
  np.testing.assert_array_equal(acepfl.kmeans_1d([0, 1, 9, 10], 2), [0, 0, 1, 1])
  a = acepfl.eq3_weights([0, 0, 1, 2, 2, 2], [10, 30, 20, 5, 5, 30])
  np.testing.assert_allclose(a, [.2, .2, .2, .4 / 3, .4 / 3, .4 / 3])
  # equal sizes: the plain mean whatever the clusters (Eq. 3's teacher ignores them).
  np.testing.assert_allclose(acepfl.eq3_weights([0, 1, 1, 2], [7] * 4), [.25] * 4)


def test_top_k_and_loss_by_hand():
  probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
  fill = acepfl.top_k_rows(probs, 2, 'fill')
  torch.testing.assert_close(fill, torch.tensor([[.5, .3, .1, .1], [.15, .15, .3, .4]]))
  torch.testing.assert_close(acepfl.top_k_rows(probs, 2, 'rescale'),
                             torch.tensor([[.625, .375, 0, 0], [0, 0, 3 / 7, 4 / 7]]))
  torch.testing.assert_close(acepfl.top_k_rows(probs, 2, 'none'),
                             torch.tensor([[.5, .3, 0, 0], [0, 0, .3, .4]]))
  torch.testing.assert_close(acepfl.top_k_rows(probs, 4, 'fill'), probs)
  # Eq. 4 at T = 2 on zero logits (q uniform over 2 classes), label 0:
  # CE = log 2; KL([1, 0] || q) = log 2; KL(softmax([2, 0] / 2) || q); KL([.5, .5] || q) = 0.
  logits = torch.zeros(1, 2)
  teacher = torch.tensor([[1.0, 0.0]])
  best = torch.tensor([[2.0, 0.0]])
  hist = torch.tensor([[.5, .5]])
  pb = 1 / (1 + math.exp(-1))
  kl_sd = pb * math.log(pb / .5) + (1 - pb) * math.log((1 - pb) / .5)
  w = (0.4, 0.3, 0.2, 0.1)
  got = acepfl.ace_loss(logits, torch.tensor([0]), teacher, best, hist, 2.0, w)
  want = 0.4 * math.log(2) + 4 * (0.3 * math.log(2) + 0.2 * kl_sd + 0.1 * 0.0)
  assert float(got[0]) == pytest.approx(want, rel=1e-6)
  # 'single': CE + KD only (the SD / GD teachers may be absent).
  got = acepfl.ace_loss(logits, torch.tensor([0]), teacher, None, None, 2.0, (.4, .3, 0, 0))
  assert float(got[0]) == pytest.approx(0.4 * math.log(2) + 4 * 0.3 * math.log(2), rel=1e-6)
  # The printed direction KL(q || t) with a smoothed teacher: finite, about log(1 / 1e-8) / 2.
  kl = acepfl.kl_div(torch.log(torch.tensor([[.5, .5]])), teacher, 'student_teacher')
  assert 8.5 < float(kl[0]) < 9.5


def _tiny(path: str, algorithm: str = 'acepfl', **fields):
  c = presets.acepfl_cpu(f'npz:{path}', algorithm)
  return sweep.apply_overrides(c, [('rounds', 2), ('clients.num_clients', 3),
                                   ('data.num_private', 300), ('data.num_public', 60),
                                   ('distill.public_per_round', 60),
                                   ('train.batch_size', 20), ('distill.batch_size', 20),
                                   ('data.alpha', 1.0), *fields.items()])


@pytest.mark.parametrize('algorithm,fields', [
    ('acepfl', {}),
    ('acepfl', {'acepfl.aggregation': 'per_cluster', 'acepfl.renormalize': 'client',
                'acepfl.dynamic_temperature': False}),
    ('single', {})])
def test_tiny_run(tmp_path, algorithm, fields):
  path = write_npz(tmp_path / 'm.npz')
  cfg = _tiny(path, algorithm, **fields)
  setting = common.export_setting(cfg, acepfl.ALGORITHMS)
  out = common.run(acepfl, setting, common.RefOptions(), 0, str(tmp_path / 'run'),
                   threads=1, log=lambda *_: None)
  assert out['rounds'] == 2 and 'diverged' not in out
  rows = [json.loads(line) for line in open(tmp_path / 'run' / 'metrics.jsonl')]
  assert [r['round'] for r in rows] == [1, 2]
  for r in rows:
    assert 0.0 <= r['test_acc'] <= 1.0
    assert all(math.isfinite(v) for v in r.values() if isinstance(v, float))
  if algorithm == 'acepfl':
    temps = [r['temperature'] for r in rows]
    if fields:
      assert temps == [30.0, 30.0]
    else:
      assert temps == pytest.approx([36.2246, 37.3106], abs=1e-4)
    assert rows[0]['best_updates'] == 3 and 1 <= rows[0]['clusters'] <= 3
    assert 'gd_literal' in rows[1] and 'gd_literal' not in rows[0]


def test_unsupported_option_names_its_field(tmp_path):
  path = write_npz(tmp_path / 'm.npz')
  setting = common.export_setting(_tiny(path, **{'acepfl.noise': 'gaussian',
                                                 'acepfl.noise_scale': 0.1}),
                                  acepfl.ALGORITHMS)
  with pytest.raises(ValueError, match='acepfl.noise'):
    common.run(acepfl, setting, common.RefOptions(), 0, str(tmp_path / 'run'), threads=1,
               log=lambda *_: None)
