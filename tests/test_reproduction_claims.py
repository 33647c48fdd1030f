"""The reproduction report's claims register, its verdicts with a size, and its stale-run rule
(benchmarks/repro): numbers worked out by hand, and the register held to its checks."""

import json
import pathlib
import shutil

import pytest

from benchmarks.repro import archive as archive_lib
from benchmarks.repro import claims, standing, verdicts
from benchmarks.repro import sections as sections_lib
from benchmarks.repro import stats as stats_lib
from benchmarks.repro.verdicts import Finding
from fedjax_kd import sweep

REPO = pathlib.Path(__file__).resolve().parents[1]
ARCHIVE = REPO / 'docs' / 'reproduction_runs'

# Every claim a check tests today, per paper. Removing a claim from the register, or the last
# check of one, fails here: a claim leaves the report only by an edit of this list too.
CHECKED = {
    'dsfl': {'dsfl_comm_vs_fl', 'dsfl_acc_vs_fl_sa', 'dsfl_era_vs_sa_comm', 'dsfl_acc_vs_fd',
             'dsfl_acc_vs_single'},
    'scarlet': {'scarlet_comm_50pct', 'scarlet_keeps_accuracy', 'scarlet_server_acc_a005',
                'scarlet_outperforms_both_sides', 'scarlet_client_matches_selective_fd',
                'scarlet_cache_duration'},
    'fedcache2': {'fc2_vs_single'},
    'acepfl': {'ace_components', 'ace_vs_single', 'ace_vs_fedmd'},
    'fedentopt': {'fedentopt_vs_random', 'fedentopt_combined', 'fedentopt_vs_power_of_choice'},
}


def test_holm_on_known_numbers():
  # p = .01 .04 .03 .005 (m = 4): sorted .005 .01 .03 .04 -> 4x.005 = .02, 3x.01 = .03,
  # 2x.03 = .06, 1x.04 = .04 -> monotone: .02 .03 .06 .06; back in the given order:
  assert verdicts.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert verdicts.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])   # capped at 1
  assert verdicts.holm([]) == []


def test_four_way_verdicts():
  def f(mean, p, p_against, n=5, margin=0.0, relative=None):
    return Finding(p < 0.05, 'x', n=n, mean=mean, margin=margin, p=p, p_against=p_against,
                   relative=relative)
  v = lambda finding, p_adj, effect: verdicts.verdict(finding, p_adj, effect, min_seeds=5)
  assert v(f(0.06, 0.001, 0.999), 0.004, 0.10) == verdicts.REPRODUCED     # 6 of 10 points
  assert v(f(0.04, 0.001, 0.999), 0.004, 0.10) == verdicts.SMALLER        # 4 < half of 10
  assert v(f(0.04, 0.001, 0.999), 0.080, 0.10) == verdicts.NOT_SIGNIFICANT   # after Holm
  assert v(f(-0.03, 0.999, 0.001), 0.004, 0.10) == verdicts.CONTRADICTED
  # A margin claim ("within 1 point"): no effect to halve; below the margin is against it.
  assert v(f(0.001, 0.001, 0.999, margin=-0.01), 0.004, None) == verdicts.REPRODUCED
  assert v(f(-0.04, 0.999, 0.001, margin=-0.01), 0.004, None) == verdicts.CONTRADICTED
  # A bytes claim is sized by the share saved: 30% of "over 50%" is less than half? No: 0.3
  # >= 0.25, reproduced; 20% is smaller.
  assert v(f(1e6, 0.001, 0.999, relative=0.30), 0.004, 0.5) == verdicts.REPRODUCED
  assert v(f(1e6, 0.001, 0.999, relative=0.20), 0.004, 0.5) == verdicts.SMALLER
  assert v(f(0.06, 0.001, 0.999, n=3), None, 0.10) == verdicts.FEW_SEEDS
  assert v(Finding(None, 'not run: X'), None, 0.1) == verdicts.NOT_RUN
  assert v(Finding(True, 'x', n=5, mean=1.0, p=0.0, p_against=1.0, exact=True), None,
           0.5) == verdicts.EXACT


def test_a_fixed_byte_count_is_no_test_and_a_zero_difference_is_not_a_contradiction():
  f = stats_lib.directional({s: 2e6 for s in range(5)}, kind='bytes')
  assert f.exact and f.holds is True
  # Identical accuracies in every seed: no difference either way (neither p below 1).
  f = stats_lib.directional({s: 0.0 for s in range(5)})
  assert not f.exact and f.p == 1.0 and f.p_against == 1.0
  assert verdicts.verdict(f, 1.0, 0.05, 5) == verdicts.NOT_SIGNIFICANT


def test_the_register_and_the_checks_hold_each_other():
  by_paper: dict[str, set[str]] = {}
  for section in sections_lib.SECTIONS:
    for check in section.checks:
      if check.claim_id:
        claim = claims.BY_ID[check.claim_id]   # a check names a claim of the register ...
        assert claim.paper == section.key and not claim.unchecked, check.claim
        if not check.arbiter:
          by_paper.setdefault(section.key, set()).add(check.claim_id)
      else:   # ... or checks fedjax_kd against a reference or a setting
        assert not check.paper_claim, check.claim
  assert by_paper == CHECKED
  for claim in claims.REGISTER:
    assert claim.quote and claim.number and claim.where
    # Every claim is checked, or says why it cannot be here.
    assert bool(claim.unchecked) != (claim.id in by_paper.get(claim.paper, ())), claim.id
  assert len(claims.BY_ID) == len(claims.REGISTER)
  for cid, why in claims.EXPLANATIONS.items():
    assert cid in claims.BY_ID and why.verdict in ('at this scale', 'implementation')
    # Each check an explanation prints beside it exists: (claim id or '' for an agreement
    # check, sweep, words of the check).
    for claim_id, sweep_name, *words in why.related:
      assert claim_id == '' or claim_id in claims.BY_ID, (cid, claim_id)
      assert any((c.claim_id or '') == claim_id and c.sweep == sweep_name
                 and all(w in c.claim for w in words)
                 for s in sections_lib.SECTIONS for c in s.checks), (cid, claim_id, sweep_name)


def test_the_committed_report_has_the_register_and_explains_what_goes_against_a_paper():
  md = (REPO / 'docs' / 'reproduction.md').read_text()
  for claim in claims.REGISTER:
    assert f'| {claim.id}' in md, claim.id
  against = md.split('## What goes against the papers, and why')[1].split('\n## ')[0]
  assert 'not yet explained' not in against
  verdict_rows = md.split("## Verdicts on the papers' claims")[1].split('\n## ')[0]
  for cid in {line.split(' | ')[1] for line in verdict_rows.splitlines()
              if line.endswith(('**contradicted** |', '**smaller effect** |'))}:
    assert f'**{cid}**' in against, cid


def _sweeps():
  return sections_lib.sweep_engines()


def _copy_sweep(name, dest):
  """A sweep of the archive as a plain folder at ``dest/name``."""
  with archive_lib.open_runs(str(ARCHIVE)) as tree:
    shutil.copytree(pathlib.Path(tree) / name, dest / name)


def test_the_committed_report_names_every_stale_run_and_counts_none():
  # Every archived run is tied to today's code, or the report names it and leaves it out of
  # every number (test_a_stale_run_is_named_and_enters_no_number): the committed report was
  # made from today's ties.
  stale = standing.stale_runs(str(ARCHIVE), _sweeps())
  md = (REPO / 'docs' / 'reproduction.md').read_text()
  part = md.split('## Runs that no longer stand')[1].split('\n## ')[0]
  named = {line.split('`')[1] for line in part.splitlines() if line.startswith('- `')}
  assert named == set(stale)
  if not stale:
    assert 'None: every archived run is tied' in part


def test_a_stale_run_is_named_and_enters_no_number(tmp_path):
  name = 'scarlet_digits'
  _copy_sweep(name, tmp_path)
  plan = sweep.load_plan(str(tmp_path / name))
  victim = f'{name}/{plan["runs"][0]["workdir"]}'
  # Every run tied to today's code, then one tied to code whose results have changed since.
  engines = {name: _sweeps()[name]}
  today = {}
  for run in standing.iter_runs(str(tmp_path), engines):
    today[run.path] = {'tie': 'replay', 'by': 'test',
                       'fingerprint': standing.fingerprint(run, standing.read_today)}
  today[victim]['fingerprint'] = 'a result that has changed since'
  (tmp_path / standing.STANDING_FILE).write_text(json.dumps({'runs': today}))
  stale = standing.stale_runs(str(tmp_path), engines)
  assert list(stale) == [victim] and 'changed since' in stale[victim]
  # The report leaves it out: its cell has one seed fewer, listed as excluded.
  cells = sweep.aggregate(str(tmp_path / name), exclude={victim.split('/', 1)[1]})
  first = plan['runs'][0]
  cell = next(c for c in cells if c['variant'] == first['variant'])
  assert cell['excluded'] == [first['seed']] and first['seed'] not in cell['seeds']
  assert first['seed'] not in cell['stats']['final_acc']['values']


def test_a_fingerprint_follows_the_golden_record_of_the_family():
  golden = json.loads((REPO / standing.GOLDEN).read_text())
  run = standing.ArchivedRun('x/runs/a/seed0', 'x', 'scarlet', 'fedjax_kd', '', 'dsfl', '', 'g')
  keys = standing.family_keys(golden, 'scarlet', 'dsfl')
  assert 'tiny/dsfl' in keys and 'scarlet_digits_dsfl/device' in keys
  assert not any(k.startswith('dsfl_mnist') for k in keys)
  text = json.dumps(golden)
  assert standing.fingerprint(run, lambda p: text) == standing.fingerprint(run, lambda p: text)
  moved = dict(golden)
  moved['scarlet_digits/device'] = []
  assert standing.fingerprint(run, lambda p: json.dumps(moved)) != standing.fingerprint(
      run, lambda p: text)
  moved = dict(golden)
  moved['dsfl_mnist_cpu/device'] = []   # another paper's case: not this run's
  assert standing.fingerprint(run, lambda p: json.dumps(moved)) == standing.fingerprint(
      run, lambda p: text)
  # A replayed round: integers exactly, accuracies to one sample in 1,000, other floats to
  # 2e-3 relative (the golden record's own comparison keeps its 5e-4); timings ignored; a
  # NaN the metrics file wrote as null is the same NaN.
  want = {'round': 1, 'up_bytes': 100, 'test_acc': 0.5, 'train_loss': 1.0, 'round_time_s': 3.0,
          'distill_loss': None}
  assert standing.same_rows({**want, 'test_acc': 0.5009, 'train_loss': 1.0019,
                             'round_time_s': 9.0, 'distill_loss': float('nan')}, want) == {}
  assert set(standing.same_rows({**want, 'test_acc': 0.502, 'up_bytes': 101,
                                 'train_loss': 1.003}, want)) == {'test_acc', 'up_bytes',
                                                                  'train_loss'}
  assert set(standing.same_rows({**want, 'train_loss': 1.001}, want, standing.REL_TOL)) == {
      'train_loss'}


def test_a_run_made_with_avx2_kernels_is_tied_by_an_avx2_replay(tmp_path, monkeypatch):
  # The archive's runs come from machines of either kind: a replay with this machine's
  # kernels that differs is tried again with AVX2's, and the tie says which matched.
  name = 'scarlet_digits'
  _copy_sweep(name, tmp_path)
  engines = {name: _sweeps()[name]}
  tried = []

  def replay(run, workdir, isa='native'):
    tried.append(isa)
    return {} if isa == 'avx2' else {'test_acc': (0.1859, 0.182)}
  monkeypatch.setattr(standing, 'replay_run', replay)
  monkeypatch.setattr(standing, 'golden_agrees', lambda *a: False)   # no tie by record
  counts = standing.tie(str(tmp_path), engines, replay=True, log=lambda s: None)
  ties = standing.load(str(tmp_path))['runs']
  runs = list(standing.iter_runs(str(tmp_path), engines))
  assert counts['replay'] == len(runs) == len(ties) and tried[:2] == ['native', 'avx2']
  assert all(t['by'].endswith('with AVX2 kernels') for t in ties.values())
  assert not standing.stale_runs(str(tmp_path), engines)
  # A tie to code whose results have changed since (another fingerprint) is made again.
  doc = standing.load(str(tmp_path))
  victim = sorted(doc['runs'])[0]
  doc['runs'][victim]['fingerprint'] = 'results that have changed since'
  (tmp_path / standing.STANDING_FILE).write_text(json.dumps(doc))
  assert list(standing.stale_runs(str(tmp_path), engines)) == [victim]
  standing.tie(str(tmp_path), engines, replay=True, log=lambda s: None)
  assert not standing.stale_runs(str(tmp_path), engines)
  # Neither kernel gives the numbers: the run stays stale, the first replay's columns kept.
  (tmp_path / standing.STANDING_FILE).unlink()
  monkeypatch.setattr(standing, 'replay_run', lambda run, w, isa='native': {
      'test_acc': (0.5 if isa == 'native' else 0.6, 0.4)})
  standing.tie(str(tmp_path), engines, replay=True, log=lambda s: None)
  doc = standing.load(str(tmp_path))
  assert not doc['runs'] and all(v == {'test_acc': [0.5, 0.4]} for v in doc['unmatched'].values())
  assert standing.isa_env('avx2')['XLA_FLAGS'].endswith('--xla_cpu_max_isa=AVX2')
