"""The verdicts and the report's top: each check's outcome (:class:`Row`), Holm's adjustment
per paper and the verdicts (:func:`decide`, the rule of :mod:`benchmarks.reproduction.verdicts`),
the regime of each sweep (how far single-client training ends below the best collaborative
method, :func:`regime_gaps`), the checks table of a section, the headline sections (claims
register, settings, verdicts, accounting, what goes against the papers, agreement, stale runs)
and the README's summary tables.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from benchmarks.reproduction import claims as claims_lib
from benchmarks.reproduction import standing as standing_lib
from benchmarks.reproduction import verdicts as verdicts_lib
from benchmarks.reproduction.checks import Check
from benchmarks.reproduction.defs import Section, SweepDef
from benchmarks.reproduction.stats import MIN_CLAIM_SEEDS, Table, signed
from benchmarks.reproduction.tables import esc
from benchmarks.reproduction.verdicts import Finding

VERDICTS = {True: 'holds', False: 'does not hold', None: 'inconclusive'}
REGIME_GAP = 0.10   # single-client training this far below the best collaborative method


@dataclasses.dataclass
class Row:
  """A check's outcome in the report: its finding, then (:func:`decide`) its verdict.

  Attributes:
    raw: the hypotheses' raw one-sided p-values (``for``, ``against``, ``half``).
    adjusted: the same, Holm-adjusted within the paper's family (None outside it).
    family: the number of hypotheses in that family.
    needed: for an underpowered check, the seeds it would need (:class:`verdicts.Need`).
    gap: the single-client gap of the check's sweep (None where it has no floor).
  """
  section: Section
  check: Check
  finding: Finding
  verdict: str = ''
  raw: dict[str, float] = dataclasses.field(default_factory=dict)
  adjusted: dict[str, float] | None = None
  family: int = 0
  needed: verdicts_lib.Need | None = None
  gap: float | None = None

  @property
  def ours(self) -> bool:
    """A comparison this report adds, not the paper's."""
    return claims_lib.BY_ID[self.check.claim_id].ours if self.check.claim_id else False

  @property
  def in_regime(self) -> bool:
    return self.gap is not None and self.gap >= REGIME_GAP

  @property
  def decided(self) -> bool:
    return self.verdict in verdicts_lib.DECIDED

  @property
  def against_paper(self) -> bool:
    """The estimate goes against the paper: a verdict below its claim, or the estimate on the
    wrong side of the margin."""
    f = self.finding
    return (self.verdict in (verdicts_lib.CONTRADICTED, verdicts_lib.SMALLER,
                             verdicts_lib.NO_EFFECT, verdicts_lib.LEANS_AGAINST)
            or (self.verdict not in (verdicts_lib.ACCOUNTING, verdicts_lib.NOT_RUN)
                and f.mean is not None and f.mean < f.margin))

  @property
  def wants_why(self) -> bool:
    """The report explains it: it goes against the paper, or the setting cannot check it."""
    return self.against_paper or self.verdict == verdicts_lib.FLAT


@dataclasses.dataclass(frozen=True)
class ChecksOf:
  """Where a section's checks table goes in the body (filled after every section ran)."""
  section: str


@dataclasses.dataclass(frozen=True)
class Gap:
  """A sweep's regime: the best collaborative method against every client alone."""
  sweep: str
  best: str
  best_acc: float
  floor: str
  floor_acc: float
  late_gain: float | None = None   # the best method's gain over the last quarter of rounds

  @property
  def gap(self) -> float:
    return self.best_acc - self.floor_acc


def late_gain(cell: dict) -> float | None:
  """How much a cell's headline accuracy still rose over the last quarter of its rounds (mean
  over seeds of the final accuracy minus the accuracy at three quarters of the run): near 0
  where the curve has flattened."""
  gains = []
  for curves in cell.get('curves', {}).values():
    c = curves.get('test_acc')
    if c is None or len(c['round']) < 2:
      continue
    rounds, acc = list(c['round']), list(c['acc'])
    at = next(i for i, r in enumerate(rounds) if r >= 0.75 * rounds[-1])
    gains.append(acc[-1] - acc[at])
  return sum(gains) / len(gains) if gains else None


def regime_gap(d: SweepDef, tables: Mapping[str, Table]) -> Gap | None:
  """How far ``d``'s single-client floor ends below its best other method (final headline
  accuracy, mean over seeds; per grid cell where the floor has one, the smallest gap)."""
  if not d.floor or d.name not in tables:
    return None
  where, label = (d.name, d.floor) if isinstance(d.floor, str) else d.floor
  if where not in tables:
    return None
  floors = [c for c in tables[where].cells if c['variant'] == label and c['n']]
  own = {v[0] for v in d.variants} - {label}    # rows read beside from other sweeps left out
  mine = [c for c in tables[d.name].cells if c['variant'] in own and c['n']]
  gaps = []
  for f in floors:
    same = [c for c in mine if all(c['cell'].get(k) == v for k, v in f['cell'].items())
            ] if where == d.name else mine
    if not same:
      continue
    best = max(same, key=lambda c: c['stats']['final_acc']['mean'])
    gaps.append(Gap(d.name, best['label'], best['stats']['final_acc']['mean'], f['label'],
                    f['stats']['final_acc']['mean'], late_gain(best)))
  return min(gaps, key=lambda g: g.gap) if gaps else None


def method_gap(d: SweepDef, tables: Mapping[str, Table], algorithm: str) -> Gap | None:
  """How far the paper's method (``d.reference``, else the sweep's variant of ``algorithm``
  with no fields changed) ends above its strongest baseline: the best variant of another
  algorithm, single-client training left out (final headline accuracy, mean over seeds; the
  smallest margin over grid cells)."""
  if d.name not in tables:
    return None
  own = [v for v in d.variants if (v[0] == d.reference if d.reference
                                    else v[1] == algorithm and not v[2])]
  if len(own) != 1:
    return None
  label, algo = own[0][0], own[0][1]
  floor = d.floor if isinstance(d.floor, str) else ''
  others = {v[0] for v in d.variants if v[1] != algo and v[0] != floor and v[1] != 'single'}
  cells = [c for c in tables[d.name].cells if c['n']]
  gaps = []
  for m in (c for c in cells if c['variant'] == label):
    same = [c for c in cells if c['variant'] in others and c['cell'] == m['cell']]
    if same:
      best = max(same, key=lambda c: c['stats']['final_acc']['mean'])
      gaps.append(Gap(d.name, m['label'], m['stats']['final_acc']['mean'], best['label'],
                      best['stats']['final_acc']['mean']))
  return min(gaps, key=lambda g: g.gap) if gaps else None


def decide(rows: Sequence[Row], gaps: Mapping[str, Gap | None] | None = None) -> None:
  """Verdicts: Holm over every hypothesis of each paper's tested checks, the verdict rule of
  :mod:`benchmarks.reproduction.verdicts` with the paper's effect; arbiters at their raw p;
  agreement checks as before; each row's regime gap."""
  gaps = gaps or {}
  for r in rows:
    g = gaps.get(r.check.sweep)
    r.gap = None if g is None else g.gap
  family = [r for r in rows if r.check.claim_id and not r.check.arbiter
            and not r.check.accounting and r.finding.tested
            and r.finding.n >= MIN_CLAIM_SEEDS]
  for key in dict.fromkeys(r.section.key for r in family):   # one family per paper
    mine = [r for r in family if r.section.key == key]
    raws = [verdicts_lib.hypotheses(r.finding, r.check.effect) for r in mine]
    size = sum(len(h) for h in raws)
    for r, raw, adj in zip(mine, raws, verdicts_lib.adjust(raws)):
      r.raw, r.adjusted, r.family = raw, adj, size
  for r in rows:
    f = r.finding
    if not r.check.claim_id:
      r.verdict = ('not run' if f.holds is None and f.detail.startswith('not run')
                   else VERDICTS[f.holds])
      continue
    if r.check.arbiter and f.tested:   # an independent implementation, at its raw p
      r.raw = verdicts_lib.hypotheses(f, r.check.effect)
      adjusted = r.raw if f.n >= MIN_CLAIM_SEEDS else None
    else:
      adjusted = r.adjusted
    r.verdict = verdicts_lib.verdict(f, adjusted, r.check.effect, MIN_CLAIM_SEEDS,
                                     accounting=r.check.accounting, bound=r.check.at_least)
    if r.verdict == verdicts_lib.UNDERPOWERED:
      r.needed = verdicts_lib.seeds_needed(
          f, r.check.effect, verdicts_lib.LEVEL / max(r.family, 1), bound=r.check.at_least)


def _effect_text(r: Row) -> str:
  """Ours beside the paper's: the mean difference (points) or the saving (%)."""
  f = r.finding
  ours = verdicts_lib.ours_effect(f)
  if ours is None:
    return '–'
  if f.kind == 'ratio':
    return f'x{np.exp(f.mean):.1f} ({100 * ours:.1f}% less)'
  if f.relative is not None:
    return f'{100 * abs(ours):.1f}% {"less" if ours >= 0 else "more"}'
  if f.kind == 'rounds':
    return f'{signed(ours, 1)} rounds'
  if f.kind == 'value':
    return signed(ours, 3)
  return f'{signed(100 * ours, 1)} points'


def fmt_p(p: float | None) -> str:
  if p is None:
    return '–'
  return '<0.001' if p < 0.0005 else f'{p:.3f}'


def _ps(ps: Mapping[str, float] | None) -> str:
  """``for / against / half`` p-values ('–' where a hypothesis is absent)."""
  if not ps:
    return '–'
  return ' / '.join(fmt_p(ps.get(k)) for k in verdicts_lib.HYPOTHESES)


def _raw_text(r: Row) -> str:
  if not r.raw:
    return '–'
  return _ps(r.raw) + (' (arbiter, raw)' if r.check.arbiter else '')


def _verdict_text(r: Row) -> str:
  text = f'**{r.verdict}**'
  if r.verdict == verdicts_lib.UNDERPOWERED and r.needed is not None:
    text += f' ({r.needed.text})'
  elif r.verdict == verdicts_lib.FLAT:
    text += ' (every seed the same difference: the setting cannot move it)'
  return text


def _gap_text(r: Row) -> str:
  return '–' if r.gap is None else f'{signed(100 * r.gap, 1)}'


# A verdict table's columns: {name: (header, cell)}.
_COLUMNS: dict[str, tuple[str, Callable[[Row], str]]] = {
    'paper': ('paper', lambda r: r.section.paper),
    'claim': ('claim', lambda r: r.check.claim_id + (' *(ours)*' if r.ours else '')
              + (' (arbiter)' if r.check.arbiter else '')),
    'check': ('check', lambda r: esc(r.check.claim)),
    'sweep': ('sweep', lambda r: r.check.sweep),
    'gap': ('single-client gap (points)', _gap_text),
    'effect': ('paper', lambda r: esc(r.check.effect_text or '–')),
    'ours': ('ours', _effect_text),
    'n': ('n', lambda r: str(r.finding.n) if r.finding.n else '–'),
    'numbers': ('our numbers', lambda r: esc(r.finding.detail)),
    'p': ('raw p (for / against / half)', _raw_text),
    'adj': ('Holm (for / against / half)', lambda r: _ps(r.adjusted)),
    'verdict': ('verdict', _verdict_text),
}


def _verdict_table(rows: Sequence[Row], columns: str) -> list[str]:
  """A table of checks with the named :data:`_COLUMNS` (space-separated)."""
  cols = [_COLUMNS[c] for c in columns.split()]
  return (['| ' + ' | '.join(h for h, _ in cols) + ' |', '|' + '---|' * len(cols)]
          + ['| ' + ' | '.join(cell(r) for _, cell in cols) + ' |' for r in rows])


def _names(r: Row, key: tuple[str, ...]) -> bool:
  """Whether ``key`` (an explanation's ``(claim id, sweep[, words])``) names check ``r``."""
  claim, sweep, *words = key
  return ((r.check.claim_id or '') == claim and r.check.sweep == sweep
          and all(w in r.check.claim for w in words))


def _sentence(r: Row) -> str:
  return f'{esc(r.check.claim)} ({r.check.sweep}): **{r.verdict}**, {esc(r.finding.detail)}'


def checks_table(rows: Sequence[Row]) -> list[str]:
  """A section's checks: the papers' (with the paper's effect beside ours), then the rest."""
  out = ['**Checks of the paper\'s claims** (and ours, marked).', '']
  out += _verdict_table([r for r in rows if r.check.claim_id],
                        'claim check sweep gap effect ours numbers p adj verdict')
  others = [r for r in rows if not r.check.claim_id]
  if others:
    out += ['', '**fedjax_kd against the references, and setting checks.**', '']
    out += _verdict_table(others, 'check sweep numbers verdict')
  return out + ['']


def rule_text() -> str:
  """The verdict rule, as the report's header states it (the code is
  :mod:`benchmarks.reproduction.verdicts`)."""
  lv = f'{100 * verdicts_lib.LEVEL:g}%'
  return (
      "**A paper's claim** is tested on the per-seed differences d between the two sides "
      '(paired by seed), oriented so that the claim reads mean(d) > m (m = 0, or -tol for '
      '"within tol of"). Each check carries up to three one-sided paired t-tests: *for* (H0: '
      'mean(d) ≤ m), *against* (H0: mean(d) ≥ m) and, where the paper gives a number E, *half* '
      '(H0: mean(d) ≥ E/2). A bytes claim is tested on the ratio: d is the per-seed log of the '
      'baseline\'s bytes over ours and E the log of the paper\'s ratio, so half the effect is '
      'the square root of the ratio ("x28.6" halves to x5.3); a claim of "at least" a ratio is '
      'reproduced only at that ratio. Holm\'s method at '
      f'{lv} runs over every such hypothesis of a paper\'s checks together (one family per '
      f'paper), so the chance that any rejection about a paper is false stays at {lv}. With at '
      f'least {MIN_CLAIM_SEEDS} paired seeds the verdict is the first that applies: '
      '**contradicted** (*against* rejected); **reproduced** (*for* rejected and our estimate '
      'at least E/2, or the paper gives no E, or at least the bound of an "at least" claim); '
      '**smaller effect** (*for* rejected, estimate '
      'below E/2); **no effect** (*half* rejected: an effect of half the paper\'s size is '
      'excluded); **leans against** (nothing rejected, the estimate on the wrong side of m); '
      '**underpowered** (nothing rejected; the check says how many seeds would detect half '
      f'the paper\'s effect with {100 * verdicts_lib.POWER:g}% power at its measured spread, '
      f'at the family\'s Bonferroni level {lv}/m, which Holm\'s first step uses, or, where '
      'our estimate lies below half the paper\'s effect, that no seed count would reproduce '
      'it and how many would decide it as it stands). The first four are *decided*. Where '
      'every seed gives the same difference (zero spread: bit-identical sides, when it is 0) '
      'the comparison is **not checkable in this setting**, never decided: the setting '
      'cannot move it (an ablation whose switch changes nothing where every client is '
      'alike, say). Each check prints its raw and adjusted p-values (for / against / '
      'half), the paper\'s effect beside ours, and the unadjusted 90% interval of mean(d), for '
      'reading only: the verdict uses the adjusted p-values and the estimate. A byte count '
      'that follows from the configuration and the random draws alone is no test: '
      '**accounting**, listed with the paper\'s number beside ours. Checks on an independent '
      'implementation (the authors\' code, a PyTorch reference) are **arbiters**: shown under '
      'the claim at their raw p, they say whether a verdict against the paper belongs to '
      'fedjax_kd or to the setting. A claim no sweep here can test is **not checkable here**, '
      'with the reason. *(ours)* marks a comparison this report adds; the papers\' claims and '
      'ours are counted apart. **The regime**: each sweep prints how far single-client training '
      'ends below its best collaborative method (final accuracy on the same test data); a '
      f'paper\'s effect can show where that gap is at least {100 * REGIME_GAP:g} points.')


def _claim_counts(rows: Sequence[Row]) -> str:
  counts: dict[str, int] = {}
  for r in rows:
    counts[r.verdict] = counts.get(r.verdict, 0) + 1
  return (f'{len(rows)} check{"s" if len(rows) != 1 else ""}: '
          + ', '.join(f'{n} {v}' for v, n in counts.items()))


def decided_in_regime(headline: Sequence[Row], paper: str, ours: bool = False) -> list[str]:
  """The claims of ``paper`` (the paper's own, or ours) with a decided check in a sweep of the
  regime, in register order."""
  ids = {r.check.claim_id for r in headline if r.section.key == paper and not r.check.arbiter
         and r.ours == ours and r.decided and r.in_regime}
  return [c.id for c in claims_lib.REGISTER if c.id in ids]


def headline_sections(headline: Sequence[Row], agreement: Sequence[Row],
                      sections: Sequence[Section], stale: dict[str, str] | None,
                      gaps: Mapping[str, Gap | None],
                      tied: Mapping[str, int] | None = None) -> list[str]:
  """The report's top: the claims register, the settings' regimes, the verdicts, the
  accounting table, the explanations of what goes against the papers, the agreement checks
  and the stale runs."""
  keys = {s.key for s in sections}
  papers = {s.key: s.paper for s in sections}
  by_claim: dict[str, list[Row]] = {}
  for r in headline:
    by_claim.setdefault(r.check.claim_id, []).append(r)
  out = ['## The claims register', '',
         "Every quantitative or comparative claim of each paper's abstract, contributions, "
         'results and conclusion, with the paper\'s words and number, and what tests it here. '
         '*ours*: a comparison this report adds.', '',
         '| paper | claim | where | the paper says | the paper\'s number | tested by |',
         '|---|---|---|---|---|---|']
  for c in claims_lib.REGISTER:
    if c.paper not in keys:
      continue
    rows = [r for r in by_claim.get(c.id, []) if not r.check.arbiter]
    tested = (f'**{verdicts_lib.NOT_CHECKABLE}**: {c.unchecked}' if c.unchecked
              else _claim_counts(rows))
    name = c.id + (' *(ours)*' if c.ours else '')
    out.append(f'| {papers[c.paper]} | {name} | {esc(c.where)} | "{esc(c.quote)}" | '
               f'{esc(c.number)} | {tested} |')
  out += ['', '## The settings: where collaboration can show', '',
          'For each sweep with single-client training, its final accuracy against the best '
          'other method of the sweep (mean over seeds, the same test data), and how much that '
          'method still gained over the last quarter of its rounds (near 0: the curve has '
          'flattened). A paper\'s effect can show where single-client training ends at least '
          f'{100 * REGIME_GAP:g} points below.', '',
          '| sweep | best method | its acc | its gain over the last quarter of rounds (points) '
          '| single client | its acc | gap (points) | regime |', '|---|---|---|---|---|---|---|---|']
  for s in sections:
    for d in s.sweeps:
      g = gaps.get(d.name)
      if g is not None:
        late = '–' if g.late_gain is None else signed(100 * g.late_gain, 1)
        out.append(f'| {d.name} | {esc(g.best)} | {g.best_acc:.3f} | {late} | {esc(g.floor)} | '
                   f'{g.floor_acc:.3f} | {signed(100 * g.gap, 1)} | '
                   f'{"yes" if g.gap >= REGIME_GAP else "no"} |')
  out += ['', 'Per paper, its own claims with a decided verdict (reproduced, smaller effect, no '
          'effect or contradicted) in a sweep of the regime:', '']
  for s in sections:
    own = decided_in_regime(headline, s.key)
    mine = decided_in_regime(headline, s.key, ours=True)
    out.append(f'- {s.paper}: {len(own)} of its claims'
               + (f' ({", ".join(own)})' if own else '')
               + (f'; ours: {", ".join(mine)}' if mine else '') + '.')
  tests = [r for r in headline if not r.check.arbiter
           and r.verdict != verdicts_lib.ACCOUNTING]
  fam = {}
  for r in tests:
    if r.family:
      fam[r.section.paper] = r.family
  out += ['', "## Verdicts on the papers' claims", '',
          'Hypotheses in the Holm families: ' + ', '.join(f'{p} {m}' for p, m in fam.items())
          + '. The paper\'s effect is given beside ours (accuracy in points, bytes as the '
          'share saved).', '']
  out += _verdict_table(tests, 'paper claim check sweep gap effect ours n p adj verdict')
  accounting = [r for r in headline if r.verdict == verdicts_lib.ACCOUNTING
                and not r.check.arbiter]
  out += ['', '## Accounting: byte counts of the configuration and the draws', '',
          'These byte counts follow from the configuration (samples, classes, rounds, model '
          'size) and the random draws alone (which samples a round draws, which labels the cache '
          'holds), by the paper\'s own counting rule, not from what the models learn: they are '
          'no test and count in no verdict. The paper\'s number is beside ours.', '']
  out += _verdict_table(accounting, 'paper claim check sweep effect ours numbers')
  out += ['', '## What goes against the papers, and why', '',
          'Every check of a paper\'s claim whose estimate goes against the paper (contradicted, '
          'smaller effect, no effect, leans against, or an estimate on the wrong side of the '
          'margin), and every check this setting cannot check (the two sides the same in '
          'every seed), with what the independent implementations show at the same setting '
          'and the explanation, or *unexplained*.', '']
  against = [r for r in tests if not r.ours and r.wants_why]
  for cid in dict.fromkeys(r.check.claim_id for r in against):
    mine = [r for r in against if r.check.claim_id == cid]
    arbiters = [r for r in by_claim.get(cid, []) if r.check.arbiter]
    out.append(f'**{cid}** ({mine[0].section.paper}): '
               + '; '.join(f'{esc(r.check.claim)} in {r.check.sweep}: **{r.verdict}** '
                           f'({_effect_text(r)} against the paper\'s '
                           f'{esc(r.check.effect_text or "margin")})' for r in mine) + '.')
    out.append('')
    if arbiters:
      out.append('The independent implementations at the same setting: '
                 + '; '.join(map(_sentence, arbiters)) + '.')
      out.append('')
    covered = set()
    for why in claims_lib.explanations(cid):
      hit = [r for r in mine if why.covers(r.check.sweep, r.check.claim)]
      if not hit:
        continue
      covered.update(id(r) for r in hit)
      where = ', '.join(dict.fromkeys(r.check.sweep for r in hit))
      out += [f'*Why ({why.verdict}; {where}):* {esc(why.text)}', '']
      related = [r for r in (*headline, *agreement)
                 if any(_names(r, key) for key in why.related) and r not in arbiters]
      if related:
        out += ['Beside it: ' + '; '.join(map(_sentence, related)) + '.', '']
    left = [r for r in mine if id(r) not in covered]
    if left:
      out += ['*Unexplained* (' + ', '.join(dict.fromkeys(r.check.sweep for r in left))
              + '): nothing here accounts for it yet.', '']
  if not against:
    out += ['Nothing.', '']
  out += ['## fedjax_kd against the independent implementations, and setting checks', '']
  out += _verdict_table(agreement, 'paper check sweep numbers verdict')
  out += ['', '## Runs that no longer stand', '']
  if stale is None:
    out += [f'Not checked: the runs\' folder has no `{standing_lib.STANDING_FILE}` '
            '(`python -m benchmarks.reproduction standing --replay` ties each run to today\'s '
            'code and writes it).']
  else:
    tied = tied or {}
    out += [f'{sum(tied.values())} archived runs stand, tied to today\'s code '
            '(`benchmarks/reproduction/standing.py`; `python -m benchmarks.reproduction standing` '
            f'ties new runs): {tied.get("record", 0)} by the golden record of the commit that '
            'made them (a commit in this repository\'s history whose record agrees with '
            f'today\'s on their paper\'s cases), {tied.get("replay", 0)} by a replay of their '
            'first round with today\'s code, and '
            f'{tied.get("source", 0)} by their reference\'s source, unchanged since.', '']
    if stale:
      out += [f'{len(stale)} archived runs are not tied to today\'s code and are left out of '
              'every number above:', '']
      out += [f'- `{path}`: {why}' for path, why in sorted(stale.items())]
    else:
      out += ['None is left out: every archived run is tied.']
  return out + ['']


SUMMARY_COLUMNS = verdicts_lib.COUNTED


def summary_table(headline: Sequence[Row], sections: Sequence[Section]) -> list[str]:
  """The README's summary: per paper, a row for its own claims and a row for ours. The claims
  (in the register, decided in the regime, not checkable here) and the checks that test them
  (how many, then their verdicts, arbiters left out) are counted in columns of their own."""
  lines = ['| paper | claims | decided in the regime | no sweep here | checks | '
           + ' | '.join(SUMMARY_COLUMNS) + ' | accounting |',
           '|---|' + '---|' * (len(SUMMARY_COLUMNS) + 5)]
  for s in sections:
    for ours in (False, True):
      register = [c for c in claims_lib.REGISTER if c.paper == s.key and c.ours == ours]
      if not register:
        continue
      mine = [r for r in headline if r.section.key == s.key and not r.check.arbiter
              and r.ours == ours]
      count = lambda v: sum(r.verdict == v for r in mine)
      unchecked = sum(1 for c in register if c.unchecked)
      lines.append(f'| {s.paper}{" (ours)" if ours else ""} | {len(register)} | '
                   f'{len(decided_in_regime(headline, s.key, ours))} | {unchecked} | '
                   f'{len(mine)} | ' + ' | '.join(str(count(v)) for v in SUMMARY_COLUMNS)
                   + f' | {count(verdicts_lib.ACCOUNTING)} |')
  return lines


def agreement_table(agreement: Sequence[Row]) -> list[str]:
  """The README's second summary: per paper, the agreement checks' verdicts."""
  order = [VERDICTS[True], VERDICTS[False], VERDICTS[None], 'not run']
  counts: dict[str, dict[str, int]] = {}
  for r in agreement:
    counts.setdefault(r.section.paper, dict.fromkeys(order, 0))[r.verdict] += 1
  lines = ['| paper | ' + ' | '.join(order) + ' |', '|---|' + '---|' * len(order)]
  for paper, c in counts.items():
    lines.append(f'| {paper} | ' + ' | '.join(str(c[v]) for v in order) + ' |')
  return lines
