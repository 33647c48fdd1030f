"""benchmarks/gpu_suite.py: its work accounting by hand, and a tiny run on the CPU."""

import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))

import gpu_suite  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_round_examples_by_hand():
  # FedAvg: 2 clients x 500 examples x 5 epochs, 3 passes each.
  assert gpu_suite.round_examples('fedavg', [500, 500], 5) == 3 * 5 * 1000
  # DS-FL: 2 x 200 private x 5 epochs x 3, + per client 1,000 predictions + 3 x 5 x 1,000
  # distillation, + the server's 3 x 5 x 1,000.
  assert gpu_suite.round_examples('dsfl', [200, 200], 5, public=1000, distill_epochs=5,
                                  server=True) == 6000 + 2 * 16000 + 15000


@pytest.mark.slow
def test_forward_flops_of_the_blazefl_cnn():
  # conv5x5(32) on 32x32x3 VALID: 28*28*32*75*2; conv5x5(64) on 14x14x32: 10*10*64*800*2;
  # Dense 1600->512 and 512->10: 2*(1600*512 + 512*10). Elementwise ops add well under 5%.
  hand = 28 * 28 * 32 * 75 * 2 + 10 * 10 * 64 * 800 * 2 + 2 * (1600 * 512 + 512 * 10)
  got = gpu_suite.forward_flops('blazefl_cnn', 10, (32, 32, 3))
  assert hand <= got <= 1.05 * hand


def test_peaks():
  assert gpu_suite.peak_tflops('NVIDIA H100 80GB HBM3')['tf32'] == pytest.approx(494.7)
  assert gpu_suite.peak_tflops('cpu') == {}


@pytest.mark.slow
def test_tiny_suite_runs_on_cpu(tmp_path, capsys):
  out = tmp_path / 'suite.json'
  args = ['--tiny', '--workload=blazefl', '--repeats=1', '--rounds=1', f'--out={out}']
  has_torch = importlib.util.find_spec('torch') is not None
  if not has_torch:
    args.append('--no_torch')
  assert gpu_suite.main(args) == 0
  (row,) = json.loads(out.read_text())
  assert row['workload'] == 'blazefl' and row['clients'] == 2
  # The row's rate is its work over its round time.
  assert row['round_tflop'] > 0 and row['fedjax_round_s'] > 0
  assert row['fedjax_tflops'] == pytest.approx(row['round_tflop'] / row['fedjax_round_s'])
  assert (row['ratio'] is not None) == has_torch
  assert '| blazefl | 2 |' in capsys.readouterr().out


def test_bad_workload_is_one_line(capsys):
  assert gpu_suite.main(['--workload=nope', '--no_torch']) == 2
  assert 'nope' in capsys.readouterr().err
