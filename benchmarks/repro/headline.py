"""The verdicts and the report's top: each check's outcome (:class:`Row`), Holm's adjustment
per paper and the four-way verdicts (:func:`decide`), the checks table of a section, the
headline sections (claims register, verdicts, accounting, what goes against the papers,
agreement, stale runs) and the README's two summary tables.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from benchmarks.repro import claims as claims_lib
from benchmarks.repro import standing as standing_lib
from benchmarks.repro import verdicts as verdicts_lib
from benchmarks.repro.checks import Check
from benchmarks.repro.defs import Section
from benchmarks.repro.stats import MIN_CLAIM_SEEDS, fmt_p, signed
from benchmarks.repro.tables import esc
from benchmarks.repro.verdicts import Finding

VERDICTS = {True: 'holds', False: 'does not hold', None: 'inconclusive'}


@dataclasses.dataclass
class Row:
  """A check's outcome in the report: its finding, then (:func:`decide`) its verdict."""
  section: Section
  check: Check
  finding: Finding
  verdict: str = ''
  p_adj: float | None = None


@dataclasses.dataclass(frozen=True)
class ChecksOf:
  """Where a section's checks table goes in the body (filled after every section ran)."""
  section: str


def decide(rows: Sequence[Row]) -> None:
  """Verdicts: Holm over each paper's tested checks, four-way verdicts with the paper's effect
  (:mod:`benchmarks.repro.verdicts`); arbiters at their raw p; agreement checks as before."""
  family = [r for r in rows if r.check.claim_id and not r.check.arbiter and r.finding.tested
            and r.finding.n >= MIN_CLAIM_SEEDS]
  for key in dict.fromkeys(r.section.key for r in family):   # one family per paper
    mine = [r for r in family if r.section.key == key]
    for r, q in zip(mine, verdicts_lib.holm([r.finding.deciding_p for r in mine])):
      r.p_adj = q
  for r in rows:
    f = r.finding
    if not r.check.claim_id:
      r.verdict = ('not run' if f.holds is None and f.detail.startswith('not run')
                   else VERDICTS[f.holds])
      continue
    p = r.p_adj if not r.check.arbiter else (f.deciding_p if f.tested else None)
    r.verdict = verdicts_lib.verdict(f, p, r.check.effect, MIN_CLAIM_SEEDS)


def _effect_text(r: Row) -> str:
  """Ours beside the paper's: the mean difference (points) or the saving (%)."""
  f = r.finding
  ours = verdicts_lib.ours_effect(f)
  if ours is None:
    return '–'
  if f.relative is not None:
    return f'{100 * abs(ours):.1f}% {"less" if ours >= 0 else "more"}'
  return f'{signed(100 * ours, 1)} points'


def _p_text(r: Row) -> str:
  f = r.finding
  if f.p is None or f.exact:
    return '–'
  raw = f'p {fmt_p(f.deciding_p)}'
  if r.p_adj is not None:
    return f'{raw}; Holm {fmt_p(r.p_adj)}'
  return raw + (' (arbiter, raw)' if r.check.arbiter else ' (not in the family)')


# A verdict table's columns: {name: (header, cell)}.
_COLUMNS: dict[str, tuple[str, Callable[[Row], str]]] = {
    'paper': ('paper', lambda r: r.section.paper),
    'claim': ('claim', lambda r: r.check.claim_id + (' (arbiter)' if r.check.arbiter else '')),
    'check': ('check', lambda r: esc(r.check.claim)),
    'sweep': ('sweep', lambda r: r.check.sweep),
    'effect': ('paper', lambda r: esc(r.check.effect_text or '–')),
    'ours': ('ours', _effect_text),
    'numbers': ('our numbers', lambda r: esc(r.finding.detail)),
    'p': ('p (raw; Holm)', _p_text),
    'verdict': ('verdict', lambda r: f'**{r.verdict}**'),
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
  out = ['**Checks of the paper\'s claims.**', '']
  out += _verdict_table([r for r in rows if r.check.claim_id],
                'claim check sweep effect ours numbers p verdict')
  others = [r for r in rows if not r.check.claim_id]
  if others:
    out += ['', '**fedjax_kd against the references, and setting checks.**', '']
    out += _verdict_table(others, 'check sweep numbers verdict')
  return out + ['']


def headline_sections(headline: Sequence[Row], agreement: Sequence[Row],
                      sections: Sequence[Section], stale: dict[str, str] | None) -> list[str]:
  """The report's top: the claims register, the verdicts, the accounting table, the
  explanations of what goes against the papers, the agreement checks and the stale runs."""
  keys = {s.key for s in sections}
  papers = {s.key: s.paper for s in sections}
  by_claim: dict[str, list[Row]] = {}
  for r in headline:
    by_claim.setdefault(r.check.claim_id, []).append(r)
  out = ['## The claims register', '',
         "Every quantitative or comparative claim of each paper's abstract, contributions and "
         'conclusion (and the results-section claims they rest on), with the paper\'s number, '
         'and what tests it here. *ours*: a comparison this report adds.', '',
         '| paper | claim | where | the paper says | the paper\'s number | tested by |',
         '|---|---|---|---|---|---|']
  for c in claims_lib.REGISTER:
    if c.paper not in keys:
      continue
    rows = [r for r in by_claim.get(c.id, []) if not r.check.arbiter]
    if c.unchecked:
      tested = f'**{verdicts_lib.NOT_CHECKABLE}**: {c.unchecked}'
    else:
      counts: dict[str, int] = {}
      for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
      tested = f'{len(rows)} check{"s" if len(rows) != 1 else ""}: ' + ', '.join(
          f'{n} {v}' for v, n in counts.items())
    name = c.id + (' *(ours)*' if c.ours else '')
    out.append(f'| {papers[c.paper]} | {name} | {esc(c.where)} | "{esc(c.quote)}" | '
               f'{esc(c.number)} | {tested} |')
  tests = [r for r in headline if not r.check.arbiter and r.verdict != verdicts_lib.EXACT]
  out += ['', "## Verdicts on the papers' claims", '',
          f'{len([r for r in tests if r.p_adj is not None])} checks in the Holm families (one '
          'per paper). The paper\'s effect is given beside ours (accuracy in points, bytes as '
          'the share saved).', '']
  out += _verdict_table(tests, 'paper claim check sweep effect ours p verdict')
  exact = [r for r in headline if r.verdict == verdicts_lib.EXACT]
  out += ['', '## Accounting: byte counts exact by construction', '',
          'These byte totals are the same in every seed: they follow from the configuration '
          '(samples, classes, rounds, model size) by the paper\'s own counting rule, so they are '
          'no test and count in no verdict. The paper\'s number is beside ours.', '']
  out += _verdict_table(exact, 'paper claim check sweep effect ours numbers')
  out += ['', '## What goes against the papers, and why', '']
  against = [r for r in tests if r.verdict in (verdicts_lib.CONTRADICTED, verdicts_lib.SMALLER)]
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
    why = claims_lib.EXPLANATIONS.get(cid)
    if why is None:
      out += ['*Why:* not yet explained.', '']
      continue
    out += [f'*Why ({why.verdict}):* {esc(why.text)}', '']
    related = [r for r in (*headline, *agreement)
               if any(_names(r, key) for key in why.related) and r not in arbiters]
    if related:
      out += ['Beside it: ' + '; '.join(map(_sentence, related)) + '.', '']
  if not against:
    out += ['Nothing.', '']
  out += ['## fedjax_kd against the independent implementations, and setting checks', '']
  out += _verdict_table(agreement, 'paper check sweep numbers verdict')
  out += ['', '## Runs that no longer stand', '']
  if stale is None:
    out += [f'Not checked: the runs\' folder has no `{standing_lib.STANDING_FILE}` '
            '(`python benchmarks/reproduction.py standing --replay` ties each run to today\'s '
            'code and writes it).']
  elif stale:
    out += [f'{len(stale)} archived runs are not tied to today\'s code (see '
            '`benchmarks/repro/standing.py`) and are left out of every number above:', '']
    out += [f'- `{path}`: {why}' for path, why in sorted(stale.items())]
  else:
    out += ['None: every archived run is tied to today\'s code by its commit\'s golden record, '
            'its reference\'s source or a replay of its first round (`benchmarks/repro/'
            'standing.py`; `python benchmarks/reproduction.py standing` ties new runs).']
  return out + ['']


SUMMARY_COLUMNS = (verdicts_lib.REPRODUCED, verdicts_lib.SMALLER, verdicts_lib.NOT_SIGNIFICANT,
                   verdicts_lib.CONTRADICTED, verdicts_lib.FEW_SEEDS, verdicts_lib.NOT_RUN)


def summary_table(headline: Sequence[Row], sections: Sequence[Section]) -> list[str]:
  """The README's summary: per paper, the checks' verdicts, the claims not checkable here and
  the exact byte counts (arbiters left out)."""
  lines = ['| paper | ' + ' | '.join(SUMMARY_COLUMNS) + ' | not checkable (claims) | exact '
           'byte counts |', '|---|' + '---|' * (len(SUMMARY_COLUMNS) + 2)]
  for s in sections:
    mine = [r for r in headline if r.section.key == s.key and not r.check.arbiter]
    count = lambda v: sum(r.verdict == v for r in mine)
    unchecked = sum(1 for c in claims_lib.REGISTER if c.paper == s.key and c.unchecked)
    lines.append(f'| {s.paper} | ' + ' | '.join(str(count(v)) for v in SUMMARY_COLUMNS)
                 + f' | {unchecked} | {count(verdicts_lib.EXACT)} |')
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
