r"""What each shipped config costs on this machine: wall time per round and for the whole run.

  python benchmarks/performance/config_costs.py --mnist=/path/to/mnist.npz --out=runs/config_costs.json \
      --markdown=docs/configs.md
  python benchmarks/performance/config_costs.py --from_json=runs/config_costs.json --markdown=docs/configs.md
  python benchmarks/performance/config_costs.py --only=default,scarlet_digits --timeout=120   # a few

Each config in ``configs/`` runs as a user would start it (``python -m fedjax_kd.main
--config=NAME``, no persistent compilation cache, so round 1 includes compiling everything)
for two rounds, in a process of its own with a time limit. From its ``metrics.jsonl``:

* ``first``: from the command's start to round 1's row (loading data, building, compiling,
  round 1);
* ``round``: round 2's ``round_time_s`` (a round once compiled, evaluation included where the
  config evaluates that round); where round 2 did not finish in time, round 1's
  ``round_time_s`` less its ``compile_s``;
* ``total``: ``first + (rounds - 1) x round``, the config's whole run;
* ``peak_rss``: the process's resident-set high-water mark (on a CPU the device is the host),
  and ``memory_plan``: what the run's header line says the memory planner chose (the table
  adds the clients at a time where they are fewer than all).

A run longer than one sitting (a paper setting on 2 cores: hours a round) is measured over
several calls: ``--keep_in=DIR`` keeps its workdir and stand-ins in ``DIR``, ``--stop_after=S``
sends it SIGTERM after ``S`` seconds (it stops after its current round with a checkpoint), and
the same command later resumes it. Each call's wall time, peak resident set and rounds go to
``DIR/<config>.calls.jsonl``; the row takes round 1 from the call that ran it, round 2 from
its row (less the compiling of a resumed process) and the highest peak of all calls.
``--collect`` writes the rows of the calls made so far, running nothing.

A run that did not reach round 1 within ``--timeout`` is recorded as a lower bound (its round
takes longer than the limit), and one the memory planner refuses says so. Data sets that cannot
be downloaded here are replaced by stand-ins of the same shapes (the cost of a round depends on
the shapes, not the pixels): random ``uint8`` images of MNIST's, Fashion-MNIST's, CIFAR-10's and
CIFAR-100's sizes and class counts, token ids of IMDb's and Reuters' sizes, 40 features of
UrbanSound8K's size; real MNIST with ``--mnist``. LEAF's configs read one client per writer or
speaker from LEAF's own files, whose number sets the cost; they are listed as not measured.

The markdown table goes between ``<!-- config-costs:begin -->`` and ``<!-- config-costs:end -->``
of ``--markdown``, and the configs that ran in chunks, with their plan and measured peak,
between ``<!-- config-memory:begin -->`` and ``<!-- config-memory:end -->`` of
``--memory_markdown`` (docs/performance.md); the JSON keeps every number with the machine it
was measured on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from fedjax_kd.sweep.planning import read_json_lines  # pylint: disable=g-import-not-at-top,wrong-import-position
BEGIN, END = '<!-- config-costs:begin -->', '<!-- config-costs:end -->'
MEMORY_BEGIN, MEMORY_END = '<!-- config-memory:begin -->', '<!-- config-memory:end -->'

# Stand-ins: (train rows, test rows, a row's shape, classes, kind) by data set.
STAND_INS = {
    'mnist': (60_000, 10_000, (28, 28), 10, 'image'),
    'fashion_mnist': (60_000, 10_000, (28, 28), 10, 'image'),
    'cifar10': (50_000, 10_000, (32, 32, 3), 10, 'image'),
    'cifar100': (50_000, 10_000, (32, 32, 3), 100, 'image'),
    'cifar100_coarse': (50_000, 10_000, (32, 32, 3), 20, 'image'),   # its 20 superclasses
    'tiny_imagenet': (100_000, 10_000, (32, 32, 3), 200, 'image'),   # 32x32, a public set
    'imdb': (25_000, 25_000, (200,), 2, 'tokens:20000'),
    'reuters': (8_982, 2_246, (200,), 46, 'tokens:10000'),
    'sensor': (6_985, 1_747, (40,), 10, 'features'),   # UrbanSound8K's 8,732 clips, 80/20
}
NOT_MEASURED = {
    'leaf_femnist': "LEAF's FEMNIST files (one client per writer): their number sets the cost",
    'leaf_shakespeare': "LEAF's Shakespeare files (one client per speaker): their number sets "
                        'the cost',
    # It fits now (planned 13 GiB, 20 of 100 clients at a time; docs/performance.md), but
    # its two rounds are longer than one sitting here and its checkpoint cannot wait for
    # the next one.
    'scarlet_cifar100': 'two rounds take about 3 hours on these 2 cores (an estimate: '
                        "scarlet_cifar10's took 1.8 hours, and ResNet-32 does 1.7 times "
                        "ResNet-20's work), longer than a sitting here; in chunks it plans "
                        '13 GiB',
}


def stand_in_name(source: str) -> str | None:
  """Which stand-in replaces a config's ``data.source`` (None: it loads here as it is)."""
  if source.startswith('digits') or source.startswith('synthetic'):
    return None
  for name in ('fashion_mnist', 'cifar100', 'cifar10', 'mnist', 'imdb', 'reuters',
               'tiny_imagenet'):
    if name in source:
      return name
  if 'tmd' in source or 'sensor' in source or 'urban' in source:
    return 'sensor'
  return None


def write_stand_in(name: str, folder: str) -> str:
  """Writes the stand-in npz (once) and returns its path."""
  path = os.path.join(folder, f'{name}_stand_in.npz')
  if os.path.exists(path):
    return path
  n_train, n_test, shape, classes, kind = STAND_INS[name]
  rs = np.random.RandomState(0)
  arrays = {}
  for split, n in (('train', n_train), ('test', n_test)):
    if kind == 'image':
      x = rs.randint(0, 256, (n, *shape)).astype(np.uint8)
    elif kind.startswith('tokens:'):
      x = rs.randint(1, int(kind.split(':')[1]), (n, *shape)).astype(np.int32)
    else:
      x = rs.rand(n, *shape).astype(np.float32)
    arrays[f'x_{split}'] = x
    arrays[f'y_{split}'] = (np.arange(n) % classes).astype(np.int64)
  if kind.startswith('tokens:'):
    arrays['vocab_size'] = np.int64(int(kind.split(':')[1]))
    arrays['bag_of_words'] = np.bool_(False)
  np.savez(path, **arrays)
  return path


def stand_in_overrides(c: Any, folder: str, mnist: str = '') -> tuple[list[str], list[str]]:
  """The ``--config.data.*`` overrides that replace config ``c``'s data sets that cannot be
  read here by stand-ins of their shapes (real MNIST where ``mnist`` is a file), and a label
  for each data set."""
  overrides, labels = [], []
  for field in ('source', 'public_source'):
    given = str(c.data[field])
    stand_in = stand_in_name(given)
    if stand_in == 'cifar100' and field == 'source' and c.data.label_key:
      stand_in = 'cifar100_coarse'   # a tfds label feature: the stand-in has its classes
      overrides.append('--config.data.label_key=')
    if stand_in == 'mnist' and mnist and os.path.exists(mnist):
      overrides.append(f'--config.data.{field}=npz:{os.path.abspath(mnist)}')
      labels.append('MNIST')
    elif stand_in:
      overrides.append(f'--config.data.{field}=npz:{write_stand_in(stand_in, folder)}')
      labels.append(f'{stand_in} stand-in')
    elif given:
      labels.append(given)
  return overrides, labels


def _rows(workdir: str) -> list[dict[str, Any]]:
  return read_json_lines(os.path.join(workdir, 'metrics.jsonl'))


CALLS = '{name}.calls.jsonl'   # in a --keep_in folder: one line per call of a config's run


def _checkpointed(workdir: str) -> bool:
  ckpts = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(ckpts) and any(n.isdigit() for n in os.listdir(ckpts))


def read_calls(folder: str, name: str) -> list[dict[str, Any]]:
  """The earlier calls of config ``name``'s run kept in ``folder`` (``--keep_in``)."""
  return read_json_lines(os.path.join(folder, CALLS.format(name=name)))


def measure(name: str, rounds: int, overrides: Sequence[str], timeout: float, folder: str,
            keep: bool = False, stop_after: float | None = None) -> dict[str, Any]:
  """Runs config ``name`` for two rounds with ``overrides`` (``--config.FIELD=VALUE``: the
  stand-in data) and times it.

  Args:
    name, rounds, overrides: the config, its rounds as shipped, the stand-in data.
    timeout: seconds this call may take; the run is then killed.
    folder: where the run's workdir (and the stand-ins) live.
    keep: ``folder`` is kept between calls (``--keep_in``): a run with a checkpoint there is
      resumed, and each call's record (its wall time, peak resident set, rounds done) is
      appended to ``<folder>/<name>.calls.jsonl``, so that a run longer than one sitting is
      measured over several calls. A call that ends on an error before a round is not kept.
    stop_after: seconds after which the run gets SIGTERM: it stops after its current round
      and saves a checkpoint, for the next call to resume.

  Returns:
    The config's row (over every call where ``keep``).
  """
  workdir = os.path.join(folder, name)
  resume = keep and _checkpointed(workdir)
  cmd = [sys.executable, '-m', 'fedjax_kd.main', f'--config={name}', f'--workdir={workdir}',
         *([] if resume else ['--noresume']), '--compilation_cache=none', '--config.rounds=2',
         '--config.log.tensorboard=False', *overrides]
  before = len(_rows(workdir)) if resume else 0
  t0 = time.monotonic()
  first, stopped = None, False
  # Progress (the header with the memory plan) goes to a file: a pipe nobody reads fills up.
  with open(os.path.join(folder, f'{name}.log'), 'a' if keep else 'w+') as log:
    start = log.tell()
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=log, text=True)
    usage = None
    while usage is None and time.monotonic() - t0 < timeout:
      time.sleep(0.5)
      pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
      if pid:
        usage, proc.returncode = rusage, os.waitstatus_to_exitcode(status)
      if first is None and len(_rows(workdir)) > before:
        first = time.monotonic() - t0
      if stop_after is not None and not stopped and time.monotonic() - t0 > stop_after:
        proc.send_signal(signal.SIGTERM)   # after its round, with a checkpoint
        stopped = True
    if usage is None:
      proc.kill()
      usage = os.wait4(proc.pid, 0)[2]
    wall = time.monotonic() - t0
    with open(log.name) as again:
      again.seek(start)
      err = again.read()
  rows = _rows(workdir)
  if first is None and len(rows) > before:
    first = wall
  plan = re.search(r'\| memory (.*)$', err, flags=re.M)
  call = {'date': time.strftime('%Y-%m-%d %H:%M'), 'wall_s': wall, 'first_s': first,
          'peak_rss': usage.ru_maxrss * 1024, 'rounds_before': before, 'rounds_after': len(rows),
          'resumed': resume, 'stopped': stopped}
  calls = [call]
  if proc.returncode not in (None, 0) and len(rows) == before and not stopped:
    rows = []   # it stopped on an error and measured nothing: its row is the error, unkept
  elif keep:
    with open(os.path.join(folder, CALLS.format(name=name)), 'a') as f:
      f.write(json.dumps(call) + '\n')
    calls = read_calls(folder, name)
  return row_of(name, rounds, timeout, calls, rows, plan.group(1) if plan else None,
                next((s for s in err.splitlines() if s.startswith('error:')), ''), wall)


def collect(name: str, rounds: int, timeout: float, folder: str) -> dict[str, Any]:
  """The row of config ``name``'s calls kept in ``folder`` so far (``--collect``).

  Raises:
    SystemExit: no call of it is recorded there.
  """
  calls = read_calls(folder, name)
  if not calls:
    raise SystemExit(f'error: {folder} has no {CALLS.format(name=name)}: run the config with '
                     f'--keep_in={folder} first')
  try:
    with open(os.path.join(folder, f'{name}.log')) as f:
      plans = re.findall(r'\| memory (.*)$', f.read(), flags=re.M)
  except OSError:
    plans = []
  return row_of(name, rounds, timeout, calls, _rows(os.path.join(folder, name)),
                plans[-1] if plans else None, '', 0.0)


def row_of(name: str, rounds: int, timeout: float, calls: Sequence[dict[str, Any]],
           rows: Sequence[dict[str, Any]], plan: str | None, error: str, wall: float
           ) -> dict[str, Any]:
  """A config's row from its run's calls (:func:`measure`'s records, oldest first) and its
  metrics rows: round 1 from the call that ran it, round 2 from its row (less the compiling
  of a process that resumed at round 2), the highest peak of every call."""
  one = next((c for c in calls if c['rounds_before'] == 0 and c['rounds_after'] >= 1), None)
  out = {'config': name, 'rounds': rounds, 'limit_s': timeout,
         'first_s': one['first_s'] if one else None,
         # the process's resident-set high-water mark: on a CPU the device is the host
         'peak_rss': max(c['peak_rss'] for c in calls), 'memory_plan': plan}
  if len(calls) > 1:
    out['calls'] = len(calls)
  if len(rows) >= 2:
    resumed_at_2 = any(c['rounds_before'] == 1 for c in calls)
    out['round_s'] = rows[1]['round_time_s'] - (rows[1].get('compile_s', 0.0)
                                                 if resumed_at_2 else 0.0)
    out['round_from'] = ('round 2 (resumed in a new process: its compiling left out)'
                         if resumed_at_2 else 'round 2')
  elif rows:
    out['round_s'] = rows[0]['round_time_s'] - rows[0].get('compile_s', 0.0)
    out['round_from'] = 'round 1 less compiling'
    if calls[-1].get('stopped'):
      out['stopped_after_round'] = len(rows)
  else:
    out['error'] = error[:300] if error else None
    out['round_s'] = None
    out['lower_bound_s'] = wall
    return out
  out['total_s'] = out['first_s'] + (rounds - 1) * out['round_s']
  return out


def merge_rows(rows: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]
               ) -> list[dict[str, Any]]:
  """``rows`` with each of ``new`` in place of the row of the same ``'config'`` (in its
  place), and the configs ``rows`` did not have appended: a rerun of a few configs updates a
  saved file without losing the others."""
  mine = {r['config']: r for r in new}
  return [mine.pop(r['config'], r) for r in rows] + list(mine.values())


def fmt(seconds: float | None) -> str:
  """``'45 s'``, ``'3.2 min'``, ``'4.1 h'``, ``'2.3 days'``."""
  if seconds is None:
    return '–'
  if seconds < 90:
    return f'{seconds:.0f} s' if seconds >= 10 else f'{seconds:.1f} s'
  if seconds < 90 * 60:
    return f'{seconds / 60:.0f} min'
  if seconds < 48 * 3600:
    return f'{seconds / 3600:.1f} h'
  return f'{seconds / 86400:.1f} days'


def size_word(row: dict[str, Any]) -> str:
  """minutes / hours / days (or more) on a 2-core laptop, from the total."""
  total = row.get('total_s')
  if total is None:   # a round did not finish in time: at least its limit a round
    bound = (row.get('lower_bound_s') or 0.0) * row.get('rounds', 1)
    return 'days or more' if bound >= 86400 else 'hours or more' if bound >= 3600 else '–'
  return 'minutes' if total < 3600 else 'hours' if total < 86400 else 'days'


def table(rows: Sequence[dict[str, Any]], machine: str) -> str:
  out = [f'Measured by `python benchmarks/performance/config_costs.py` on {machine}: two rounds '
         f'of each config as the command line runs it by its name (no compilation cache, so '
         'the first column includes compiling; a rerun with the cache starts faster), one run '
         'each, one config at a time (other work shared the machine at times). Absolute CPU '
         'times drift by about ±30% between runs and machines: read the column "on a laptop", '
         'not the digits. `python benchmarks/performance/config_costs.py '
         '--from_json=benchmarks/results/config_costs.json '
         '--markdown=docs/configs.md` rewrites this table from the numbers.',
         '',
         '| config | rounds | data | start to round 1 | a round | whole run | on a laptop |',
         '|---|---|---|---|---|---|---|']
  for r in rows:
    if r.get('skipped'):
      out.append(f'| `{r["config"]}` | {r.get("rounds", "–")} | – | not measured: '
                 f'{r["skipped"]} | | | |')
      continue
    if r.get('error'):   # refused before any compute (memory, data): what it said
      need = re.search(r'needs about ([\d.]+ [KMGT]iB)', r['error'])
      oom = re.search(r'out of device memory \(([\d.]+ [KMGT]iB).*?allocating (\d+) bytes',
                      r['error'])
      if need:   # the memory planner's refusal, before compiling
        why = f'refused here: needs about {need.group(1)} of memory'
      elif oom:   # past the planner, XLA's own allocation failed
        why = (f'out of memory here: XLA asked for {int(oom.group(2)) / 2**30:.0f} GiB at '
               f'once ({oom.group(1)} available)')
      else:
        why = f'refused here: {r["error"].removeprefix("error: ")}'
      out.append(f'| `{r["config"]}` | {r["rounds"]} | {r["data"]} | {why} | | | an accelerator |')
      continue
    if r.get('round_s') is None:
      out.append(f'| `{r["config"]}` | {r["rounds"]} | {r["data"]} | round 1 not done in '
                 f'{fmt(r["lower_bound_s"])} | > {fmt(r["lower_bound_s"])} | > '
                 f'{fmt(r["lower_bound_s"] * r["rounds"])} | {size_word(r)} |')
      continue
    chunks = re.search(r'clients (\d+) at a time \(of (\d+)', r.get('memory_plan') or '')
    data = r['data'] + (f', {chunks[1]} of {chunks[2]} clients at a time' if chunks else '')
    so_far = (f' (round {r["stopped_after_round"]} less compiling; the run stopped there, to '
              'resume)' if r.get('stopped_after_round') else '')
    out.append(f'| `{r["config"]}` | {r["rounds"]} | {data} | {fmt(r["first_s"])} | '
               f'{fmt(r["round_s"])}{so_far} | {fmt(r["total_s"])} | {size_word(r)} |')
  return '\n'.join(out)


def memory_table(rows: Sequence[dict[str, Any]], machine: str) -> str:
  """The rows measured with their memory: the planner's choice (the run's header line), the
  process's peak resident set (on a CPU the device is the host: an upper bound of the device
  memory the run held) and the times, for the configs whose round chose clients in chunks."""
  from fedjax_kd.running.memory import fmt as fmt_bytes  # pylint: disable=g-import-not-at-top
  out = [f'Measured by `python benchmarks/performance/config_costs.py` (`--only` these) on '
         f'{machine}, one run '
         'each, two rounds as the command line runs the config, the chunk chosen by the '
         "planner (`clients.chunk='auto'`). The peak is the process's resident-set high-water "
         'mark, compiling and the host copies of the data included.',
         '', '| config | data | the plan (header line) | measured peak | start to round 1 | '
         'a round |', '|---|---|---|---|---|---|']
  for r in rows:
    if ('at a time' not in (r.get('memory_plan') or '') or r.get('round_s') is None
        or r.get('stopped_after_round')):   # two rounds, or not yet
      continue
    calls = f' (the higher of {r["calls"]} processes)' if r.get('calls', 1) > 1 else ''
    out.append(f'| `{r["config"]}` | {r["data"]} | {r["memory_plan"]} | '
               f'{fmt_bytes(r["peak_rss"])}{calls} | {fmt(r["first_s"])} | {fmt(r["round_s"])} |')
  return '\n'.join(out)


def table_main(a: Any, measure: Callable[[Any], dict], table: Callable[[dict], str],
               begin: str, end: str) -> int:
  """A benchmark's table command: its numbers from ``a.from_json`` (else ``measure(a)``,
  saved to ``a.out`` if given), the table printed and written between ``begin`` and ``end``
  of ``a.markdown`` if given."""
  if a.from_json:
    with open(a.from_json) as f:
      doc = json.load(f)
  else:
    doc = measure(a)
    if a.out:
      with open(a.out, 'w') as f:
        json.dump(doc, f, indent=1)
  text = table(doc)
  print(text)
  if a.markdown:
    write_markdown(a.markdown, text, begin, end)
  return 0


def write_markdown(path: str, text: str, begin: str = BEGIN, end: str = END) -> None:
  with open(path) as f:
    doc = f.read()
  pattern = re.compile(re.escape(begin) + '.*?' + re.escape(end), flags=re.S)
  if not pattern.search(doc):
    raise SystemExit(f'error: {path} has no {begin} ... {end} section to fill')
  doc = pattern.sub(lambda _: f'{begin}\n{text}\n{end}', doc)
  with open(path, 'w') as f:
    f.write(doc)


def machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      names = [l.split(':', 1)[1].strip() for l in f if l.startswith('model name')]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return f'{os.cpu_count()} cores ({cpu})'


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--only', default='', help='comma-separated config names (default: all)')
  p.add_argument('--mnist', default='', help='a Keras-layout mnist.npz (else a stand-in)')
  p.add_argument('--timeout', type=float, default=240.0, help='seconds per config')
  p.add_argument('--out', default='',
                 help='JSON file for the numbers (with --only: its rows for those configs replaced)')
  p.add_argument('--keep_in', default='',
                 help='a folder kept between calls for the runs and the stand-ins (default: a '
                 'temporary one): a run with a checkpoint there resumes, and its row counts '
                 'every call (a run longer than one sitting)')
  p.add_argument('--stop_after', type=float, default=None,
                 help='seconds after which a run gets SIGTERM: it stops after its current round '
                 'with a checkpoint, for a later call with the same --keep_in to resume')
  p.add_argument('--collect', action='store_true',
                 help='with --keep_in: the rows of the calls made so far, running nothing')
  p.add_argument('--from_json', default='', help='rewrite the table from an earlier --out')
  p.add_argument('--markdown', default='', help='markdown file with the config-costs markers')
  p.add_argument('--memory_markdown', default='',
                 help='markdown file with the config-memory markers: the chunked rows')
  a = p.parse_args(argv)
  if a.collect and not a.keep_in:
    p.error('--collect reads the calls kept in a folder: give --keep_in=DIR')
  sys.path.insert(0, REPO)
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  if a.from_json:
    with open(a.from_json) as f:
      doc = json.load(f)
  else:
    names = [n for n in config_lib.shipped_configs() if not a.only or n in a.only.split(',')]
    rows = []
    if a.keep_in:
      os.makedirs(a.keep_in, exist_ok=True)
    with (contextlib.nullcontext(a.keep_in) if a.keep_in
          else tempfile.TemporaryDirectory(prefix='fedjax_kd_costs_')) as folder:
      for name in names:
        c = config_lib.load_file(name)
        if name in NOT_MEASURED:
          rows.append({'config': name, 'rounds': int(c.rounds), 'skipped': NOT_MEASURED[name]})
          continue
        overrides, labels = stand_in_overrides(c, folder, a.mnist)
        keep = dict(keep=bool(a.keep_in), stop_after=a.stop_after)
        if a.collect:   # the row of the calls so far, nothing run
          row = collect(name, int(c.rounds), a.timeout, folder)
        else:
          row = measure(name, int(c.rounds), overrides, a.timeout, folder, **keep)
        fit = re.search(r'would fit: (--config\.eval\.chunk=\d+)', row.get('error') or '')
        if fit:   # the planner names an evaluation chunk that fits: the rounds are the same
          row = dict(measure(name, int(c.rounds), overrides + [fit.group(1)], a.timeout, folder,
                             **keep), refused_without=row['error'])
          labels.append(fit.group(1)[len('--config.'):])
        row['data'] = ', '.join(labels)
        print(json.dumps(row), flush=True)
        rows.append(row)
    doc = {'machine': machine(), 'date': time.strftime('%Y-%m-%d'), 'rows': rows}
    if a.out and a.only and os.path.exists(a.out):   # --only: replace those rows, keep the rest
      with open(a.out) as f:
        old = json.load(f)
      doc = dict(old, rows=merge_rows(old['rows'], [dict(r, date=doc['date']) for r in rows]))
    if a.out:
      with open(a.out, 'w') as f:
        json.dump(doc, f, indent=1)
  text = table(doc['rows'], doc['machine'])
  if a.markdown:
    write_markdown(a.markdown, text)
  if a.memory_markdown:
    write_markdown(a.memory_markdown, memory_table(doc['rows'], doc['machine']), MEMORY_BEGIN,
                   MEMORY_END)
  if not (a.markdown or a.memory_markdown):
    print(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
