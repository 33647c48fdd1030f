"""benchmarks/reproduction: the whole pipeline in --tiny mode, and its checks on known tables."""

import importlib.util
import json
import math
import os
import pathlib
import re
import statistics
import subprocess
import sys

import pytest

from benchmarks.reproduction import archive as archive_lib
from benchmarks.reproduction import checks as checks_lib
from benchmarks.reproduction import headline as headline_lib
from benchmarks.reproduction import plan as plan_lib
from benchmarks.reproduction import report as report_lib
from benchmarks.reproduction import sections as sections_lib
from benchmarks.reproduction import stats as stats_lib
from benchmarks.reproduction import tables as tables_lib
from fedjax_kd import sweep
from fedjax_kd.errors import DataError
from fedjax_kd.running import results

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ('-m', 'benchmarks.reproduction')
# Unoptimised XLA code compiles several times faster; the --tiny runs are 2-round toys.
FAST_XLA = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'


def _script(*args):
  env = dict(os.environ)
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' ' + FAST_XLA).strip()
  return subprocess.run([sys.executable, *SCRIPT, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


def _cell(label, values, grid=None, key='final_acc', thresholds=(), reached=None, **stats):
  """An aggregated cell with per-seed values of one statistic (plus others)."""
  st = {key: results.stat(dict(enumerate(values)))}
  st.update({k: results.stat(dict(enumerate(v))) for k, v in stats.items()})
  return {'variant': label, 'cell': dict(grid or {}), 'n': len(values), 'planned': len(values),
          'stats': st, 'thresholds': list(thresholds), 'reached': reached or {}}


def test_directional_test_on_known_numbers():
  # d = .01 .02 0 .015 .01: mean .011, sample std sqrt(220e-6 / 4) = .00742, SE .00332,
  # t = 3.317 with 4 df: one-sided p = .0147; t(.95, 4) = 2.132 gives the 90% CI +-.00707.
  holds, text = stats_lib.directional({0: .01, 1: .02, 2: 0.0, 3: .015, 4: .01})
  assert holds is True
  assert text == ('+0.011 ± 0.007 (n=5; SE 0.003; 90% CI [+0.004, +0.018]); one-sided paired '
                  't-test, H0: d ≤ 0: p = 0.015')
  # The same five seeds against a non-inferiority margin of 1 point: t = (.011 + .01) / SE.
  assert stats_lib.directional({0: .01, 1: .02, 2: 0.0, 3: .015, 4: .01}, margin=-0.01)[0] is True
  # A positive mean that the seeds do not show at p < .05 does not hold (n = 5 decides) ...
  holds, text = stats_lib.directional({0: .01, 1: -.02, 2: 0.0, 3: .015, 4: .01})
  assert holds is False and text.endswith('p = 0.328')
  # ... but three seeds decide nothing, even a clear gain.
  holds, text = stats_lib.directional({0: .1, 1: .12, 2: .11})
  assert holds is None and text.endswith('n < 5: more seeds decide')
  # The same difference in every seed (bytes fixed by the config): a count, no test.
  f = stats_lib.directional(dict.fromkeys(range(5), 2e6), kind='bytes')
  assert f.exact and f.holds is True and f.detail.startswith('+2.00 ± 0.00 MB (n=5')
  assert f.detail.endswith('a count fixed by the configuration, no test')
  # In a learned quantity it is no test either, down to the rounding of a subtraction.
  f = stats_lib.directional({s: 0.1 + 1e-17 * s for s in range(5)})
  assert f.flat and f.holds is None and not f.tested
  assert stats_lib.directional(dict.fromkeys(range(5), -2e6), kind='bytes')[0] is False


def test_checks_on_known_numbers():
  t = stats_lib.Table([_cell('ACE', [.90, .92, .94, .91, .93]),
                 _cell('noisy', [.88, .93, .935, .92, .93]),   # ACE - noisy: +.02 -.01 .005 -.01 0
                 _cell('clear', [.80, .83, .84, .81, .82]),
                 _cell('same', [.90, .92, .94, .91, .93]),
                 _cell('three', [.80, .82, .84]),
                 _cell('A', [.5, .6, .7, .6, .6], grid={'selection.method': 'fedentopt'}),
                 _cell('A', [.5] * 5, grid={'selection.method': 'uniform'})])
  holds, detail = checks_lib.exceeds('ACE', 'clear')(t)
  assert holds is True and detail.startswith('ACE 0.920 ± 0.016 vs clear 0.820 ± 0.016; paired '
                                             'difference +0.100 ± 0.007 (n=5')
  assert checks_lib.exceeds('ACE', 'noisy')(t)[0] is False
  same = checks_lib.exceeds('ACE', 'same')(t)   # bit-identical sides: no test
  assert same.flat and same.holds is None and 'bit-identical' in same.detail
  assert checks_lib.exceeds('ACE', 'missing')(t) == (None, 'not run: missing')
  holds, detail = checks_lib.exceeds('ACE', 'three')(t)   # three paired seeds: not decided
  assert holds is None and '(n=3;' in detail
  # A side that diverged in some seed makes the check inconclusive, and the detail says where.
  bad = _cell('bad', [0.95, 0.96])
  bad['diverged'] = {2: 17}
  holds, detail = checks_lib.exceeds('bad', 'clear')(
      stats_lib.Table([bad, _cell('clear', [0.8, 0.82, 0.84])]))
  assert holds is None and detail == 'diverged (a round left NaN or Inf): bad in seed 2'
  assert checks_lib.exceeds('ACE', 'clear')(t)[0] is True
  fe = ('A', {'selection.method': 'fedentopt'})
  uni = ('A', {'selection.method': 'uniform'})
  assert checks_lib.exceeds(fe, uni)(t)[0] is True       # +.1 .0 .2 .1 .1: t = 3.16, p = .017
  assert checks_lib.not_worse('clear', 'ACE', tol=0.01)(t)[0] is False
  # mean -.001, SE .0058: p = .10
  assert checks_lib.not_worse('noisy', 'ACE', tol=0.01)(t)[0] is False
  same = checks_lib.not_worse('same', 'ACE', tol=0.01)(t)   # identical: not checkable either
  assert same.flat and same.holds is None
  assert not checks_lib.Check('c', 's', checks_lib.matches('ACE', 'same')).paper_claim
  assert checks_lib.Check('c', 's', checks_lib.exceeds('ACE', 'same')).paper_claim
  # Bytes to the highest threshold S reaches in every seed and D in one: D's seed 4 never
  # reaches 0.6 and counts its total bytes (5 MB), a lower bound on what it would need.
  bt = stats_lib.Table([
      _cell('S', [0.7] * 5, key='final_acc', thresholds=(0.5, 0.6),
            reached={'0.5': (5, 5), '0.6': (5, 5)}, **{'bytes_to_0.5': [1e6, 1e6, 2e6, 1e6, 1e6],
                                                        'bytes_to_0.6': [2e6] * 5,
                                                        'setup_bytes': [0.5e6] * 5}),
      _cell('D', [0.7] * 5, key='final_acc', thresholds=(0.5, 0.6),
            reached={'0.5': (5, 5), '0.6': (4, 5)}, **{'bytes_to_0.5': [3e6] * 5,
                                                        'bytes_to_0.6': [4e6] * 4,
                                                        'total_bytes': [5e6] * 5,
                                                        'setup_bytes': [0.5e6] * 5})])
  f = checks_lib.fewer_bytes_to_threshold('S', 'D')(bt)
  assert f.holds is True and f.detail.startswith(
      'to reach 0.6: S 2.00 ± 0.00 MB vs D 4.20 ± 0.45 MB; ratio 0.476; D never reached it in '
      'seed 4: counted at its total bytes; paired log ratio +0.738 ± 0.100 (n=5')
  # The test is on log(D/S) per seed: ln 2 four times and ln 2.5 once, a geometric mean x2.09.
  assert f.detail.endswith('geometric mean ratio x2.09') and f.kind == 'ratio'
  assert abs(f.mean - (4 * math.log(2) + math.log(2.5)) / 5) < 1e-12
  assert abs(f.relative - (1 - 2 / 4.2)) < 1e-12
  # The paper's measure leaves the one-time setup bytes out on both sides: 1.5 vs 3.7 MB.
  f = checks_lib.fewer_bytes_to_threshold('S', 'D', after_setup=True)(bt)
  assert f.detail.startswith('to reach 0.6 after the one-time setup bytes: S 1.50 ± 0.00 MB vs '
                             'D 3.70 ± 0.45 MB')
  assert abs(f.relative - (1 - 1.5 / 3.7)) < 1e-12
  assert plan_lib.flag_literal(('cnn@1.0',)) == '("cnn@1.0",)'
  assert plan_lib.flag_literal('era') == 'era' and plan_lib.flag_literal('True') == '"True"'
  assert sweep.parse_value(plan_lib.flag_literal(('a', 1))) == ('a', 1)


def test_new_checks_on_known_numbers():
  # ERA and SA with and without noise: ERA falls .01 .02 .00 .01 .01, SA .05 .06 .04 .05 .07;
  # d = SA's fall - ERA's = .04 .04 .04 .04 .06: mean .044, SD .00894, SE .004, t = 11.0.
  t = stats_lib.Table([
      _cell('ERA', [.90, .91, .92, .90, .91], grid={'c': 0}, key='best_acc'),
      _cell('ERA', [.89, .89, .92, .89, .90], grid={'c': 5}, key='best_acc'),
      _cell('SA', [.85, .86, .84, .85, .87], grid={'c': 0}, key='best_acc'),
      _cell('SA', [.80, .80, .80, .80, .80], grid={'c': 5}, key='best_acc')])
  f = checks_lib.smaller_drop(('ERA', {'c': 5}), ('ERA', {'c': 0}), ('SA', {'c': 5}),
                              ('SA', {'c': 0}))(t)
  assert f.holds is True and abs(f.mean - 0.044) < 1e-12 and abs(f.se - 0.004) < 1e-12
  assert f.detail.startswith('drop of ERA (c=5) from ERA (c=0) 0.010 ± 0.007 vs drop of SA (c=5) '
                             'from SA (c=0) 0.054 ± 0.011 (best_acc)')
  # A metric against a constant: 3.30 3.25 3.35 3.28 3.32 against log2 9 = 3.170.
  e = stats_lib.Table([_cell('F', [3.30, 3.25, 3.35, 3.28, 3.32], key='cohort_entropy')])
  f = checks_lib.above('F', 'cohort_entropy', 3.17, 'log2 9')(e)
  assert f.holds is True and abs(f.mean - 0.13) < 1e-9
  # Rounds to the highest threshold both reach; B misses it in seed 4 (10 rounds run: 11).
  r = stats_lib.Table([
      _cell('A', [.9] * 5, thresholds=(0.8,), reached={'0.8': (5, 5)},
            **{'rounds_to_0.8': [3, 4, 3, 5, 4], 'rounds': [10] * 5}),
      _cell('B', [.9] * 5, thresholds=(0.8,), reached={'0.8': (4, 5)},
            **{'rounds_to_0.8': [5, 6, 4, 7], 'rounds': [10] * 5})])
  f = checks_lib.fewer_rounds_to_threshold('A', 'B')(r)
  # d = 2 2 1 2 7: mean 2.8
  assert abs(f.mean - 2.8) < 1e-12 and 'B never reached it in seed 4' in f.detail
  # Bytes a round, one against the other: an accounting row, not a test.
  b = stats_lib.Table([_cell('W', [1e5] * 5, key='bytes_per_round'),
                       _cell('N', [1e5] * 5, key='bytes_per_round')])
  f = checks_lib.bytes_ratio('W', 'N')(b)
  assert f.exact and f.relative == 0.0 and f.detail.endswith('ratio 1.000')


def test_statistics_derived_from_the_curves():
  cell = {'variant': 'A', 'cell': {}, 'n': 2,
          'stats': {'final_acc': results.stat({0: 0.6, 1: 0.7}),
                    'best_acc': results.stat({0: 0.8, 1: 0.7})},
          'curves': {0: {'test_acc': _series([1, 2, 3], [0.5, 0.8, 0.6]),
                         'server_ua': _series([1, 2, 3], [0.4, 0.5, 0.55])},
                     1: {'test_acc': _series([1, 2, 3], [0.3, 0.6, 0.7]),
                         'server_ua': _series([1, 2, 3], [0.2, 0.3, 0.35])}}}
  t = stats_lib.Table([cell])
  assert t.stat('A', 'final:server_ua')['values'] == {0: 0.55, 1: 0.35}
  assert t.stat('A', 'acc_at:2')['values'] == {0: 0.8, 1: 0.6}
  assert t.stat('A', 'best_by:2')['values'] == {0: 0.8, 1: 0.6}
  assert t.stat('A', 'best_by:1')['values'] == {0: 0.5, 1: 0.3}
  d = t.stat('A', 'decline')['values']
  assert abs(d[0] - 0.2) < 1e-12 and d[1] == 0.0


def _series(rounds, values):
  import numpy as np
  return {'round': np.array(rounds), 'acc': np.array(values, float), 'cum_bytes': np.zeros(len(rounds))}


def test_curve_tables_on_known_numbers():
  curves = {0: {'test_acc': _series([1, 2, 3], [0.1, 0.5, 0.9]),
                'upload_acc': _series([1, 2, 3], [0.2, 0.2, 0.6])},
            1: {'test_acc': _series([1, 3], [0.3, 0.7]),          # round 2 not evaluated
                'upload_acc': _series([1, 2, 3], [0.4, 0.2, 0.8])}}
  cells = [{'variant': 'ERA', 'label': 'ERA', 'cell': {}, 'n': 2, 'curves': curves},
           {'variant': 'SA', 'label': 'SA', 'cell': {}, 'n': 0, 'curves': {}}]
  seeds = tables_lib.seed_curve_table(['ERA', 'SA'], cells).splitlines()
  assert seeds[0] == '| variant | seed | 1 | 2 | 3 |'
  assert seeds[2:] == ['| ERA | 0 | 0.100 | 0.500 | 0.900 |', '| ERA | 1 | 0.300 | – | 0.700 |']
  diag = tables_lib.metric_curve_table('ERA', ['upload_acc'], cells).splitlines()
  # round 1: mean 0.3, sample std 0.1414; round 2: 0.2 ± 0; round 3: 0.7 ± 0.1414
  assert diag[2] == '| upload_acc | 0.30 ± 0.14 | 0.20 ± 0.00 | 0.70 ± 0.14 |'
  assert tables_lib.metric_curve_table('SA', ['upload_acc'], cells) == '*SA: no finished run.*'
  assert (tables_lib.curve_table([1, 2], cells[:1]).splitlines()[2]
          == '| ERA | 2 | 0.200 ± 0.141 | 0.500 ± – |')


def test_runs_at_chance_by_hand():
  from benchmarks.reproduction.defs import SweepDef  # pylint: disable=g-import-not-at-top
  d = SweepDef('s', 'S', (), data='digits')     # 10 classes: at chance below 0.15
  cells = [{'label': 'MTFL', 'stats': {'last10_acc': results.stat({0: 0.101, 1: 0.92, 2: 0.149})}},
           {'label': 'Single client', 'stats': {'last10_acc': results.stat({0: 0.196})}},
           {'label': 'none', 'stats': {}}]
  assert tables_lib.at_chance(d, cells) == [('MTFL', 0, 0.101), ('MTFL', 2, 0.149)]
  lines = report_lib.chance_section([('s', 'MTFL', 0, 0.101), ('s', 'MTFL', 2, 0.149)], 40)
  assert lines[2].startswith('2 of 40 finished runs end with a last-10 accuracy below 1.5/C')
  assert lines[4] == '* `s`, MTFL: 2 run(s)'
  assert report_lib.chance_section([], 7)[2].startswith('0 of 7 finished runs')


@pytest.mark.slow
def test_tiny_pipeline_writes_every_section(tmp_path):
  runs = tmp_path / 'runs'
  out = tmp_path / 'docs' / 'reproduction.md'
  r = _script('run', f'--runs={runs}', '--tiny', '--jobs=2')
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  assert 'failed' not in r.stdout.split('reproduction:')[-1].replace('0 failed', '')
  readme = tmp_path / 'README.md'
  readme.write_text(f'# x\n\n## Results\n\n{report_lib.README_BEGIN}\nSTALE ROW\n'
                    f'{report_lib.README_END}\n\nend\n')
  r = _script('report', f'--runs={runs}', f'--out={out}', '--tiny', f'--readme={readme}')
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  md = out.read_text()
  # The README's block holds the same headline rows, and nothing outside the block changed.
  text = readme.read_text()
  assert text.startswith('# x\n\n## Results\n\n')
  assert text.endswith(f'{report_lib.README_END}\n\nend\n')
  assert "STALE ROW" not in text and '](docs/reproduction.md)' in text
  lines = md.splitlines()
  assert md.startswith('# Reproduction report')
  assert re.search(r'at commit `[0-9a-f]+(\+dirty)?`|at commit `unknown`', md)
  assert 'Seeds: 0.' in md and '--tiny' in md
  # The register lists every claim of the papers of the report; the verdicts table has one
  # row per check of a claim (arbiters and exact byte counts apart), the last table one row
  # per check of fedjax_kd against a reference or of a setting.
  from benchmarks.reproduction import claims as claims_lib, verdicts as verdicts_lib
  register = lines.index('## The claims register')
  settings = lines.index('## The settings: where collaboration can show')
  verdicts = lines.index("## Verdicts on the papers' claims")
  accounting = lines.index('## Accounting: byte counts of the configuration and the draws')
  second = lines.index('## fedjax_kd against the independent implementations, and setting checks')
  first = lines.index(f'## 1. {sections_lib.SECTIONS[0].title}')
  rows_of = lambda a, b: [ln for ln in lines[a:b] if ln.startswith('| ')
                          and not ln.startswith(('| paper |', '| check |', '| sweep |'))]
  listed = rows_of(register, settings)
  assert len(listed) == len(claims_lib.REGISTER)
  # Every sweep whose floor and some other method of its own ran under --tiny prints its gap.
  defs = {d.name: d for s in sections_lib.SECTIONS for d in s.sweeps}
  kept = lambda d: set(d.tiny_variants or [v[0] for v in d.variants])
  def gap_runs(d):
    where, label = (d.name, d.floor) if isinstance(d.floor, str) else d.floor
    return label in kept(defs[where]) and bool(kept(d) - {label})
  floors = [d.name for d in defs.values() if d.floor and d.data != 'mnist' and gap_runs(d)]
  assert len(floors) >= 5
  assert {ln.split(' | ')[0][2:] for ln in rows_of(settings, verdicts)} == set(floors)
  claims, exact, others = (rows_of(verdicts, accounting), rows_of(accounting, second),
                           rows_of(second, first))
  counted = [c for s in sections_lib.SECTIONS for c in s.checks if c.claim_id and not c.arbiter]
  assert len(claims) + len(exact) == len(counted) > 0
  assert len(others) == sum(not c.claim_id for s in sections_lib.SECTIONS for c in s.checks) > 0
  assert {ln.split(' | ')[0][2:] for ln in claims} == {s.paper for s in sections_lib.SECTIONS}
  # --tiny runs one seed: no claim is decided, and the verdict says why.
  assert all(ln.endswith(f'**{verdicts_lib.FEW_SEEDS}** |') or
             ln.endswith(f'**{verdicts_lib.NOT_RUN}** |') for ln in claims)
  assert any(ln.endswith(f'**{verdicts_lib.FEW_SEEDS}** |') for ln in claims)
  assert all(re.search(r'\*\*(holds|does not hold|inconclusive|not run)\*\* \|$', ln)
             for ln in others)
  # The README's block: per paper, the verdicts counted from those rows, the claims not
  # checkable here from the register; then the agreement checks per paper.
  block = text.split(report_lib.README_BEGIN, 1)[1].split(report_lib.README_END, 1)[0]
  tables = block.split('fedjax_kd against the independent implementations')
  assert len(tables) == 2
  summary = [ln for ln in tables[0].splitlines() if ln.startswith('| ')
             and not ln.startswith('| paper |')]
  # A row for each paper's own claims and one for ours, where it has some.
  assert [ln.split(' | ')[0][2:] for ln in summary] == [
      s.paper + suffix for s in sections_lib.SECTIONS for suffix, ours in (('', False),
                                                                          (' (ours)', True))
      if any(c.paper == s.key and c.ours == ours for c in claims_lib.REGISTER)]
  cols = [[int(x) for x in ln.strip(' |').split(' | ')[1:]] for ln in summary]
  verdict_columns = len(headline_lib.SUMMARY_COLUMNS)
  # Claims: in the register, decided, no sweep here; then checks: all, by verdict, accounting.
  assert sum(c[0] for c in cols) == len(claims_lib.REGISTER)
  assert sum(c[1] for c in cols) == 0   # one seed decides nothing
  assert sum(c[2] for c in cols) == sum(1 for c in claims_lib.REGISTER if c.unchecked)
  assert all(c[3] == sum(c[4:4 + verdict_columns]) + c[-1] for c in cols)
  assert len(cols[0]) == 4 + verdict_columns + 1
  assert sum(c[3] for c in cols) == len(claims) + len(exact)
  agree = [ln for ln in tables[1].splitlines() if ln.startswith('| ') and ln[2:5] != 'pap']
  assert sum(sum(int(x) for x in ln.strip(' |').split(' | ')[1:]) for ln in agree) == len(others)
  for i, section in enumerate(sections_lib.SECTIONS, 1):
    assert f'## {i}. {section.title}' in md
    assert f'**Claim.** {section.claim}' in md
    assert f'--only={section.key}' in md
    if section.notes:
      assert f'**Notes.** {section.notes}' in md
    for d in section.sweeps:
      assert f'### {d.title}' in md
      if d.data == 'mnist':
        continue   # not run in --tiny mode; the report says so
      at = lines.index(f'### {d.title}')
      start = next(j for j in range(at, len(lines)) if lines[j].startswith('| variant |'))
      end = next(j for j in range(start, len(lines) + 1)
                 if j == len(lines) or not lines[j].startswith('|'))
      table = lines[start + 2:end]
      labels = [v[0] for v in d.variants if d.tiny_variants is None or v[0] in d.tiny_variants]
      cells = max(1, len(plan_lib._grid(d, tiny=True).get(d.grid[0][0], []))) if d.grid else 1
      assert len(table) == len(labels) * cells, d.name
      for label in labels:
        mine = [ln for ln in table if ln.startswith(f'| {label} |')]
        assert len(mine) == cells and all('±' in ln for ln in mine), (d.name, label)
      fig = out.parent / 'figures' / 'reproduction' / f'{d.name}_test_acc.png'
      assert fig.exists() and f'](figures/reproduction/{d.name}_test_acc.png)' in md
  assert md.count('*Not run: not part of --tiny (MNIST sweeps are skipped).*') == sum(
      d.data == 'mnist' for s in sections_lib.SECTIONS for d in s.sweeps)
  assert 'The same sweep with the sweep tool: `python -m fedjax_kd.sweep --config=configs/' in md
  # ACE-pFL's table has the per-seed delta column; the reference row says so.
  assert '| ACE-pFL | 1 |' in md and '(reference)' in md
  # Every run is finished: rerunning skips them all.
  r = _script('run', f'--runs={runs}', '--tiny', '--only=dsfl', '--jobs=2')
  assert r.returncode == 0 and '] start ' not in r.stdout and '] skipped ' in r.stdout
  assert (runs / 'dsfl_digits' / 'compare.md').exists()
  # The archive holds the report's inputs only: the same report comes from it, and a run on
  # it skips every finished run.
  arch = tmp_path / 'archive'
  r = _script('archive', f'--runs={runs}', f'--out={arch}')
  assert r.returncode == 0 and 'archived' in r.stdout, r.stderr[-2000:]
  assert (arch / archive_lib.MANIFEST).exists() and (arch / 'dsfl_digits.tar.gz').exists()
  with archive_lib.open_runs(str(arch)) as tree:
    tree = pathlib.Path(tree)
    assert not list(tree.rglob('checkpoints')) and list(tree.rglob('metrics.jsonl'))
  out2 = tmp_path / 'docs2' / 'reproduction.md'
  r = _script('report', f'--runs={arch}', f'--out={out2}', '--tiny')
  assert r.returncode == 0, r.stderr[-2000:]
  # Commands name runs/repro (where runs are made) when the report reads an archive.
  strip = lambda text, where: [ln.replace(str(where), 'RUNS').replace('runs/repro', 'RUNS')
                               for ln in text.splitlines()
                               if not ln.startswith(('Generated on', 'To regenerate', '**Commands',
                                                     f'`{where}` holds'))]
  md2 = out2.read_text()
  assert strip(md2, arch) == strip(md, runs)
  assert f'`{arch}` holds the finished runs' in md2 and f'cp -r {arch} runs/repro' in md2
  r = _script('run', f'--runs={arch}', '--tiny', '--only=dsfl', '--jobs=2')
  assert r.returncode == 0 and '] start ' not in r.stdout and '] skipped ' in r.stdout


def test_update_block_needs_both_markers(tmp_path):
  path = tmp_path / 'README.md'
  path.write_text('no markers\n')
  try:
    report_lib.update_block(str(path), ['x'])
    raise AssertionError('expected DataError')
  except DataError as e:
    assert 'README.md' in str(e)
  assert path.read_text() == 'no markers\n'


def test_only_rejects_unknown_sections(tmp_path):
  r = _script('run', f'--runs={tmp_path}', '--only=dsfl,nope')
  assert r.returncode == 2 and r.stderr.startswith('error: --only=')


def _flat(d, prefix=''):
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f'{prefix}{k}.') if isinstance(v, dict) else {f'{prefix}{k}': v})
  return out


# Fields added after the archive was made, each at its value that changes nothing (an option
# of a partition scheme the default does not use; DS-FL's attacks, off; clients.chunk 'auto',
# which runs the default's ten clients all at once, as the archived run did).
ADDED_SINCE_ARCHIVE = {'data.dominant_fraction': 0.9, 'data.noisy_classes': 0,
                       'data.public_noise_source': '', 'data.num_public_noise': 0,
                       'selection.kl_threshold': 0.0, 'clients.chunk': 'auto'}


@pytest.mark.slow
def test_readme_example_output_is_the_archived_default_run():
  """The README's closing table of configs/default.py is seed 0 of the archived DS-FL ERA run,
  marked as one machine's digits, and the mean ± std beside it is that of the archived seeds."""
  with archive_lib.open_runs(str(REPO / archive_lib.ARCHIVE_DEFAULT)) as tree:
    _readme_example_is(pathlib.Path(tree) / 'dsfl_digits' / 'runs' / 'ds-fl-era' / 'seed0')


def _readme_example_is(run: pathlib.Path) -> None:
  spec = importlib.util.spec_from_file_location('default_config_under_test',
                                                REPO / 'configs' / 'default.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  archived = _flat(json.loads((run / 'config.json').read_text()))
  current = _flat(module.get_config().to_dict())
  # Fields added after the archive was made, at values that leave this run unchanged (an option
  # of a partition scheme the default does not use).
  for key, value in ADDED_SINCE_ARCHIVE.items():
    if key not in archived and current.get(key) == value:
      del current[key]
  # An algorithm registered since then brings its own config group, which no other
  # algorithm's run reads.
  from fedjax_kd import algorithms, options as options_lib
  own = set(options_lib.groups(algorithms.ALGORITHMS[archived['algorithm']].options_class))
  others = {g for cls in algorithms.ALGORITHMS.values()
            for g in options_lib.groups(cls.options_class)} - own
  for key in [k for k in current if k not in archived and k.split('.')[0] in others]:
    del current[key]
  # The archived run is exactly the default config (the sweep's overrides change nothing).
  assert json.dumps(archived, sort_keys=True) == json.dumps(current, sort_keys=True), (
      'configs/default.py differs from the archived run: rerun the dsfl_digits sweep, '
      'archive it and update the README example')
  s = json.loads((run / 'summary.json').read_text())
  readme = ' '.join((REPO / 'README.md').read_text().split())
  assert f'final acc {s["final_acc"]:.4f} (server model, round {s["rounds"]})' in readme
  assert f'best acc {s["top_acc"]:.4f} (round {s["top_round"]})' in readme
  assert f'client acc {s["final_client_acc"]:.4f} (mean over clients' in readme
  assert f'bytes total {s["cum_bytes"] / 1e6:.2f} MB' in readme
  # The numbers every CPU reproduces: the mean ± std over the archived seeds (seed 0's digits
  # above are one machine's; another CPU's rounding gives another seed-0 run).
  seeds = [json.loads((run.parent / f'seed{k}' / 'summary.json').read_text()) for k in range(3)]
  stat = lambda key: (f'{statistics.mean(x[key] for x in seeds):.3f} ± '
                      f'{statistics.stdev(x[key] for x in seeds):.3f}')
  assert (f'final {stat("final_acc")}, best {stat("top_acc")}, clients '
          f'{stat("final_client_acc")} (mean ± std over seeds 0-2') in readme
  assert "Its accuracy digits are that machine's" in readme


def test_equivalence_on_known_numbers():
  """Two one-sided t-tests against the margin, worked by hand (t(0.95, 2) = 2.920)."""
  # +0.01, 0, -0.01: mean 0, std 0.01, SE 0.01 / sqrt(3) = 0.00577, 90% CI 0 ± 0.0169:
  # inside ±0.02; TOST p = P(T_2 > 0.02 / 0.00577 = 3.46) = 0.037.
  assert stats_lib.equivalence({0: 0.01, 1: 0.0, 2: -0.01}, 0.02) == (
      True, '+0.000 ± 0.010 (n=3; SE 0.006; 90% CI [-0.017, +0.017]); margin ±0.02; within '
      'it: TOST p = 0.037')
  # The same seeds against ±0.01 cannot tell a gap of 0.01 from none; at that spread five
  # seeds would: t(0.95, 4) 0.01 / sqrt(5) = 0.0095 < 0.01, while t(0.95, 3) 0.01 / 2 = 0.0118.
  holds, text = stats_lib.equivalence({0: 0.01, 1: 0.0, 2: -0.01}, 0.01)
  assert holds is None and text.endswith('about 5 seeds would show equivalence')
  # -0.13, -0.13, -0.05: mean -0.1033, std 0.0462, SE 0.0267, 90% CI [-0.181, -0.025]: wholly
  # below -0.02; p = P(T_2 > (0.1033 - 0.02) / 0.0267 = 3.125) = 0.044.
  assert stats_lib.equivalence({0: -0.13, 1: -0.13, 2: -0.05}, 0.02) == (
      False, '-0.103 ± 0.046 (n=3; SE 0.027; 90% CI [-0.181, -0.025]); margin ±0.02; beyond '
      'it: p = 0.044')
  # Five seeds narrow the interval: t(0.95, 4) = 2.132; +0.03 ± 0.01 -> SE 0.00447, CI
  # [+0.020, +0.040]: beyond +0.01, not decided against +0.02... and inside ±0.05.
  five = {0: 0.02, 1: 0.03, 2: 0.04, 3: 0.025, 4: 0.035}   # mean 0.03, std 0.0079
  assert stats_lib.equivalence(five, 0.01)[0] is False
  assert stats_lib.equivalence(five, 0.03)[0] is None
  assert stats_lib.equivalence(five, 0.05)[0] is True
  # Every seed the same difference: the margin decides exactly.
  assert stats_lib.equivalence({0: 0.01, 1: 0.01, 2: 0.01}, 0.02)[0] is True
  assert stats_lib.equivalence({0: 0.05, 1: 0.05, 2: 0.05}, 0.02)[0] is False


def test_matches_on_known_numbers():
  """The reference check: the paired per-seed differences, tested against the margin."""

  def cell(label, finals, r3):
    c = _cell(label, finals)
    c['curves'] = {s: {'test_acc': _series([1, 3], [0.1, v])} for s, v in enumerate(r3)}
    return c

  t = stats_lib.Table([cell('ours', [0.94, 0.94, 0.83], [0.80, 0.76, 0.70]),
                 cell('ref', [0.93, 0.94, 0.84], [0.80, 0.77, 0.74]),
                 cell('far', [0.80, 0.81, 0.79], [0.5, 0.5, 0.5]),
                 cell('noisy', [0.99, 0.85, 0.99], [0.8, 0.8, 0.8])])
  holds, detail = checks_lib.matches('ours', 'ref')(t)          # differences +0.01, 0, -0.01
  assert holds is True and detail == (
      'final: ours 0.903 ± 0.064 vs ref 0.903 ± 0.055; paired difference +0.000 ± 0.010 (n=3; '
      'SE 0.006; 90% CI [-0.017, +0.017]); margin ±0.02; within it: TOST p = 0.037')
  # Round 3: 0, -0.01, -0.04: mean -0.0167, SE 0.0120, 90% CI [-0.052, +0.018].
  holds, detail = checks_lib.matches('ours', 'ref', at_round=3)(t)
  assert holds is None and detail.startswith('round 3: ours 0.753 ± 0.050 vs ref 0.770 ± 0.030')
  assert '90% CI [-0.052, +0.018]' in detail and detail.endswith('seeds would show equivalence')
  holds, detail = checks_lib.matches('far', 'ref')(t)           # -0.13, -0.13, -0.05
  assert holds is False and 'paired difference -0.103 ± 0.046 (n=3' in detail
  holds, detail = checks_lib.matches('noisy', 'ref')(t)   # +0.06, -0.09, +0.15: mean 0.04, std 0.12
  assert holds is None and detail.endswith('more seeds decide')
  assert checks_lib.matches('ours', 'ref', at_round=2)(t) == (None, 'not logged at round 2')
  assert checks_lib.matches('ours', 'gone')(t) == (None, 'not run: gone')


def test_reference_checks_need_three_seeds_and_read_the_draw_noise():
  """Paired checks decide nothing on fewer than 3 seeds; the stability and draw-noise checks
  on worked-out numbers; the paired-difference table."""

  def cell(label, r3, grid=None, diverged=None):
    c = _cell(label, r3, grid)
    c['curves'] = {s: {'test_acc': _series([1, 3], [0.1, v])} for s, v in enumerate(r3)}
    c['diverged'] = diverged or {}
    c['planned'] = len(r3) + len(c['diverged'])
    return c

  t = stats_lib.Table([cell('one', [0.80]), cell('ref1', [0.80]),
                 cell('ours', [0.70, 0.75, 0.72]), cell('ref', [0.73, 0.76, 0.74]),
                 cell('ref, other draws', [0.76, 0.73, 0.75]),
                 cell('flat', [0.10, 0.93, 0.94]), cell('gone', [0.9], diverged={1: 40, 2: 12}),
                 cell('fine', [0.93, 0.94, 0.95]), cell('short', [0.93, 0.94])])
  holds, detail = checks_lib.matches('one', 'ref1', at_round=3)(t)
  assert holds is None and detail.endswith('fewer than 3 paired seeds')
  # ours - ref: -0.03, -0.01, -0.02 (mean -0.02); other draws - ref: +0.03, -0.03, +0.01,
  # rms sqrt((9 + 9 + 1) / 3) / 100 = 0.0252 >= 0.02: the gap is the size of the draws' own.
  holds, detail = checks_lib.within_draw_noise('ours', 'ref', 'ref, other draws', 'ref', 3)(t)
  assert holds is True and detail == ('round 3: ours - ref -0.020 ± 0.010 (n=3); ref, other '
                                      'draws - ref +0.003 ± 0.031 (n=3), rms 0.025')
  t2 = stats_lib.Table([cell('ours', [0.70, 0.70, 0.70]), cell('ref', [0.75, 0.76, 0.74]),
                  cell('ref, other draws', [0.76, 0.75, 0.74])])
  assert checks_lib.within_draw_noise('ours', 'ref', 'ref, other draws', 'ref', 3)(t2)[0] is False
  assert checks_lib.stable('fine')(t)[0] is True
  # 0.10, 0.93, 0.94: mean 0.657, std sqrt(0.4649 / 2) = 0.482
  assert checks_lib.stable('flat')(t) == (False, 'flat: 3 of 3 seeds finished, final acc 0.657 ± '
                                          '0.482; below 0.5: seeds 0')
  holds, detail = checks_lib.stable('gone')(t)
  assert holds is False and detail.endswith('diverged: seeds 1, 2')
  short = t.find('short')
  short['planned'] = 3
  assert checks_lib.stable('short')(t)[0] is None
  assert checks_lib.stable('absent')(t) == (None, 'not run: absent')
  table = tables_lib.paired_round_table('ref', [3], [t.find(x) for x in ('ref', 'ours', 'one')])
  assert table.splitlines()[2:] == ['| ours | -0.020 ± 0.010 (n=3) |',
                                    '| one | +0.070 ± – (n=1) |']


def test_no_steady_gap_on_known_numbers():
  """A gap in one round is not a lag: the check averages each seed's gap over the rounds
  from round 2 and counts the rounds one curve is lower."""

  def cell(label, curves):
    c = _cell(label, [v[-1] for v in curves])
    c['curves'] = {s: {'test_acc': _series([1, 2, 3, 4], v)} for s, v in enumerate(curves)}
    return c

  ref = [[0.1, 0.50, 0.70, 0.80], [0.1, 0.60, 0.70, 0.90], [0.1, 0.40, 0.60, 0.80]]
  # per round - ref: seed 0: -0.03 (r3) only: mean -0.01; seed 1: +0.02, -0.02, 0: mean 0;
  # seed 2: 0, -0.03, +0.03: mean 0. Round 1 (0.9 vs 0.1) is left out.
  ours = [[0.9, 0.50, 0.67, 0.80], [0.9, 0.62, 0.68, 0.90], [0.9, 0.40, 0.57, 0.83]]
  lag = [[0.1, 0.45, 0.65, 0.75], [0.1, 0.55, 0.65, 0.85], [0.1, 0.35, 0.55, 0.75]]
  t = stats_lib.Table([cell('ours', ours), cell('ref', ref), cell('lag', lag),
                 cell('two', ours[:2])])
  # Per-seed gaps -0.01, 0, 0: mean -0.0033, std 0.0058, SE 0.0033, 90% CI [-0.013, +0.006]
  # (t(0.95, 2) = 2.920): inside ±0.02, not inside ±0.01.
  holds, detail = checks_lib.no_steady_gap('ours', 'ref', tol=0.02)(t)
  assert holds is True and detail.startswith(
      'rounds 2-last (ours lower in 3 of 9 (seed, round) pairs): mean per-seed gap ours - ref '
      '-0.003 ± 0.006 (n=3; SE 0.003; 90% CI [-0.013, +0.006]); margin ±0.02; within it')
  assert checks_lib.no_steady_gap('ours', 'ref')(t)[0] is None
  holds, detail = checks_lib.no_steady_gap('lag', 'ref')(t)   # -0.05 in every round of every seed
  assert holds is False and '(lag lower in 9 of 9' in detail and 'gap lag - ref -0.050' in detail
  assert checks_lib.no_steady_gap('two', 'ref')(t)[0] is None
  assert checks_lib.no_steady_gap('ours', 'gone')(t) == (None, 'not run: gone')


def test_same_metric_on_known_numbers():
  """A metric fixed by the shared draws (the cache's hit ratio) must agree round by round."""

  def cell(label, hits):
    c = _cell(label, [0.9] * len(hits))
    c['curves'] = {s: {'test_acc': _series([1, 2, 3], [0.1, 0.5, 0.9]),
                       'hit_ratio': _series([1, 2, 3], h)} for s, h in enumerate(hits)}
    return c

  ours = [[0.0, 0.1, 0.24], [0.0, 0.093, 0.16], [0.0, 0.103, 0.18]]
  off = [[0.0, 0.1, 0.24], [0.0, 0.093, 0.163], [0.0, 0.103, 0.18]]
  t = stats_lib.Table([cell('ours', ours), cell('same', ours), cell('off', off),
                 cell('two', ours[:2])])
  assert checks_lib.same_metric('ours', 'same', 'hit_ratio')(t) == (
      True, 'hit_ratio: largest difference 0.0000 over 9 (seed, round) pairs of 3 seeds; '
            'tolerance 0.001')
  holds, detail = checks_lib.same_metric('ours', 'off', 'hit_ratio')(t)   # 0.003 at seed 1, round 3
  assert holds is False and 'largest difference 0.0030' in detail
  assert checks_lib.same_metric('ours', 'two', 'hit_ratio')(t)[0] is None
  assert (checks_lib.same_metric('ours', 'same', 'entropy')(t)
          == (None, 'entropy not logged by both'))


def test_recorded_command_drops_scheduling_flags():
  """The command a sweep records is the one that reruns the whole sweep: the flags that only
  schedule (threads, jobs, a part of the variants) are dropped, the MNIST path is a placeholder."""
  argv = ['run', '--runs=runs/repro', '--mnist=/home/me/mnist.npz', '--jobs=2',
          '--torch_threads=1', '--sweeps=dsfl_mnist', '--variants=FedAvg,FD,Single client']
  assert plan_lib.command_line(argv) == ('python -m benchmarks.reproduction run --runs=runs/repro '
                                         '--mnist=/path/to/mnist.npz --sweeps=dsfl_mnist')
  # argparse also takes a flag's value as the next word: it is dropped with its flag.
  spaced = ['run', '--jobs', '2', '--variants', 'FedAvg', '--plan_only', '--sweeps=dsfl_mnist']
  assert (plan_lib.command_line(spaced)
          == 'python -m benchmarks.reproduction run --sweeps=dsfl_mnist')
  # A command recorded before the script became a package reads as it is typed today.
  assert (plan_lib.placeholder_paths('python benchmarks/reproduction.py run --mnist=/m/x.npz')
          == 'python -m benchmarks.reproduction run --mnist=/path/to/mnist.npz')


def test_seed_table_by_seed_and_torch_command():
  curves = lambda *v: {s: {'test_acc': _series([1], [x])} for s, x in enumerate(v)}
  cells = [{'variant': 'ERA', 'label': 'ERA', 'cell': {}, 'n': 2, 'curves': curves(0.1, 0.2)},
           {'variant': 'Ref ERA', 'label': 'Ref ERA', 'cell': {}, 'n': 2,
            'curves': curves(0.3, 0.4)}]
  rows = tables_lib.seed_curve_table(['ERA', 'Ref ERA'], cells, by_seed=True).splitlines()[2:]
  assert rows == ['| ERA | 0 | 0.100 |', '| Ref ERA | 0 | 0.300 |', '| ERA | 1 | 0.200 |',
                  '| Ref ERA | 1 | 0.400 |']
  plan = {'config': 'configs/dsfl_mnist_cpu.py', 'seeds': [0, 1, 2],
          'variants': [{'label': 'PyTorch DS-FL ERA', 'overrides': {'dsfl.aggregation': 'era'}},
                       {'label': 'PyTorch DS-FL SA', 'overrides': {'dsfl.aggregation': 'sa'}}]}
  assert plan_lib.torch_command(plan, 'runs/repro/dsfl_mnist_torch', 'dsfl') == (
      'python -m benchmarks.references.pytorch --algorithm=dsfl --config=configs/dsfl_mnist_cpu.py '
      '--mnist=/path/to/mnist.npz --seeds=0,1,2 --variants=era,sa '
      '--out=runs/repro/dsfl_mnist_torch')
  # A grid and a field the module does not fix travel as --set flags; variants by key.
  plan = {'config': "presets.fedentopt_cpu('c2', source)", 'seeds': [0],
          'variants': [{'label': 'PyTorch SCAFFOLD'}], 'grid': {'selection.method':
                                                                ['uniform', 'fedentopt']},
          'overrides': {'data.source': 'npz:/x/mnist.npz', 'rounds': 60}}
  assert plan_lib.torch_command(plan, 'out', 'fedentopt') == (
      "python -m benchmarks.references.pytorch --algorithm=fedentopt --mnist=/path/to/mnist.npz "
      "--seeds=0 --variants=scaffold --set rounds=60 "
      "--set selection.method=uniform,fedentopt --out=out")


def _fake_sweep(out, engine, variants, finals, r3):
  """A finished 3-round MNIST sweep on disk: ``variants`` x seeds 0-2 with known curves."""
  import json
  runs = []
  for label, agg in variants:
    for seed in range(3):
      wd = out / 'runs' / results.slug(label) / f'seed{seed}'
      wd.mkdir(parents=True)
      curve = [0.1, 0.5, r3[label][seed]] if finals is None else [0.1, 0.5, finals[label][seed]]
      rows = [{'round': r, 'test_acc': a, 'label_acc': 0.8, 'upload_acc': 0.2, 'entropy': 1.0,
               'round_time_s': 1.0} for r, a in enumerate(curve, 1)]
      (wd / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
      (wd / 'summary.json').write_text(json.dumps({'rounds': 3, 'final_acc': curve[-1]}))
      (wd / 'config.json').write_text(json.dumps({
          'rounds': 3, 'data': {'source': 'npz:/x/mnist.npz', 'partition': 'shards',
                                'shards_per_client': 2, 'num_public': 20000},
          'clients': {'num_clients': 20, 'models': ['dsfl_cnn@1.0']}, 'comm': {'rules': 'paper'}}))
      runs.append({'variant': label, 'algorithm': 'dsfl', 'cell': [], 'seed': seed,
                   'workdir': os.path.relpath(wd, out), 'rounds': 3})
  (out / 'sweep.json').write_text(json.dumps({
      'variants': [{'label': l, 'algorithm': 'dsfl', 'overrides': {'dsfl.aggregation': a}}
                   for l, a in variants], 'grid': {}, 'seeds': [0, 1, 2],
      'config': 'configs/dsfl_mnist_cpu.py', 'engine': engine, 'thresholds': [0.75],
      'metrics': ['label_acc', 'upload_acc', 'entropy'], 'runs': runs,
      'overrides': {'data.source': 'npz:/x/mnist.npz', 'eval.clients': False}}))


def test_report_reads_the_torch_reference_beside_fedjax_kd(tmp_path):
  """The PyTorch reference's sweep is read next to the fedjax_kd MNIST sweep, seed by seed."""
  runs = tmp_path / 'runs'
  finals = {'DS-FL ERA': [0.94, 0.94, 0.83], 'DS-FL SA': [0.82, 0.83, 0.71],
            'PyTorch DS-FL ERA': [0.93, 0.94, 0.84], 'PyTorch DS-FL SA': [0.90, 0.91, 0.80]}
  _fake_sweep(runs / 'dsfl_mnist', 'fedjax_kd', [('DS-FL ERA', 'era'), ('DS-FL SA', 'sa')],
              finals, None)
  _fake_sweep(runs / 'dsfl_mnist_torch', 'torch',
              [('PyTorch DS-FL ERA', 'era'), ('PyTorch DS-FL SA', 'sa')], finals, None)
  out = tmp_path / 'report.md'
  r = _script('report', f'--runs={runs}', f'--out={out}', '--only=dsfl')
  assert r.returncode == 0, r.stderr[-3000:]
  md = out.read_text()
  part = md.split('### fedjax_kd against an independent implementation: PyTorch DS-FL')[1]
  part = part.split('### ')[0]
  assert ('python -m benchmarks.references.pytorch --algorithm=dsfl --config=configs/dsfl_mnist_cpu.py '
          '--mnist=/path/to/mnist.npz --seeds=0,1,2 --variants=era,sa') in part
  assert 'python -m fedjax_kd.sweep' not in part
  seeds = [ln for ln in part.split('Every round, seed by seed:')[1].splitlines()
           if ln.startswith('| ') and not ln.startswith('| variant')]
  assert [ln.split(' | ')[:2] for ln in seeds[:4]] == [
      ['| DS-FL ERA', '0'], ['| PyTorch DS-FL ERA', '0'], ['| DS-FL SA', '0'],
      ['| PyTorch DS-FL SA', '0']]
  assert seeds[1] == '| PyTorch DS-FL ERA | 0 | 0.100 | 0.500 | 0.930 |'
  checks = {ln.split(' | ')[0][2:]: ln for ln in md.splitlines()
            if ln.startswith('| ') and 'dsfl_mnist_torch' in ln and 'PyTorch' in ln}
  era = [v for k, v in checks.items() if 'DS-FL ERA accuracy equals' in k and 'last' in k][0]
  # +0.01, 0, -0.01: 90% CI [-0.017, +0.017], inside ±0.02 (test_equivalence_on_known_numbers)
  assert 'paired difference +0.000 ± 0.010 (n=3; SE 0.006' in era and era.endswith('**holds** |')
  sa = [v for k, v in checks.items() if 'DS-FL SA accuracy equals' in k and 'last' in k][0]
  assert 'paired difference -0.083 ± 0.006' in sa and sa.endswith(
      '**does not hold** |')
  both = [ln for ln in md.splitlines() if 'in the PyTorch reference too' in ln
          and ln.startswith('| dsfl_acc_vs_fl_sa (arbiter) |')][0]
  # The paper's claim in the reference (an arbiter): ERA within 2 points of SA's best
  # accuracy; three seeds decide nothing about a paper's claim.
  assert '(n=3; SE' in both and 'H0: d ≤ -0.020' in both and 'n < 5: more seeds' in both
  assert both.endswith('**too few seeds** |')
  # One figure with both implementations on the same axes; never the reference alone.
  assert '(figures/reproduction/dsfl_mnist_torch_pairs.png)' in part
  assert 'dsfl_mnist_torch_test_acc.png' not in md
  assert (tmp_path / 'figures' / 'reproduction' / 'dsfl_mnist_torch_pairs.png').exists()


def test_machines_line_names_the_runs_made_off_the_cpu(tmp_path):
  runs = [('A', 0, {'platform': 'cpu', 'kind': 'cpu'}), ('A', 1, None),
          ('B', 0, {'platform': 'gpu', 'kind': 'NVIDIA H100 80GB HBM3'}), ('B', 1, 'unfinished')]
  plan = {'runs': []}
  for label, seed, device in runs:
    wd = f'runs/{label}/seed{seed}'
    plan['runs'].append({'variant': label, 'seed': seed, 'workdir': wd})
    if device != 'unfinished':
      (tmp_path / wd).mkdir(parents=True)
      summary = {'final_acc': 0.5} | ({'device': device} if device else {})
      (tmp_path / wd / 'summary.json').write_text(json.dumps(summary))
  line = tables_lib.machines_line(str(tmp_path), plan)
  assert line.startswith('*Machines: CPU: 1 run; NVIDIA H100 80GB HBM3 (GPU): B seed 0; '
                         'not recorded: 1 run. ')
  # All on CPUs (or not recorded): nothing to say.
  plan['runs'] = plan['runs'][:2]
  assert tables_lib.machines_line(str(tmp_path), plan) == ''
