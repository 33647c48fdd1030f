"""benchmarks/performance/gpu_suite.py: the chips' peaks, and a tiny run on the CPU (its work accounting is
vs_torch's: tests/test_vs_torch.py)."""

import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))

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


@pytest.mark.slow
def test_rows_from_logs_pool_the_finished_runs(tmp_path, capsys):
  # Two logs of the same workload, the second stopped before its last PyTorch run: the rows pool
  # every finished run (medians), and the work of a round is counted here, on the CPU.
  a = tmp_path / 'a.log'
  a.write_text('peak float32 matmul: xla 1.0 GFLOP/s\ndevice: NVIDIA H100 80GB HBM3\n'
               'dsfl K=2 dsfl_cnn@1.0 run 1: fedjax_kd 1.00 s/round (first 9.0 s)\n'
               'dsfl K=2 dsfl_cnn@1.0 run 1: pytorch   10.00 s/round\n')
  b = tmp_path / 'b.log'
  b.write_text('dsfl K=2 dsfl_cnn@1.0 run 1: fedjax_kd 3.00 s/round (first 9.0 s)\n'
               'dsfl K=2 dsfl_cnn@1.0 run 1: pytorch   30.00 s/round\n'
               'dsfl K=2 dsfl_cnn@1.0 run 2: fedjax_kd 2.00 s/round (first 9.0 s)\n')
  (row,) = gpu_suite.rows_from_logs([str(a), str(b)], tiny=True)
  assert row['fedjax_runs'] == [1.0, 3.0, 2.0] and row['torch_runs'] == [10.0, 30.0]
  assert row['fedjax_round_s'] == 2.0 and row['torch_round_s'] == 20.0 and row['ratio'] == 10.0
  assert row['device_kind'] == 'NVIDIA H100 80GB HBM3' and row['clients'] == 2
  assert row['fedjax_tflops'] == pytest.approx(row['round_tflop'] / 2.0)
  assert gpu_suite.main([f'--from_logs={a},{b}', '--tiny']) == 0
  assert '| dsfl | 2 | NVIDIA H100 80GB HBM3 |' in capsys.readouterr().out
  # A log that does not name the device, without --device_kind: one line naming the flag.
  assert gpu_suite.main([f'--from_logs={b}', '--tiny']) == 2
  assert '--device_kind' in capsys.readouterr().err


def test_the_memory_side_of_the_roofline():
  # 3,350 GB a round in one second is the H100's 3.35 TB/s: 100% of its bandwidth.
  row = gpu_suite._rates({'round_gflop': 1.0, 'fedjax_round_s': 1.0, 'torch_round_s': None,  # pylint: disable=protected-access
                          'round_gbytes': 3350.0}, 'NVIDIA H100 80GB HBM3')
  assert row['fedjax_tbytes_s'] == pytest.approx(3.35)
  assert row['fedjax_hbm_fraction'] == pytest.approx(1.0)
  assert gpu_suite._rates({'round_gflop': 1.0, 'fedjax_round_s': 1.0, 'torch_round_s': None,  # pylint: disable=protected-access
                           'round_gbytes': 1.0}, 'cpu')['fedjax_hbm_fraction'] is None


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_rows_from_logs_read_the_batched_pytorch_sides(tmp_path, capsys):
  """vs_torch's vmapped sides log 'pytorch vmap' and 'pytorch vmap+compile' lines: each is
  its own column (the loop's 'pytorch' stays the loop's), and the table grows two columns."""
  log = tmp_path / 'a.log'
  log.write_text('device: NVIDIA H100 80GB HBM3\n'
                 'dsfl K=2 dsfl_cnn@1.0 run 1: fedjax_kd 1.00 s/round (first 9.0 s)\n'
                 'dsfl K=2 dsfl_cnn@1.0 run 1: pytorch 10.00 s/round (first 10.0 s)\n'
                 'dsfl K=2 dsfl_cnn@1.0 run 1: pytorch vmap 2.50 s/round (first 3.0 s)\n'
                 'dsfl K=2 dsfl_cnn@1.0 run 1: pytorch vmap+compile 1.50 s/round (first 40 s)\n')
  (row,) = gpu_suite.rows_from_logs([str(log)], tiny=True)
  assert row['torch_runs'] == [10.0] and row['torch_vmap_runs'] == [2.5]
  assert row['torch_vmap_compiled_runs'] == [1.5]
  assert row['torch_vmap_ratio'] == 2.5 and row['torch_vmap_compiled_ratio'] == 1.5
  assert row['torch_vmap_compiled_rounds_per_min'] == 40.0
  line = gpu_suite.table([row]).splitlines()[-1]
  assert line.endswith('| 24.00 / 40.00 | 2.50x / 1.50x |')


@pytest.mark.slow
def test_forward_flops_count_the_convolutions():
  import vs_torch  # pylint: disable=g-import-not-at-top
  hand = 2 * (576 * 25 * 32 + 64 * 800 * 64 + 1024 * 512 + 512 * 10)
  got = vs_torch.forward_flops('dsfl_cnn', 10, (28, 28, 1))
  # The rest is BatchNorm, ReLU, pooling and biases: a few percent.
  assert hand <= got <= 1.05 * hand
