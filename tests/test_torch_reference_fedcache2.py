"""benchmarks/references/pytorch/fedcache2.py: the PyTorch FedCache 2.0 reference.

Hand-worked checks of its KRR distillation loss and its device-centric cache sampling, and
two-round runs of FedCache 2.0 and the single-client baseline on a small learnable 28x28
task (a Keras-layout npz made here, no download).
"""

import functools
import json
import math
import pathlib

import numpy as np
import pytest

from benchmarks.references.pytorch import common
from benchmarks.references.pytorch import fedcache2
from fedjax_kd import config as config_lib
from fedjax_kd import sweep
from tests.test_torch_reference import write_npz as shared_npz

torch = pytest.importorskip('torch')
torch.set_num_threads(1)

REPO = pathlib.Path(__file__).resolve().parents[1]


# A less noisy task with a larger test split than the shared default.
write_npz = functools.partial(shared_npz, n_test=600, noise=40.0)


def _config(path: str, algorithm: str = 'fedcache2', **fields):
  cfg = config_lib.load_file(str(REPO / fedcache2.CONFIG))
  return sweep.apply_overrides(cfg, [
      ('data.source', f'npz:{path}'), ('algorithm', algorithm), ('rounds', 2),
      ('clients.num_clients', 3), ('data.num_private', 600), ('train.epochs', 3),
      ('fedcache2.dd_epochs', 1), *fields.items()])


def test_krr_loss_by_hand():
  """phi_b = diag(2, 1), Y_b = I, reg 0.1: lam = 0.1 * tr(K_bb) / 2 = 0.25, so
  alpha = diag(1/4.25, 1/1.25); the target phi = (1, 1) has K_tb = (2, 1) and the
  prediction (2/4.25, 1/1.25) = (0.470588, 0.8); for y = (1, 0) the loss is
  0.5 * ((1 - 0.470588)^2 + 0.8^2) = 0.460138."""
  phi_b = torch.tensor([[2.0, 0.0], [0.0, 1.0]], requires_grad=True)
  y_b = torch.eye(2)
  phi_t = torch.tensor([[1.0, 1.0]])
  pred = fedcache2.krr_predict(phi_t, phi_b, y_b, reg=0.1)
  np.testing.assert_allclose(pred.detach().numpy(), [[2 / 4.25, 0.8]], rtol=1e-6)
  loss = fedcache2.krr_loss(phi_t, torch.tensor([[1.0, 0.0]]), phi_b, y_b, reg=0.1)
  assert loss.item() == pytest.approx(0.5 * ((1 - 2 / 4.25) ** 2 + 0.8 ** 2), rel=1e-6)
  loss.backward()   # differentiable in the synthetic features
  assert torch.isfinite(phi_b.grad).all() and phi_b.grad.abs().sum() > 0
  # Mean over targets: a second target at phi = (2.125, 0) with y = (1, 0) has K_tb =
  # (4.25, 0) and is predicted exactly, so the mean halves the loss.
  two = fedcache2.krr_loss(torch.tensor([[1.0, 1.0], [2.125, 0.0]]),
                           torch.tensor([[1.0, 0.0], [1.0, 0.0]]), phi_b.detach(), y_b, 0.1)
  assert two.item() == pytest.approx(loss.item() / 2, rel=1e-5)


def test_krr_survives_duplicate_prototypes():
  """Two identical prototypes make K_bb singular; with a 1e-12 ridge float32 Cholesky may
  fail, and the fallback ridge keeps the loss finite."""
  phi_b = torch.tensor([[1.0, 2.0], [1.0, 2.0]])
  loss = fedcache2.krr_loss(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0]]),
                            phi_b, torch.eye(2), reg=1e-12)
  # Either way the two identical supports split the prediction: (0.5, 0.5) -> loss 0.25.
  assert math.isfinite(loss.item()) and loss.item() == pytest.approx(0.25, abs=1e-3)


def _cache():
  """3 clients x 3 classes (ipc 1); |S_0| = 3, |S_1| = 2, |S_2| = 1."""
  valid = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
  return valid, torch.arange(3)


def test_sampling_repo_counts_by_hand():
  """'repo': m = min |S_c| = 1, q = 0.5 + 0.5 p = (1, 0.5, 0.5) for p = (1, 0, 0):
  n = floor(1 * q / max q) = (1, 0, 0); with p = (0.5, 0.5, 0) q = (0.75, 0.75, 0.5) and
  n = (1, 1, 0)."""
  valid, cls = _cache()
  gen = torch.Generator().manual_seed(0)
  m = fedcache2.sample_cache(valid, cls, torch.tensor([1.0, 0.0, 0.0]), 0.5, gen, mode='repo')
  assert m[:, 0].sum() == 1 and m[:, 1:].sum() == 0
  m = fedcache2.sample_cache(valid, cls, torch.tensor([0.5, 0.5, 0.0]), 0.5, gen, mode='repo')
  assert m[:, 0].sum() == 1 and m[:, 1].sum() == 1 and m[:, 2].sum() == 0
  assert not (m & ~valid).any()


def test_sampling_count_by_hand():
  """'count', tau 0.5, p = (1, 0, 0): q = (1, 0.5, 0.5), so q |S_c| = (3, 1, 0.5): all three
  class-0 items, exactly one class-1 item, and the class-2 item half of the time."""
  valid, cls = _cache()
  gen = torch.Generator().manual_seed(0)
  p = torch.tensor([1.0, 0.0, 0.0])
  got = []
  for _ in range(400):
    m = fedcache2.sample_cache(valid, cls, p, 0.5, gen)
    assert not (m & ~valid).any()
    assert m[:, 0].sum() == 3 and m[:, 1].sum() == 1
    got.append(int(m[:, 2].sum()))
  assert 0.4 < np.mean(got) < 0.6
  # tau = 1 downloads the whole cache; tau = 0 with p = (1, 0, 0) only class 0.
  assert (fedcache2.sample_cache(valid, cls, p, 1.0, gen) == valid).all()
  m0 = fedcache2.sample_cache(valid, cls, p, 0.0, gen)
  assert (m0[:, 0] == valid[:, 0]).all() and not m0[:, 1:].any()
  # exclude_own: row 0 is left out before |S_c| is counted; the cap keeps 2 items.
  m = fedcache2.sample_cache(valid, cls, p, 1.0, gen, exclude_row=0)
  assert not m[0].any() and (m[1:] == valid[1:]).all()
  assert fedcache2.sample_cache(valid, cls, p, 1.0, gen, cap=2).sum() == 2


def test_sampling_bernoulli_rate():
  """'bernoulli': each item kept with probability q_c; q = (1, 0.5, 0.5) for p = (1, 0, 0)."""
  valid, cls = _cache()
  gen = torch.Generator().manual_seed(1)
  p = torch.tensor([1.0, 0.0, 0.0])
  ms = torch.stack([fedcache2.sample_cache(valid, cls, p, 0.5, gen, mode='bernoulli')
                    for _ in range(400)]).float()
  assert (ms[:, :, 0] == valid[:, 0].float()).all()    # q_0 = 1: every class-0 item
  assert 0.4 < ms[:, :2, 1].mean() < 0.6                # q_1 = 0.5 on the two class-1 items
  assert 0.4 < ms[:, 0, 2].mean() < 0.6 and not ms[:, 1:, 2].any()


def _run(tmp_path, algorithm):
  path = write_npz(tmp_path / 'm.npz')
  setting = common.export_setting(_config(path, algorithm), fedcache2.ALGORITHMS)
  out = tmp_path / algorithm
  summary = common.run(fedcache2, setting, common.RefOptions(), 0, str(out), threads=1,
                       log=lambda *_: None)
  assert summary['rounds'] == 2
  rows = [json.loads(l) for l in (out / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in rows] == [1, 2]
  for r in rows:
    assert 0.0 <= r['test_acc'] <= 1.0 and math.isfinite(r['train_loss'])
  assert rows[-1]['test_acc'] > 0.3           # chance is about 0.1 on the noisy prototypes
  return setting, rows


def test_two_rounds(tmp_path):
  setting, rows = _run(tmp_path, 'fedcache2')
  for r in rows:
    assert math.isfinite(r['dd_loss']) and r['dd_skipped_steps'] == 0
  # Round 1 trains locally (empty cache), then every client uploads one sample per class
  # it has; round 2 downloads from that cache.
  have = sum(len(np.unique(setting.y_private[rows_k])) for rows_k in setting.client_rows)
  assert rows[0]['down_items'] == 0 and rows[0]['up_items'] == have
  assert rows[0]['cache_items'] == rows[1]['cache_items'] == have
  assert 0 < rows[1]['down_items'] <= have
  # The cache draws its own random numbers: round 1 is the single-client round exactly.
  _, single = _run(tmp_path, 'single')
  assert single[0]['test_acc'] == rows[0]['test_acc']
  assert single[0]['train_loss'] == rows[0]['train_loss']
  assert single[1]['train_loss'] != rows[1]['train_loss']


def test_unsupported_option_is_named(tmp_path):
  path = write_npz(tmp_path / 'm.npz', n_train=600, n_test=200)
  cfg = _config(path, **{'data.augment': 'flip_crop'})
  setting = common.export_setting(cfg, fedcache2.ALGORITHMS)
  with pytest.raises(ValueError, match='data.augment'):
    common.run(fedcache2, setting, common.RefOptions(), 0, str(tmp_path / 'run'), threads=1,
               log=lambda *_: None)
