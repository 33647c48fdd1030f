"""Whether an archived run still stands for today's code: the report's stale-run rule.

A run *stands* when something ties its numbers to today's code. The ties, tried in order:

* **record**: the run's ``summary.json`` records a clean commit (no uncommitted changes)
  in this repository's history (a commit no clone holds ties nothing, and a run tied to one
  is stale until replayed) and the golden record (``tests/golden_metrics.json``) at that commit
  agrees with today's, within the golden test's own tolerances, on every case of the run's paper
  family and the tiny case of its algorithm.
* **source** (a PyTorch reference or the driver of the SCARLET authors' code): the
  reference's source files at the clean commit the run was made at (:func:`made_at`) are
  today's, byte for byte.
* **replay**: today's code, given the run's own config, replays the run's first round and
  gives the recorded round-1 metrics (integers exactly, accuracies to one test sample and
  at least :data:`REPLAY_ACC`, other floats to :data:`REPLAY_REL` relative). One replay
  stands for its group (:func:`same_code`): the runs of one sweep variant (and grid cell)
  made at the same clean commit on the same kind of device. A run made with uncommitted
  changes is its own group. A run made on a GPU is replayed on one (a CPU's float kernels
  are not a GPU's).

A tie is made against a fingerprint of today's code: the sha256 of the family's golden
entries (fedjax_kd runs) or of the reference's source files. ``standing.json`` in the
archive records each run's tie and that fingerprint; :func:`stale_runs` recomputes today's
fingerprints from the working tree (no git needed) and calls a run stale when it has no
entry or its fingerprint differs. A change that moves the golden record (a result meant to
change) or edits a reference thereby makes every run it may touch stale until
``python -m benchmarks.reproduction standing`` ties it again, by record or by replay.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterator, Mapping

from benchmarks.reproduction import archive as archive_lib
from fedjax_kd.running import results

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
GOLDEN = 'tests/golden_metrics.json'
STANDING_FILE = 'standing.json'

# The golden cases that stand for a paper's runs: the cases of its shipped configs.
FAMILIES = {
    'dsfl': ('default', 'digits_', 'dsfl_'),
    'scarlet': ('scarlet_',),
    'fedcache2': ('fedcache2_',),
    'acepfl': ('acepfl_',),
    'fedentopt': ('fedentopt_',),
}
TORCH_COMMON = tuple(f'benchmarks/references/pytorch/{name}'
                     for name in ('__init__.py', '__main__.py', 'common.py'))
OFFICIAL_SOURCES = ('benchmarks/references/scarlet_official.py',)

# Golden tolerances (tests/test_golden.py): floats relative, with a floor.
REL_TOL = 5e-4
# A replayed accuracy: one test sample (the golden test's rule), and at least one in 1,000.
# A replay that differs by more is not the same computation.
REPLAY_ACC = 1e-3
# A replayed loss or entropy, relative: a whole round of training on real data carries the
# last bits further than the golden record's tiny cases (measured: 7.6e-4 on FD's mean
# client test loss with every accuracy equal, dsfl_digits seed 3).
REPLAY_REL = 2e-3
# The CPU kernels a replay may try, in order. XLA and PyTorch both choose their float kernels
# by the CPU's instruction set, so a round run on an AVX2 machine is replayed bit for bit
# only with the wider kernels turned off (measured: the SCARLET authors' CNN, DS-FL seed 0,
# gives round-1 accuracy 0.1859 with this machine's kernels and the archived 0.1820 with
# AVX2's). A run stands when either replay gives its numbers; its tie says which.
ISAS = {
    'native': {},
    'avx2': {'XLA_FLAGS': '--xla_cpu_max_isa=AVX2', 'ATEN_CPU_CAPABILITY': 'avx2',
             'ONEDNN_MAX_CPU_ISA': 'AVX2'},
}


@dataclasses.dataclass(frozen=True)
class ArchivedRun:
  """One finished run of the archive.

  Attributes:
    path: its workdir, relative to the archive (``<sweep>/runs/<variant>[/<cell>]/seed<n>``).
    sweep: the sweep's name.
    section: the paper's key (:data:`FAMILIES`).
    engine: ``'fedjax_kd'``, ``'torch'`` or ``'official'``.
    module: the PyTorch reference's module (``benchmarks/references/pytorch/<module>.py``).
    algorithm: the algorithm it ran.
    commit: the commit its summary records (``+dirty`` kept), '' if none.
    platform: where it ran (``'cpu'``, ``'gpu'``), from its summary (``'cpu'`` if unrecorded).
    group: the sweep, variant, grid cell, recorded commit and platform.
    plan_commit: the commit its sweep's plan records (the last ``run`` of the sweep), ''
      if none: the commit of a run whose summary records none (a reference's run).
  """
  path: str
  sweep: str
  section: str
  engine: str
  module: str
  algorithm: str
  commit: str
  group: str
  platform: str = 'cpu'
  plan_commit: str = ''


def _sha(parts: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def family_keys(golden: Mapping[str, Any], section: str, algorithm: str) -> list[str]:
  """The golden cases that stand for a run of ``algorithm`` in ``section``'s sweeps."""
  prefixes = FAMILIES[section]
  return sorted(k for k in golden
                if k.split('/')[0].startswith(prefixes) or k == f'tiny/{algorithm}')


def sources(run: ArchivedRun) -> tuple[str, ...]:
  """The files whose content is a reference run's code."""
  if run.engine == 'torch':
    return (f'benchmarks/references/pytorch/{run.module}.py',) + TORCH_COMMON
  return OFFICIAL_SOURCES


def fingerprint(run: ArchivedRun, read: Callable[[str], str | None]) -> str | None:
  """The fingerprint of the code a run's numbers depend on, with ``read(path)`` giving a
  repository file's text (today's working tree, or a commit's); None if a file is missing."""
  if run.engine == 'fedjax_kd':
    text = read(GOLDEN)
    if text is None:
      return None
    golden = json.loads(text)
    keys = family_keys(golden, run.section, run.algorithm)
    return _sha({k: golden[k] for k in keys}) if keys else None
  texts = {p: read(p) for p in sources(run)}
  return None if any(v is None for v in texts.values()) else _sha(texts)


def read_today(path: str) -> str | None:
  full = os.path.join(REPO, path)
  if not os.path.exists(full):
    return None
  with open(full, encoding='utf-8') as f:
    return f.read()


def _git(*args: str) -> str | None:
  r = subprocess.run(['git', *args], cwd=REPO, capture_output=True, text=True, check=False)
  return r.stdout if r.returncode == 0 else None


def in_history(commit: str) -> bool | None:
  """Whether ``commit`` is in this repository's history (HEAD or an ancestor of it); None
  where there is no git repository to ask (a tie by record is then taken as it stands)."""
  if _git('rev-parse', '--git-dir') is None:
    return None
  return _git('merge-base', '--is-ancestor', commit, 'HEAD') is not None


def read_at(commit: str) -> Callable[[str], str | None]:
  return lambda path: _git('show', f'{commit}:{path}')


def _clean(commit: str) -> bool:
  return bool(commit) and not commit.endswith('+dirty')


def made_at(run: ArchivedRun) -> str:
  """The clean commit whose code made ``run``: the one its summary records, or for a run
  whose summary records none (a reference's run) its sweep plan's; '' when that commit had
  uncommitted changes or none is recorded."""
  commit = run.commit or run.plan_commit
  return commit if _clean(commit) else ''


def same_code(run: ArchivedRun) -> str:
  """The runs that share this key were made by the same code, so one replay decides them
  all: the same sweep, variant and grid cell at the same clean commit (:func:`made_at`).
  A run made with uncommitted changes, or at no recorded commit, is alone in its group."""
  commit = made_at(run)
  return f'{run.group}|{commit}' if commit else f'{run.group}|{run.path}'


def iter_runs(archive: str, sweeps: Mapping[str, tuple[str, str, str]]) -> Iterator[ArchivedRun]:
  """Every finished run of the sweeps in a directory tree.

  Args:
    archive: a tree of sweep folders: a runs directory, or a compact archive's extracted
      tree (:func:`benchmarks.reproduction.archive.open_runs`).
    sweeps: ``{sweep: (section, engine, torch module)}``.
  """
  for name in sorted(sweeps):
    plan_path = os.path.join(archive, name, 'sweep.json')
    if not os.path.exists(plan_path):
      continue
    with open(plan_path, encoding='utf-8') as f:
      plan = json.load(f)
    section, engine, module = sweeps[name]
    plan_commit = (plan.get('meta') or {}).get('commit') or ''
    for e in plan.get('runs', []):
      path = os.path.join(name, e['workdir'])
      summary_path = os.path.join(archive, path, 'summary.json')
      if not os.path.exists(summary_path):
        continue
      with open(summary_path, encoding='utf-8') as f:
        summary = json.load(f)
      commit = summary.get('git_commit') or ''
      cell = json.dumps(e.get('cell', []))
      platform = (summary.get('device') or {}).get('platform') or 'cpu'
      yield ArchivedRun(path=path, sweep=name, section=section, engine=engine, module=module,
                        algorithm=e.get('algorithm') or summary.get('algorithm', ''),
                        commit=commit, platform=platform,
                        group=f'{name}|{e["variant"]}|{cell}|{commit}|{platform}',
                        plan_commit=plan_commit)


def load(archive: str) -> dict[str, Any]:
  path = os.path.join(archive, STANDING_FILE)
  if not os.path.exists(path):
    return {'runs': {}}
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def stale_runs(archive: str, sweeps: Mapping[str, tuple[str, str, str]],
               tree: str | None = None) -> dict[str, str]:
  """``{run path: why}`` for every finished run of the archive that does not stand today.

  ``standing.json`` is read from ``archive``; the runs from ``tree`` when given (the
  archive already opened with :func:`benchmarks.reproduction.archive.open_runs`), else from the
  archive, opened here."""
  if tree is None:
    with archive_lib.open_runs(archive) as opened:
      return stale_runs(archive, sweeps, opened)
  ties = load(archive).get('runs', {})
  today: dict[tuple, str | None] = {}
  known: dict[str, bool | None] = {}
  out: dict[str, str] = {}
  for run in iter_runs(tree, sweeps):
    key = (run.engine, run.section, run.algorithm, run.module)
    if key not in today:
      today[key] = fingerprint(run, read_today)
    tie = ties.get(run.path)
    if tie is None:
      out[run.path] = 'nothing ties it to any code (no entry in standing.json)'
    elif tie.get('fingerprint') != today[key]:
      out[run.path] = (f'tied by {tie.get("tie")} to code whose results have changed since '
                       '(the golden record or the reference source differs)')
    elif _outside_history(tie, known):
      # A tie to a commit is only as good as the commit: one no clone can check is none.
      out[run.path] = (f'tied by {tie["tie"]} to commit {tie["by"].split()[0][:7]}, which is '
                       "not in this repository's history: replay it")
  return out


def _outside_history(tie: Mapping[str, Any], known: dict[str, bool | None] | None = None
                     ) -> bool:
  """Whether ``tie`` is to a commit (by record or source) that this repository's history
  does not hold; ``known`` caches the answers by commit."""
  if tie.get('tie') not in ('record', 'source'):
    return False
  commit = (tie.get('by') or '?').split()[0]   # a tie to no commit is to none in the history
  known = {} if known is None else known
  if commit not in known:
    known[commit] = in_history(commit)
  return known[commit] is False


def tie_counts(archive: str, sweeps: Mapping[str, tuple[str, str, str]], tree: str,
               stale: Mapping[str, str]) -> dict[str, int]:
  """``{kind: runs}``: how many of the archive's runs (``tree``, the archive opened) stand,
  by the kind of their tie (``record``, ``replay``, ``source``)."""
  ties = load(archive).get('runs', {})
  out: dict[str, int] = {}
  for run in iter_runs(tree, sweeps):
    if run.path not in stale and run.path in ties:
      kind = ties[run.path].get('tie', '')
      out[kind] = out.get(kind, 0) + 1
  return out


# ------------------------------------------------------------ making ties
def same_rows(got: Mapping[str, Any], want: Mapping[str, Any],
              rel: float = REPLAY_REL, acc: float = REPLAY_ACC) -> dict[str, tuple]:
  """The columns of a replayed round that differ from the recorded one (timings ignored):
  integers exactly, accuracies to ``acc``, other floats to ``rel``."""
  return results.differing(got, want, accuracy_tol=acc, rel_tol=rel)


def golden_agrees(old: Mapping[str, Any], new: Mapping[str, Any], keys: list[str]) -> bool:
  """Whether the golden record ``old`` gives ``new``'s rows on every one of ``keys`` it has
  (and has at least one), within the golden tolerances."""
  shared = [k for k in keys if k in old]
  if not shared:
    return False
  for k in shared:
    a, b = old[k], new[k]
    if len(a) != len(b):
      return False
    for ra, rb in zip(a, b):
      if sorted(ra) != sorted(rb) or same_rows(ra, rb, REL_TOL):
        return False
  return True


def _first_row(path: str) -> dict[str, Any]:
  with open(os.path.join(path, 'metrics.jsonl'), encoding='utf-8') as f:
    return json.loads(f.readline())


def replay_fedjax(workdir: str) -> dict[str, tuple]:
  """Replays a fedjax_kd run's first round from its own config; the differing columns."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd import runner  # pylint: disable=g-import-not-at-top
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    c = ml_collections.ConfigDict(json.load(f))
  c.checkpoint.every = 0
  spec = config_lib.validate(c)
  with tempfile.TemporaryDirectory() as tmp:
    runner.run(spec, tmp, resume=False, progress=False, until=1)
    got = _first_row(tmp)
  return compare_replay(got, _first_row(workdir), acc=max(REPLAY_ACC, one_sample(spec)))


def compare_replay(got: Mapping[str, Any], want: Mapping[str, Any],
                   acc: float = REPLAY_ACC) -> dict[str, tuple]:
  """The differing columns of a replayed first round ``got`` against the recorded ``want``.

  A column the run logged that today's code no longer logs at all is no number of today's
  code (earlier code logged ``server_ua`` for every algorithm with per-client test splits,
  today's for parameter exchange alone): the replay compares the columns both log and, when
  they agree, names the others under :data:`GONE`. A missing column every round has
  (:data:`ROUND_COLUMNS`) is another program, a difference."""
  gone = sorted(k for k in want if k not in got and not k.endswith('_s'))
  if not gone or set(gone) & set(ROUND_COLUMNS):
    return same_rows(got, want, acc=acc)
  diff = same_rows(got, {k: v for k, v in want.items() if k in got}, acc=acc)
  return diff or {GONE: (gone, None)}


# The columns every round logs: a replay that lacks one of them is another program.
ROUND_COLUMNS = ('round', 'test_acc', 'up_bytes', 'down_bytes')
# The key under which a replay that matches on every column today's code logs names the
# columns only the run logged.
GONE = 'not logged by today\'s code'


def one_sample(spec: Any) -> float:
  """One test sample of the run's test set as an accuracy (a single borderline prediction,
  the golden test's rule; 1/360 on the embedded digits)."""
  from fedjax_kd.data import sources  # pylint: disable=g-import-not-at-top
  d = spec.data
  data = sources.load_source(d.source, data_dir=d.data_dir or None, seed=0, field='',
                             label_key=d.label_key or None)
  return 1.001 / max(len(data.y_test), 1)


def replay_torch(workdir: str, module_name: str, threads: int = 1) -> dict[str, tuple]:
  """Replays a PyTorch reference run's first round from its own config and switches; the
  differing columns. Needs PyTorch (the report's ``[test]`` install has none)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  from benchmarks.references.pytorch import common  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(f'benchmarks.references.pytorch.{module_name}')
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    doc = json.load(f)
  options = doc.pop('reference')
  # Runs made before the references shared one driver name their script instead of its
  # switches: PyTorch's defaults, which a replay then holds them to.
  options = common.RefOptions(**options) if isinstance(options, dict) else common.RefOptions()
  doc.pop('engine', None)
  cfg = ml_collections.ConfigDict(doc)
  torch.set_num_threads(threads)
  setting = common.export_setting(cfg, module.ALGORITHMS)
  row = next(iter(module.rounds(common.Context(setting, options, int(doc['seed'])))))
  row.pop('nonfinite', None)
  return same_rows(row, _first_row(workdir))


# Where the SCARLET authors' code and its Python live (docs/scarlet_official.md sets them up).
OFFICIAL_CHECKOUT = os.environ.get('SCARLET_CHECKOUT', '/work/scarlet_ref')
OFFICIAL_PYTHON = os.environ.get('SCARLET_PYTHON', '/work/venvs/scarlet/bin/python')


def isa_env(isa: str) -> dict[str, str]:
  """This process's environment with the kernels of ``isa`` (:data:`ISAS`) chosen."""
  env = dict(os.environ)
  for k, v in ISAS[isa].items():
    env[k] = f'{env[k]} {v}' if k == 'XLA_FLAGS' and env.get(k) else v
  return env


def _replay_child(engine: str, workdir: str, module: str, isa: str) -> dict[str, tuple]:
  """Replays in a fresh Python with ``isa``'s kernels (they are chosen at start-up)."""
  env = isa_env(isa)
  env['PYTHONPATH'] = os.pathsep.join(p for p in (REPO, env.get('PYTHONPATH')) if p)
  r = subprocess.run([sys.executable, '-m', 'benchmarks.reproduction.standing', engine, workdir,
                      module or '-'], cwd=REPO, env=env, capture_output=True, text=True,
                     check=False)
  if r.returncode:
    raise RuntimeError(f'the {isa} replay exited {r.returncode}: '
                       + ' | '.join(r.stderr.strip().splitlines()[-3:]))
  return {k: tuple(v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def replay_run(run: ArchivedRun, workdir: str, isa: str = 'native') -> dict[str, tuple] | None:
  """Replays ``run`` (archived at ``workdir``) with ``isa``'s kernels; the differing
  columns (empty when it stands), or None when its engine is not set up here."""
  if run.engine == 'official':
    return replay_official(workdir, isa)
  if isa != 'native':
    return _replay_child(run.engine, workdir, run.module, isa)
  return (replay_fedjax(workdir) if run.engine == 'fedjax_kd'
          else replay_torch(workdir, run.module))


def replay_official(workdir: str, isa: str = 'native') -> dict[str, tuple] | None:
  """Replays a run of the SCARLET authors' code's first round through
  ``benchmarks/references/scarlet_official.py``; the differing columns, or None when the authors'
  code or its Python is not here (``$SCARLET_CHECKOUT``, ``$SCARLET_PYTHON``)."""
  if not (os.path.isdir(OFFICIAL_CHECKOUT) and os.path.exists(OFFICIAL_PYTHON)):
    return None
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    cfg = json.load(f)
  source = cfg['data']['source']
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [OFFICIAL_PYTHON, os.path.join(REPO, 'benchmarks', 'references', 'scarlet_official.py'),
           f'--checkout={OFFICIAL_CHECKOUT}', f'--mnist={source.partition(":")[2]}',
           f'--seeds={cfg["seed"]}', f'--algorithms={cfg["algorithm"]}',
           '--model=' + str(cfg['server']['model']).partition('@')[0], '--rounds=1',
           '--threads=1', f'--out={tmp}']
    # Their Python has its own torch: a PYTHONPATH meant for this one must not leak into it.
    env = {k: v for k, v in isa_env(isa).items() if k != 'PYTHONPATH'}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
      raise RuntimeError(f'the authors\' code exited {r.returncode}: '
                         + ' | '.join(r.stderr.strip().splitlines()[-3:]))
    found = [os.path.join(d, 'metrics.jsonl') for d, _, files in os.walk(tmp)
             if 'metrics.jsonl' in files]
    if len(found) != 1:
      raise RuntimeError(f'the replay of {workdir} wrote {len(found)} runs')
    return same_rows(_first_row(os.path.dirname(found[0])), _first_row(workdir))


def tie(archive: str, sweeps: Mapping[str, tuple[str, str, str]], replay: bool,
        only: Callable[[ArchivedRun], bool] = lambda r: True,
        log: Callable[[str], None] = print) -> dict[str, int]:
  """Ties every run of the archive that :func:`stale_runs` finds stale, and rewrites
  ``standing.json`` (in ``archive`` itself) after each group. Returns counts by outcome."""
  with archive_lib.open_runs(archive) as tree:
    return _tie(archive, tree, sweeps, replay, only, log)


def _tie(archive: str, tree: str, sweeps: Mapping[str, tuple[str, str, str]], replay: bool,
         only: Callable[[ArchivedRun], bool], log: Callable[[str], None]) -> dict[str, int]:
  # Only what this call ties or fails to tie is written back (merged into the file), so
  # several calls on different sweeps may run at once without undoing each other's ties.
  doc: dict[str, Any] = {'runs': {}, 'unmatched': {}}
  ties = doc['runs']
  # One reading of today's golden record for every group: its agreement and the fingerprint
  # written beside the tie come from the same text, even if the file changes meanwhile.
  golden_text = read_today(GOLDEN)
  golden_today = json.loads(golden_text)
  today = lambda path: golden_text if path == GOLDEN else read_today(path)
  stale = stale_runs(archive, sweeps, tree)
  runs = [r for r in iter_runs(tree, sweeps) if r.path in stale and only(r)]
  groups: dict[str, list[ArchivedRun]] = {}
  for r in runs:   # made by the same code
    groups.setdefault(same_code(r), []).append(r)
  counts = {'record': 0, 'source': 0, 'replay': 0, 'unmatched': 0, 'untied': 0}
  head = (_git('rev-parse', '--short', 'HEAD') or '?').strip()
  for members in groups.values():
    first = members[0]
    now = fingerprint(first, today)
    held = load(archive).get('runs', {}).get(first.path)
    if held is not None and held.get('fingerprint') == now and not _outside_history(held):
      continue   # tied meanwhile elsewhere
    how, detail = None, ''
    if (first.engine == 'fedjax_kd' and _clean(first.commit)
        and in_history(first.commit) is not False):
      old = (read_at(first.commit)(GOLDEN) or '{}')
      keys = family_keys(golden_today, first.section, first.algorithm)
      if golden_agrees(json.loads(old), golden_today, keys):
        how, detail = 'record', first.commit
    if how is None and first.engine != 'fedjax_kd':
      made = made_at(first)
      if made and in_history(made) is not False and fingerprint(first, read_at(made)) == now:
        how, detail = 'source', made
    if how is None and replay and first.platform != 'cpu':
      # A GPU's float kernels are not a CPU's: its runs replay on a GPU (or tie by record).
      log(f'{first.path}: made on a {first.platform}; its replay needs one')
      doc.setdefault('unmatched', {})[first.path] = {
          'replay': [f'made on a {first.platform}: replay it on one', None]}
    elif how is None and replay:
      where = os.path.join(tree, first.path)
      diff = None
      for isa in ISAS:
        try:
          got = replay_run(first, where, isa)
        except Exception as e:  # pylint: disable=broad-except
          got = {'replay failed': (f'{type(e).__name__}: {e}'[:400], None)}
        if got is None or not got or set(got) == {GONE}:   # stands (or cannot replay here)
          diff = got
          break
        diff = diff or got   # the first replay's differences are the ones kept
      if diff is None:
        log(f'{first.path}: cannot replay here (the SCARLET authors\' code is not set up)')
      elif set(diff) == {GONE}:
        how, detail = 'replay', f'{first.path} at {head}' + (
            '' if isa == 'native' else f' with {isa.upper()} kernels') + (
                f'; {", ".join(diff[GONE][0])} not logged today, not compared')
      elif diff:
        counts['unmatched'] += len(members)
        log(f'{first.path}: replay differs: {diff}')
        doc.setdefault('unmatched', {})[first.path] = {k: list(v) for k, v in diff.items()}
      else:
        how, detail = 'replay', f'{first.path} at {head}' + (
            '' if isa == 'native' else f' with {isa.upper()} kernels')
    if how is None:
      counts['untied'] += len(members) if not doc.get('unmatched', {}).get(first.path) else 0
      continue
    for r in members:
      ties[r.path] = {'tie': how, 'by': detail, 'fingerprint': now}
    counts[how] += len(members)
    log(f'{first.group}: {len(members)} run(s) tied by {how} ({detail})')
    _write(archive, doc)
  _write(archive, doc)
  return counts


def _write(archive: str, doc: Mapping[str, Any]) -> None:
  """Merges ``doc`` into the file (another process may have tied other runs meanwhile) and
  replaces it atomically."""
  path = os.path.join(archive, STANDING_FILE)
  merged = load(archive)
  for key in ('runs', 'unmatched'):
    if doc.get(key):
      merged.setdefault(key, {}).update(doc[key])
  for run in merged.get('runs', {}):   # tied since (a rerun, or a later replay)
    merged.get('unmatched', {}).pop(run, None)
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(merged, f, indent=1, sort_keys=True)
    f.write('\n')
  os.replace(tmp, path)


if __name__ == '__main__':   # one replay in this process: ENGINE WORKDIR MODULE
  _engine, _where, _module = sys.argv[1:4]
  print(json.dumps(replay_fedjax(_where) if _engine == 'fedjax_kd'
                   else replay_torch(_where, _module)))
