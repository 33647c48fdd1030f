"""benchmarks/references/authors: the baselines run in lock-step beside their authors' code.

The lock-steps themselves are in the long tier and need PyTorch and the authors' checkouts
(``bash benchmarks/references/authors/fetch.sh DIR``, ``FEDJAX_KD_AUTHORS=DIR``): without either
they skip and say which. What needs neither (the checkout rules, the command's errors, the report's
table) is in the quick tier.
"""

import importlib
import json
import pathlib
import subprocess
import sys

import pytest

from benchmarks.references.authors import common
from benchmarks.references.authors import __main__ as cli
from benchmarks.reproduction import report

REPO = pathlib.Path(__file__).resolve().parents[1]
DRIVERS = sorted(n for n in common.REPOS
                 if (REPO / 'benchmarks' / 'references' / 'authors' / f'{n}.py').exists())


def _git_repo(path: pathlib.Path) -> str:
  path.mkdir(parents=True)
  run = lambda *a: subprocess.run(['git', '-C', str(path), *a], check=True, capture_output=True)
  run('init', '-q')
  (path / 'x.py').write_text('x = 1\n')
  run('add', 'x.py')
  run('-c', 'user.email=a@b', '-c', 'user.name=a', 'commit', '-qm', 'x')
  return subprocess.run(['git', '-C', str(path), 'rev-parse', 'HEAD'], check=True,
                        capture_output=True, text=True).stdout.strip()


def test_a_checkout_is_found_only_at_its_pinned_commit(tmp_path, monkeypatch):
  with pytest.raises(common.Unavailable, match=r'FEDJAX_KD_AUTHORS is not set: bash .*fetch.sh'):
    common.checkout('fedrs', '')
  with pytest.raises(common.Unavailable, match=r'lxcnju\+FedRepo is missing: bash .*fetch.sh'):
    common.checkout('fedrs', str(tmp_path))
  head = _git_repo(tmp_path / 'lxcnju+FedRepo')
  with pytest.raises(common.Unavailable, match=rf'is at {head[:7]}, the lock-step ran against '
                     r'617ee01: git -C .* checkout 617ee015'):
    common.checkout('fedrs', str(tmp_path))
  monkeypatch.setitem(common.REPOS, 'fedrs', common.Repo('lxcnju/FedRepo', head, ()))
  assert common.checkout('fedrs', str(tmp_path)) == str(tmp_path / 'lxcnju+FedRepo')


def test_every_baseline_has_a_lockstep_or_a_reason():
  """Fourteen baselines: a driver with its authors' repository, or a line saying why not."""
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  baselines = {'mtfl', 'knn_per', 'scdpfl', 'fedkd', 'fedcache', 'feddf', 'kt_pfl', 'pfedme',
               'perfedavg', 'fedala', 'fedrs', 'fedlc', 'fedconcat', 'kl_selection'}
  covered = set(DRIVERS) | set(common.NOT_LOCKSTEPPED)
  assert baselines <= covered, sorted(baselines - covered)
  assert set(DRIVERS) <= set(algorithms.ALGORITHMS)
  assert all(len(why) > 40 for why in common.NOT_LOCKSTEPPED.values())


def test_the_command_refuses_an_unknown_baseline_and_a_missing_folder(capsys, monkeypatch):
  assert cli.main(['--only=fedavg', '--authors=/nowhere']) == 2
  assert 'error: --only: [\'fedavg\'] have no lock-step' in capsys.readouterr().err
  monkeypatch.delenv(common.AUTHORS_ENV, raising=False)
  assert cli.main(['--only=fedrs', '--authors=']) == 2
  assert 'error: --authors: no folder of checkouts' in capsys.readouterr().err


def test_the_report_prints_the_lockstep_table(tmp_path):
  doc = {'generated': '2026-12-03', 'command': 'python -m benchmarks.references.authors', 'tolerance': 1e-4,
         'lockstep': [{'baseline': 'fedrs', 'repo': 'lxcnju/FedRepo', 'commit': '617ee01' * 6,
                       'rounds': 3, 'max_param_diff': 8.9e-8, 'max_acc_diff': 0.0,
                       'what': 'every model', 'notes': ['their scales'], 'holds': True},
                      {'baseline': 'x', 'repo': 'a/b', 'commit': 'abcdef0' * 6, 'rounds': 2,
                       'max_param_diff': 0.3, 'max_acc_diff': 0.1, 'what': 'w', 'notes': [],
                       'holds': False}],
         'not_lockstepped': {'fedlc': 'no public code'}}
  path = tmp_path / 'authors_lockstep.json'
  path.write_text(json.dumps(doc))
  lines = report.lockstep_section(str(path))
  assert ('| fedrs | [lxcnju/FedRepo](https://github.com/lxcnju/FedRepo) @ `617ee01` | 3 | '
          '8.9e-08 | 0.0000 | every model | **holds** |') in lines
  assert any(line.endswith('| **does not hold** |') and line.startswith('| x |') for line in lines)
  assert '* **fedrs**: their scales' in lines and '* **fedlc**: no public code' in lines
  assert report.lockstep_section(str(tmp_path / 'none.json')) == []


def _available(name: str) -> str:
  try:
    common.need_torch()
    return common.checkout(name)
  except common.Unavailable as e:
    pytest.skip(str(e))


@pytest.mark.slow
@pytest.mark.parametrize('name', DRIVERS)
def test_lockstep_with_the_authors_code(name):
  """Whole rounds, the same weights and minibatches: every parameter within float rounding."""
  path = _available(name)
  r = importlib.import_module(f'benchmarks.references.authors.{name}').lockstep(path)
  assert r.rounds >= 2 and len(r.param_diff) == r.rounds
  assert r.holds, (name, r.param_diff)
  assert r.acc_diff <= 0.01, (name, r.acc_ours, r.acc_theirs)


@pytest.mark.slow
def test_a_lockstep_sees_a_difference_of_the_method():
  """The paper's binary FedRS scales against the authors' proportional ones: the same data and
  weights, one formula apart, and the lock-step says so at once."""
  path = _available('fedrs')
  from benchmarks.references.authors import fedrs  # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.override(fedrs.config(2), {'fedrs.proportional': False})
  r = fedrs.lockstep(path, rounds=2, ours_run=common.ours(cfg))
  assert not r.holds and r.param_diff[0] > 100 * common.PARAM_TOL, r.param_diff


if __name__ == '__main__':
  sys.exit(pytest.main([__file__, '-m', '', '-n', '0']))
