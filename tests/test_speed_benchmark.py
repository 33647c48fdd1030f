"""benchmarks/performance/speed.py (BlazeFL / DS-FL rounds-per-minute benchmark) on a tiny setting."""

import json
import os
import subprocess
import sys

import pytest

from tests.test_main import REPO


@pytest.mark.slow
def test_speed_benchmark_tiny_blazefl_writes_the_json(tmp_path):
  out = tmp_path / 'speed.json'
  r = subprocess.run(
      [sys.executable, os.path.join(REPO, 'benchmarks', 'performance', 'speed.py'),
       '--workload=blazefl',
       '--small', '--num_clients=2', '--clients_per_round=1', '--rounds=1', f'--out={out}'],
      capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO),
      check=False)
  assert r.returncode == 0, r.stderr[-3000:]
  assert 'synthetic CIFAR-shaped' in r.stdout and 'rounds/min' in r.stdout
  result = json.loads(out.read_text())
  assert {'platform', 'device_kind', 'jax_version'} <= set(result['env'])
  assert result['blazefl_reference']['rounds_per_min'] == 3.7
  (row,) = result['rows']
  assert row['workload'] == 'blazefl' and row['model'] == 'blazefl_cnn@1'
  assert row['algorithm'] == 'fedavg' and row['clients_per_round'] == 1
  assert row['num_clients'] == 2 and row['batch_size'] == 50 and row['epochs'] == 5
  assert row['client_steps_per_round'] == 50      # 500 images / 50 x 5 epochs
  assert row['timed_rounds'] == 1 and len(row['round_times_s']) == 1
  assert row['compute_dtype'] == 'float32' and row['lowering'] in ('im2col', 'xla')
  assert row['full_round_extrapolated'] is True
  for key in ('compile_s', 'round_s', 'rounds_per_min', 'client_steps_per_s',
              'full_rounds_per_min', 'vs_blazefl_a100'):
    assert row[key] >= 0, key
  assert abs(row['rounds_per_min'] - 60 / row['round_s']) < 1e-6
  assert abs(row['vs_blazefl_a100'] - row['full_rounds_per_min'] / 3.7) < 1e-9
