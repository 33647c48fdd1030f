"""benchmarks/performance/vs_torch.py: the many-clients workloads' sizes, work accounting and CLI checks."""

import argparse
import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))

import vs_torch  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_many_clients_hold_100_images_where_mnist_has_them():
  assert vs_torch.many_per_client(100, 0) == 100
  assert vs_torch.many_per_client(100, 1000) == 100
  # 1,000 clients beside DS-FL's 1,000 open images: 59,000 // 1,000.
  assert vs_torch.many_per_client(1000, 1000) == 59
  assert vs_torch.many_per_client(1000, 0) == 60


def test_many_config_is_the_stated_workload(tmp_path):
  from fedjax_kd import config as config_lib
  args = argparse.Namespace(mnist='', epochs=0)
  c, desc = vs_torch.many_config('dsfl', args, str(tmp_path), k=1000, model='leaf_cnn')
  spec = config_lib.validate(c)
  assert spec.algorithm == 'dsfl' and spec.clients.num_clients == 1000
  assert spec.train.batch_size == 10 and spec.train.epochs == 1
  assert spec.distill.batch_size == 10 and spec.distill.epochs == 1
  assert spec.distill.public_per_round == 59 and c.data.num_private == 59_000
  assert spec.clients.models[0].startswith('leaf_cnn@1') and spec.server.model.startswith('leaf_cnn@1')
  assert desc.endswith('59 a client')
  c, _ = vs_torch.many_config('fedavg', args, str(tmp_path), k=100, model='dsfl_cnn')
  spec = config_lib.validate(c)
  assert spec.algorithm == 'fedavg' and c.data.num_private == 10_000


def test_round_work_by_hand():
  # FedAvg: 100 clients x 100 examples x 1 epoch, 3 passes each.
  assert vs_torch.round_examples('fedavg', [100] * 100, 1) == 30_000
  assert vs_torch.round_examples('fedavg', [500, 500], 5) == 3 * 5 * 1000
  # DS-FL: 2 x 200 private x 5 epochs x 3, + per client 1,000 predictions + 3 x 5 x 1,000
  # distillation, + the server's 3 x 5 x 1,000.
  assert vs_torch.round_examples('dsfl', [200, 200], 5, public=1000, distill_epochs=5,
                                 server=True) == 6000 + 2 * 16000 + 15000


def test_round_bytes_by_hand(monkeypatch):
  """The memory side of the roofline from known forward costs: A(B) bytes accessed by a
  forward of B examples, P parameter bytes; a training step moves 3 A(B) + 3 P."""
  from types import SimpleNamespace as NS  # pylint: disable=g-import-not-at-top
  costs = {1: 10.0, 2: 20.0}   # A(1), A(2): A(B) = 10 B (linear from these two)
  monkeypatch.setattr(vs_torch, 'forward_cost', lambda m, c, s, b=1, lowering='im2col': {
      'flops': 0.0, 'bytes': costs[b], 'param_bytes': 40.0})
  data = NS(num_classes=10, input_shape=(28, 28, 1), client_n=[200, 150])
  spec = NS(algorithm='fedavg', clients=NS(models=['m']), server=NS(model=''),
            train=NS(batch_size=100, epochs=5))
  # ceil(200/100) + ceil(150/100) = 4 steps an epoch, 5 epochs: 20 x (3 A(100) + 3 P) =
  # 20 x (3000 + 120); then reading both clients' parameters and writing the average: 3 x 40.
  assert vs_torch.round_bytes(spec, data) == 20 * 3120 + 120
  spec = NS(algorithm='dsfl', clients=NS(models=['m']), server=NS(model='m'),
            train=NS(batch_size=100, epochs=5),
            distill=NS(public_per_round=100, batch_size=50, epochs=2))
  # Training as above; each client predicts 100 open samples (A(100) = 1000 once); the 2
  # clients and the server distil ceil(100/50) x 2 = 4 steps of 3 A(50) + 3 P = 1500 + 120.
  assert vs_torch.round_bytes(spec, data) == 20 * 3120 + 2 * 1000 + 3 * 4 * 1620


@pytest.mark.slow
def test_forward_flops_of_the_blazefl_cnn():
  # conv5x5(32) on 32x32x3 VALID: 28*28*32*75*2; conv5x5(64) on 14x14x32: 10*10*64*800*2;
  # Dense 1600->512 and 512->10: 2*(1600*512 + 512*10). Elementwise ops add well under 5%.
  hand = 28 * 28 * 32 * 75 * 2 + 10 * 10 * 64 * 800 * 2 + 2 * (1600 * 512 + 512 * 10)
  got = vs_torch.forward_flops('blazefl_cnn', 10, (32, 32, 3))
  assert hand <= got <= 1.05 * hand


def test_table_shows_the_roofline_columns():
  row = {'workload': 'many_fedavg', 'clients': 100, 'model': 'dsfl_cnn@1.0', 'batch_size': 10,
         'fedjax_round_s': 2.0, 'torch_round_s': None, 'ratio': None, 'round_gflop': 260.0,
         'fedjax_gflops': 130.0, 'torch_gflops': None, 'peak_gflops_xla': 150.0,
         'peak_gflops_torch': None, 'fedjax_first_round_s': 9.0}
  line = vs_torch.table([row]).splitlines()[-1]
  assert line == ('| many_fedavg | 100 | dsfl_cnn@1.0 | 10 | 2.00 | - | - | - / - | - / - | '
                  '260.0 | 130.0 | - | 150 / - | 9.0 s |')
  # The batched PyTorch sides: their round times and fedjax_kd's speed-up over each.
  row.update({'torch_vmap_round_s': 3.0, 'torch_vmap_ratio': 1.5,
              'torch_vmap_compiled_round_s': 2.5, 'torch_vmap_compiled_ratio': 1.25})
  line = vs_torch.table([row]).splitlines()[-1]
  assert '| 3.00 / 2.50 | 1.50x / 1.25x |' in line


def test_bad_torch_sides_are_one_line(capsys):
  assert vs_torch.main(['--workload=dsfl', '--torch_sides=loop,jit']) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: --torch_sides=') and 'vmap_compiled' in err and '\n' not in err


@pytest.mark.parametrize('flag, value, word', [
    ('--many_clients', '100,x', 'many_clients'), ('--many_clients', '0', 'many_clients'),
    ('--many_models', 'resnet20', 'resnet20')])
def test_bad_many_flags_are_one_line(capsys, flag, value, word):
  assert vs_torch.main(['--workload=many_fedavg', f'{flag}={value}']) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f'error: {flag}') and word in err and '\n' not in err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('torch') is None, reason='PyTorch not installed')
def test_tiny_many_clients_run(tmp_path, capsys):
  out = tmp_path / 'rows.json'
  assert vs_torch.main(['--workload=many_fedavg', '--many_clients=4', '--many_models=leaf_cnn',
                        '--repeats=1', '--rounds=1', '--threads=1', f'--out={out}']) == 0
  (row,) = json.loads(out.read_text())
  assert row['clients'] == 4 and row['batch_size'] == 10
  # 4 clients x 100 images x 1 epoch x 3 passes of LEAF's CNN (~34 MFLOP an image on 28x28).
  assert 4 * 100 * 3 * 33e6 / 1e9 < row['round_gflop'] < 4 * 100 * 3 * 36e6 / 1e9
  assert row['fedjax_gflops'] == pytest.approx(row['round_gflop'] / row['fedjax_round_s'])
  assert row['peak_gflops_xla'] > 0 and row['ratio'] > 0
  assert '| many_fedavg | 4 | leaf_cnn@1.0 | 10 |' in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec('torch') is None, reason='PyTorch not installed')
def test_the_batched_pytorch_side_runs_the_same_steps_as_the_loop():
  """time_torch_vmap on a tiny DS-FL round: every client's steps in one vmapped program."""
  args = argparse.Namespace(mnist='', epochs=1, clients=2)
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    cfg, _ = vs_torch.dsfl_config(args, tmp)
    out = vs_torch.time_torch_vmap(cfg, rounds=1, threads=1)
  assert out['rows_dropped'] == 0 and not out['compiled']    # 2 equal shards: nothing cut
  assert len(out['round_times_s']) == 1 and out['round_s'] > 0


def test_profile_groups_and_shares_by_hand():
  import profile_round  # pylint: disable=g-import-not-at-top
  assert profile_round.group_name('fusion.123') == 'fusion'
  assert profile_round.group_name('ynn_fusion.7.clone') == 'ynn_fusion'
  assert profile_round.group_name('while.3') == 'while'
  events = [{'ph': 'X', 'name': 'fusion.1', 'dur': 300.0}, {'ph': 'X', 'name': 'fusion.2',
                                                              'dur': 100.0},
            {'ph': 'X', 'name': 'dot.4', 'dur': 600.0},
            {'ph': 'X', 'name': 'ThunkExecutor::Execute', 'dur': 5000.0},   # a runtime span
            {'ph': 'i', 'name': 'dot.5'}]                                       # not a span
  rows = profile_round.summarize(events, top=5)
  assert [(r['op'], r['calls']) for r in rows] == [('dot', 1), ('fusion', 2)]
  assert rows[0]['share'] == pytest.approx(0.6) and rows[1]['share'] == pytest.approx(0.4)
  assert rows[1]['total_s'] == pytest.approx(400e-6) and rows[1]['mean_ms'] == pytest.approx(0.2)
