"""benchmarks/gpu_suite.py: the chips' peaks, and a tiny run on the CPU (its work accounting is
vs_torch's: tests/test_vs_torch.py)."""

import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))

import gpu_suite  # pylint: disable=g-import-not-at-top,wrong-import-position


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
