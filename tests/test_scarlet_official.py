"""benchmarks/references/scarlet_official.py, the driver of the SCARLET authors' code: what runs here
without their checkout (which CI does not have)."""

import importlib.util
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _module():
  spec = importlib.util.spec_from_file_location(
      'scarlet_official_under_test', REPO / 'benchmarks' / 'references' / 'scarlet_official.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_child_gets_absolute_paths_for_a_relative_out(tmp_path, monkeypatch):
  """The child process runs in the run's directory: a relative run directory (from a
  relative ``--out``) handed to it as is was resolved twice and every run failed with
  ``No such file or directory: 'runs/.../official_scratch/setting.npz'``."""
  official = _module()
  monkeypatch.chdir(tmp_path)
  cmd = official.child_command('runs/x/seed1', 'checkout', 1)
  run = next(a for a in cmd if a.startswith('--_run='))
  checkout = next(a for a in cmd if a.startswith('--checkout='))
  assert run == f'--_run={tmp_path}/runs/x/seed1' and os.path.isabs(run.split('=', 1)[1])
  assert checkout == f'--checkout={tmp_path}/checkout'
  assert cmd[-1] == '--threads=1'


def test_model_flag_selects_the_matching_fedjax_kd_fields(tmp_path):
  """--model=cnn runs fedjax_kd's CPU CNN in their code: the matching fedjax_kd run sets the
  same model and PyTorch's initialisation; a config of another model is refused."""
  official = _module()
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = official.build_config(official.CONFIG, 'scarlet', 0, 2,
                              [('data.source', 'synthetic:400')], model='cnn')
  spec = config_lib.validate(cfg)
  assert spec.server.model.startswith('cnn@') and cfg.model.init == 'torch'
  official.check_spec(spec, 'cnn')
  with pytest.raises(ValueError, match='resnet20@1.0 only'):
    official.check_spec(spec, 'resnet20')
  from benchmarks.reproduction import plan as plan_lib  # pylint: disable=g-import-not-at-top
  doc = {'variants': [{'algorithm': 'scarlet',
                       'overrides': dict(official.OFFICIAL_MODELS['cnn'])}],
         'seeds': [0, 1], 'runs': [{'rounds': 10}]}
  cmd = plan_lib.official_command(doc, 'runs/x')
  assert '--model=cnn' in cmd and '--rounds=10' in cmd and '--seeds=0,1' in cmd
