"""A run's session: its set-up, its rounds' rows and checkpoints, its summary.

A :class:`Session` is one call of :func:`fedjax_kd.runner.run`. Its set-up works down the
layers once: first what belongs to the run itself (the client store's folder locked, a resume
that cannot be right refused, the checkpoints found), then the experiment, built from the
data up (:func:`fedjax_kd.running.experiment.build`: data, models, federation, algorithm and
the memory plan, with a run the device cannot hold refused there), then the state (initialised
or restored) and the run's records. The runner's loop then plays each round
(:meth:`Session.play`), records its row (:meth:`Session.record`) and checkpoints
(:meth:`Session.checkpoint`); :meth:`Session.finish` writes the summary.

Compilation (docs/performance.md): the models' initialisation and the first round of a call
compile its XLA programs. With progress on, a line says so when it starts, another every
:data:`PROGRESS_EVERY_S` seconds while the first round lasts, and one when it ends with the
programs' count, the time spent compiling them and how many came from the persistent
compilation cache (:mod:`fedjax_kd.running.compile_cache`). Every row carries ``compile_s``,
its round's time spent compiling (part of ``round_time_s``), and the ETA leaves it out
(:func:`eta_seconds`).

A round that leaves NaN or Inf in the state stops the run with
:class:`fedjax_kd.errors.DivergenceError` naming the round, the cohort and the arrays, before
anything of that round is written, so the last good checkpoint stays the newest
(:func:`nonfinite_arrays`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms.base import RoundOutput, finite_flags, init_state, play_round
from fedjax_kd.config.spec import ExperimentSpec
from fedjax_kd.core import compiles
from fedjax_kd.errors import ConfigError, DataError, DivergenceError
from fedjax_kd.ops import comm
from fedjax_kd.running import checkpoint as checkpoint_lib
from fedjax_kd.running import compile_cache
from fedjax_kd.running import experiment as experiment_lib
from fedjax_kd.running import memory as memory_lib
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib


def _with_defaults(cfg: Any, defaults: Any) -> Any:
  """``cfg`` with every field of ``defaults`` it lacks added at its default (recursively)."""
  if not isinstance(cfg, dict) or not isinstance(defaults, dict):
    return cfg
  out = dict(cfg)
  for k, v in defaults.items():
    out[k] = _with_defaults(cfg[k], v) if k in cfg else v
  return out


def _defaults() -> dict:
  """The default config as its JSON tree (what a run's ``config.json`` holds)."""
  return json.loads(config_lib.default_config().to_json_best_effort())


def resumable(cfg: dict) -> dict:
  """The part of a config that must match to resume (rounds may be extended).

  A field that a run's ``config.json`` lacks was added to fedjax_kd after the run was made;
  it counts at its default, which keeps what runs did before the field existed.
  """
  cfg = _with_defaults(cfg, _defaults())
  return {k: v for k, v in cfg.items() if k not in ('rounds', 'checkpoint', 'eval', 'log')}


def config_json(spec: ExperimentSpec) -> str:
  return spec.raw.to_json_best_effort(indent=2, sort_keys=True)


# ------------------------------------------------------ compile progress
PROGRESS_EVERY_S = 15.0   # at most one "compiling ..." line this often (log files stay short)


def eta_seconds(round_s: Sequence[float], compile_s: Sequence[float], remaining: int) -> float:
  """The seconds ``remaining`` rounds should take at this call's pace, compiling left out.

  The pace is the mean time of this call's rounds after its first, each less the time it
  spent compiling; with only one round done, that round's time less its compile time. The
  first round is left out as soon as there are others because besides compiling it pays
  for first executions (buffers, thread pools) that later rounds do not.

  Args:
    round_s: the wall time of each round run in this call, in order.
    compile_s: the compile time measured in each of them (``compile_s`` of the rows).
    remaining: rounds still to run.

  Returns:
    Seconds (0.0 with no round done or none left).
  """
  pairs = list(zip(round_s, compile_s))
  if not pairs or remaining <= 0:
    return 0.0
  if len(pairs) > 1:
    pairs = pairs[1:]
  return remaining * sum(max(r - c, 0.0) for r, c in pairs) / len(pairs)


def _programs(n: int) -> str:
  return f'{n} program' + ('' if n == 1 else 's')


class _CompileProgress(contextlib.AbstractContextManager):
  """The "compiling ..." lines of a call's start, from the models' initialisation to the
  end of its first round: one at once, at most one every ``every`` seconds while it lasts
  (whole lines, no carriage returns: a log file stays readable) and one at :meth:`done`."""

  def __init__(self, log: Callable[[str], None], t: int, every: float = PROGRESS_EVERY_S):
    self._log, self._t, self._every = log, t, every
    self._stack = contextlib.ExitStack()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.stats = compiles.CompileTime()
    self.cache = compile_cache.active()

  def __enter__(self):
    self._t0 = time.monotonic()
    self.stats = self._stack.enter_context(compiles.time_compiles())
    where = (f'persistent cache {compile_cache.shown(self.cache)}' if self.cache
             else 'persistent compilation cache off')
    self._log(f'round {self._t}: compiling ({where}) ...')
    self._thread = threading.Thread(target=self._tick, daemon=True,
                                    name='fedjax_kd-compile-progress')
    self._thread.start()
    return self

  def _tick(self):
    """A line per interval while programs are compiling; one when they have stopped (the
    round is running what it compiled), then silence until compiling starts again."""
    seen, quiet = 0.0, False
    while not self._stop.wait(self._every):
      now, st = time.monotonic(), self.stats
      if st.last > seen:   # something compiled since the previous line
        self._log(f'round {self._t}: compiling ... {now - self._t0:.0f} s '
                  f'({_programs(st.programs)})')
        quiet = False
      elif not quiet:
        self._log(f'round {self._t}: running ... {now - self._t0:.0f} s (compiled '
                  f'{_programs(st.programs)} in {st.seconds:.1f} s)')
        quiet = True
      seen = st.last

  def _halt(self):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None

  def done(self) -> None:
    """Stops the lines and the timing; logs the closing line (programs, seconds, cache)."""
    self._halt()
    self._stack.close()
    st = self.stats
    if not st.programs:
      return
    if not self.cache:
      cache = 'persistent compilation cache off'
    elif st.cache_hits == st.programs:
      cache = f'all from the cache {compile_cache.shown(self.cache)}'
    elif st.cache_hits:
      cache = f'{st.cache_hits} from the cache {compile_cache.shown(self.cache)}'
    else:
      cache = f'none from the cache {compile_cache.shown(self.cache)}'
    self._log(f'round {self._t}: compiled {_programs(st.programs)} in {st.seconds:.1f} s '
              f'({cache})')

  def __exit__(self, *exc):
    self._halt()
    self._stack.close()
    return False


# ------------------------------------------------------------ NaN guard
def nonfinite_arrays(state: Any, fed: Any = None, finite: Any = None) -> list[str]:
  """The state's arrays holding NaN or Inf, grouped, with the clients affected.

  Args:
    state: an :class:`~fedjax_kd.algorithms.base.AlgState` (any pytree).
    fed: the :class:`~fedjax_kd.core.federation.Federation`, to name the
      clients of a bad row of ``state.clients[c]``.
    finite: the host value of :func:`~fedjax_kd.algorithms.base.finite_flags` of
      ``state``, when the round has read it already (None: read it here).

  Returns:
    One entry per group of arrays (the first two levels of the state, e.g.
    ``clients[0].params`` or ``extra.cache_labels``), such as
    ``"clients[0].params: 6 of 6 arrays, e.g. ['Dense_0']['bias'] (clients 0, 2)"``;
    empty when every floating-point array is finite.
  """
  flags = jax.device_get(finite_flags(state)) if finite is None else finite
  if all(jax.tree.leaves(flags)):
    return []
  groups: dict[str, dict[str, Any]] = {}
  for (path, leaf), good in zip(jax.tree_util.tree_flatten_with_path(state)[0],
                                jax.tree.leaves(flags)):
    depth = 3 if path and getattr(path[0], 'name', None) == 'clients' else 2
    head = jax.tree_util.keystr(path[:depth]).lstrip('.')
    g = groups.setdefault(head, {'n': 0, 'bad': 0, 'first': None, 'clients': set()})
    g['n'] += 1
    if good:
      continue
    g['bad'] += 1
    g['first'] = g['first'] or jax.tree_util.keystr(path[depth:])
    first = path[0] if path else None
    if (fed is not None and getattr(first, 'name', None) == 'clients' and len(path) > 1
        and hasattr(path[1], 'idx') and np.ndim(leaf) >= 1):
      ids = fed.global_ids[fed.cohorts[path[1].idx].client_ids]   # global ids (views too)
      rows = ~np.isfinite(np.asarray(leaf).reshape(np.shape(leaf)[0], -1)).all(axis=1)
      g['clients'].update(int(ids[r]) for r in np.flatnonzero(rows) if r < len(ids))
  out = []
  for head, g in groups.items():
    if not g['bad']:
      continue
    text = f'{head}: {g["bad"]} of {g["n"]} arrays'
    if g['first']:
      text += f', e.g. {g["first"]}'
    if g['clients']:
      text += f' (clients {", ".join(map(str, sorted(g["clients"])))})'
    out.append(text)
  return out


class Session:
  """One call of :func:`fedjax_kd.runner.run`, from its set-up to its summary.

  Set-up (the constructor) goes down the layers once: the run's own folders and checks (the
  client store's folder locked, a resume that cannot be right refused), the experiment
  (built, its device memory planned and checked: a run the device cannot hold is refused
  before anything compiles or is written), then the state (initialised, or restored from
  the newest checkpoint) and the run's records (config, selection, partition); then the
  loop plays rounds (:meth:`play`), records their rows (:meth:`record`) and checkpoints
  (:meth:`checkpoint`); :meth:`finish` writes the summary.

  Args:
    spec: the validated experiment.
    workdir: its folder (locked by the caller).
    resume: resume after the newest checkpoint (False: start over).
    progress: print the header, the compile and round lines and the closing table.
    log: where lines go.
    cleanup: closes what the session leaves open on the way out (the client store's lock,
      the compile progress lines should the run fail before its first round ends).
    held: the caller's folder locks, to which the client store's is added (a refused run
      discards them: it leaves no new empty folder).
    memory_check: refuse a run that does not fit the device.
  """

  def __init__(self, spec: ExperimentSpec, workdir: str, *, resume: bool, progress: bool,
               log: Callable[[str], None], cleanup: contextlib.ExitStack, held: list,
               memory_check: bool = True):
    self.spec, self.workdir, self.progress, self.log = spec, workdir, progress, log
    # 1. The run's own folders: one run at a time per disk client store too (the workdir's
    # lock is the caller's); a resume that cannot be right is refused before anything is
    # built (rows it cannot continue, another config, fewer rounds than already run).
    store_dir = experiment_lib.store_directory(spec, workdir)
    if store_dir is not None:
      held.append(cleanup.enter_context(workdir_lib.DirLock(store_dir, 'clients.store_dir')))
    cfg_json = config_json(spec)
    cfg_path = os.path.join(workdir, 'config.json')
    metrics = os.path.join(workdir, workdir_lib.METRICS)
    latest = checkpoint_lib.latest_round(workdir) if resume else None
    if latest is not None:
      if os.path.exists(metrics):
        workdir_lib.read_round_rows(metrics)   # rows a resume cannot continue: refused at once
      _check_resumable(workdir, cfg_path, cfg_json, latest, spec.rounds)
    # 2. The experiment, built down the layers (data, models, federation, algorithm) and its
    # device memory planned: a run the device cannot hold is refused there.
    self.exp = experiment_lib.build(spec, workdir, memory_check=memory_check)
    self.memory, self.algo, self.selector = (self.exp.memory, self.exp.algorithm,
                                             self.exp.ctx.selector)
    # 3. Nothing can refuse the run any more: an old run's results go (without resume), its
    # checkpoints are opened, and what runs is said.
    self.t_start = time.time()
    self.env = workdir_lib.environment()
    if not resume and workdir_lib.is_primary():
      _start_over(workdir)
    self.ckpt = checkpoint_lib.Checkpointer(workdir, keep=spec.checkpoint.keep)
    self.ledger = comm.Ledger(comm.get_rules(spec.comm.rules, self.algo.paper_rules))
    if progress:
      log(results.header_line(spec, self.exp, self.env, memory=(
          f'{self.memory.about}, {self.memory.choice()}' if self.memory else '')))
    self.compiling = None   # the "compiling ..." lines: the models' initialisation and round 1
    if progress and (latest or 0) < spec.rounds:
      self.compiling = cleanup.enter_context(_CompileProgress(log, (latest or 0) + 1))
    self.start, self.last_saved = 1, None
    # What the last played round left for the next one's control flow (RoundOutput.carry):
    # nothing before round 1; unknown (None) after a resume, so that round reads its state.
    self.carried: dict[str, Any] | None = {}
    # 4. The state, initialised or restored, and the run's records.
    with self.out_of_memory():
      self.state = init_state(self.algo)
      if latest is not None:
        self._restore()
    memory_lib.release_host()   # setup's freed host memory, before round 1's programs
    workdir_lib.write_text(cfg_path, cfg_json)
    workdir_lib.write_json(os.path.join(workdir, 'selection.json'), self.selector.description())
    workdir_lib.write_json(os.path.join(workdir, 'partition.json'),
                           workdir_lib.partition_record(self.exp.ctx.data, spec.clients.models,
                                                        self.selector.true_counts))
    self.writer = workdir_lib.MetricsWriter(workdir, keep_until=self.start - 1)
    self.scalars = self._scalar_writer()
    self.ledger = self.ledger.opened(self.algo.setup_payloads() + self.selector.setup_payloads())
    self.n_done, self.t_last = 0, self.start - 1
    self.round_s: list[float] = []     # this call's rounds: wall time and time spent compiling
    self.compile_s: list[float] = []

  @contextlib.contextmanager
  def out_of_memory(self):
    """XLA running out of device memory (``RESOURCE_EXHAUSTED``) becomes one line with the
    estimate and what would fit (:func:`fedjax_kd.running.memory.exhausted_advice`)."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      if isinstance(e, DataError) or not memory_lib.is_exhausted(e):
        raise
      raise memory_lib.exhausted_advice(self.exp, e) from None

  def _restore(self) -> None:
    """The newest checkpoint's state, round and bytes."""
    like = self.state
    self.state, meta = self.ckpt.restore(like, warn=self.log)
    if self.exp.ctx.fed.store is not None:   # restored host arrays go back into the store's files
      self.state = self.exp.ctx.fed.store.adopt(like, self.state)
    self.last_saved = int(meta['round'])
    self.start = self.last_saved + 1
    self.carried = None
    self.ledger = comm.Ledger.restored(self.ledger.rules, meta)
    self.log(f'resumed from {self.ckpt.directory} after round {meta["round"]}')

  def _scalar_writer(self) -> workdir_lib.ScalarWriter | None:
    if self.spec.log.tensorboard and workdir_lib.tensorboard_available():
      return workdir_lib.ScalarWriter(self.workdir, self.writer.rows)
    if self.spec.log.tensorboard:
      self.log("note: log.tensorboard: tensorboardX is not installed, so no TensorBoard "
               "scalars (metrics.jsonl/csv hold every value); pip install "
               "'fedjax_kd[tensorboard]' or set --config.log.tensorboard=false")
    return None

  def play(self, t: int) -> dict[str, Any]:
    """Round ``t``: selection, the algorithm's round, its bytes and (when due) evaluation."""
    algo, t0 = self.algo, time.time()
    with compiles.time_compiles() as compiled:
      plan = self.selector.plan(t, lambda mask, st=self.state: algo.selection_losses(st, mask))
      active = plan.active
      scored = t % self.spec.eval.every == 0 or t == self.spec.rounds
      if active.any():
        # The output comes back read to the host: one transfer of every metric, payload
        # count and (when due) score of the round and of the NaN guard's flags
        # (RoundOutput.read), so the bytes and the row are host numbers.
        self.state, out = play_round(
            algo, self.state, t, active, evaluate=scored, carried=self.carried,
            check=lambda st, fed, o, finite: _check_finite(st, o, t, active, fed, self.ckpt,
                                                           self.last_saved, finite))
        self.carried = out.carry
      else:   # everybody dropped out: the model is unchanged, nothing is sent
        out = RoundOutput({}, [], algo.scores(self.state) if scored else {})
      self.ledger, sent = self.ledger.add(out.payloads)
      row: dict[str, Any] = {'round': t, 'participants': int(active.sum())}
      row.update(self.selector.round_metrics(plan))
      row.update(out.metrics)
      row.update(out.scores)
    row.update(self.ledger.row(sent))
    row.update({'round_time_s': time.time() - t0, 'compile_s': compiled.seconds})
    return row

  def record(self, row: dict[str, Any]) -> None:
    """Writes a round's row (metrics files, TensorBoard) and its progress line."""
    row = self.writer.write(row)
    if self.scalars is not None:
      self.scalars.write(row)
    t = row['round']
    self.n_done, self.t_last = self.n_done + 1, t
    self.round_s.append(row['round_time_s'])
    self.compile_s.append(row['compile_s'])
    if self.compiling is not None:
      self.compiling.done()
      self.compiling = None
    if self.progress:
      acc = row.get('test_acc')
      acc_s = f'acc {acc:.4f}' if acc is not None else 'acc   -   '
      if row.get('client_acc') is not None:   # the server's and the clients' accuracy
        acc_s += f'  clients {row["client_acc"]:.4f}'
      self.log(f'round {t:>4}/{self.spec.rounds}  {acc_s}  '
               f'sent {results.fmt_bytes(row["round_bytes"]):>10}  '
               f'cum {results.fmt_bytes(row["cum_bytes"]):>10}  {row["round_time_s"]:.2f}s  '
               f'eta {eta_seconds(self.round_s, self.compile_s, self.spec.rounds - t):.0f}s')

  def checkpoint(self, t: int, signum: int | None) -> bool:
    """Saves a checkpoint after round ``t`` when one is due or a signal asks to stop;
    returns whether to stop."""
    every = self.spec.checkpoint.every
    due = every and (t % every == 0 or t == self.spec.rounds)
    if due or (signum is not None and every):
      self.ckpt.save(t, self.state, {'round': t, **self.ledger.meta()})
      self.last_saved = t
    if signum is not None:
      self.log(f'stopped after round {t}; rerun the same command to resume.' if every else
               f'stopped after round {t}; checkpoint.every=0, so a rerun starts over.')
    return signum is not None

  def close(self) -> None:
    if self.scalars is not None:
      self.scalars.close()
    self.ckpt.close()

  def finish(self, signum: int | None) -> dict[str, Any]:
    """Writes ``clients.json`` and ``summary.json``; returns the summary."""
    spec, workdir = self.spec, self.workdir
    if spec.eval.clients and self.t_last >= 1:
      workdir_lib.write_json(os.path.join(workdir, 'clients.json'),
                             client_record(self.algo, self.state, self.t_last))
    summary = results.summarize(self.writer.rows, spec, self.ledger.setup,
                                self.ledger.rules.name)
    summary.update(seed=spec.seed, **self.env)
    summary['wall_time_s'] = time.time() - self.t_start
    summary['rounds_run_this_call'] = self.n_done
    if signum is not None:
      summary['stopped_by'] = signal.Signals(signum).name
    workdir_lib.write_json(os.path.join(workdir, 'summary.json'), summary, indent=2)
    if self.progress:
      self.log(results.summary_table(summary, workdir))
    return summary


def _start_over(workdir: str) -> None:
  """Without resume: an old run's checkpoints and results must not survive the new one (only
  files this project writes go; metrics and TensorBoard are rewritten by the run)."""
  checkpoint_lib.remove_steps(workdir)
  for name in ('summary.json', 'clients.json'):
    if os.path.isfile(os.path.join(workdir, name)):
      os.remove(os.path.join(workdir, name))


def _check_resumable(workdir: str, cfg_path: str, cfg_json: str, latest: int,
                     rounds: int) -> None:
  """A checkpoint after round ``latest`` may be resumed by the config ``cfg_json``.

  Raises:
    ConfigError: the workdir has no ``config.json`` to compare with (its checkpoint's
      config is unknown), a config that differs from this one in more than ``rounds``, or
      ``rounds`` below the rounds already run.
  """
  if not os.path.exists(cfg_path):
    raise ConfigError('--workdir', workdir, 'a fresh directory, or one with the config.json '
                      'of the checkpoints in it (it has checkpoints but no config.json, so '
                      'what they belong to is unknown; --noresume starts over)')
  with open(cfg_path) as f:
    try:
      old = json.loads(f.read())
    except ValueError:
      raise ConfigError('--workdir', workdir, f'a readable {cfg_path} (it is not valid JSON)'
                        ) from None
  if resumable(old) != resumable(json.loads(cfg_json)):
    raise ConfigError('--workdir', workdir,
                      'a fresh directory, or the same config as the checkpoint in it')
  if rounds < latest:
    raise ConfigError('rounds', rounds, f'at least {latest}: this workdir has run {latest} '
                      'rounds (raise rounds to extend it; --noresume starts over)')


def _check_finite(state, out: RoundOutput, t: int, active: np.ndarray, fed, ckpt,
                  last_saved: int | None, finite: Any = None) -> None:
  """Raises DivergenceError if round ``t`` left NaN or Inf in the state (``finite``: its
  flags, read with the round)."""
  bad = nonfinite_arrays(state, fed, finite)
  if not bad:
    return
  losses = [k for k, v in out.metrics.items()
            if 'loss' in k and isinstance(v, float) and not np.isfinite(v)]
  cohort = np.flatnonzero(active).tolist()
  if last_saved is not None:
    kept = (f'the last good checkpoint (round {last_saved}) is kept in {ckpt.directory} '
            'and a rerun resumes from it')
  else:
    kept = 'no checkpoint had been saved yet, so a rerun starts over'
  raise DivergenceError(t, cohort, bad + [f'metric {k}' for k in losses],
                        f'{kept}. {_first_nonfinite(bad, losses)}')


def _first_nonfinite(bad: list[str], losses: list[str]) -> str:
  """Which phase of the round went non-finite first, and what to change.

  A round runs local training, then the server's aggregation, then distillation; the
  state only shows the end, so the phases are told apart by their own outputs: the local
  training loss, the algorithm's server-side arrays (``extra``: labels, caches,
  payloads) and the distillation losses.
  """
  if any(k.startswith('train') for k in losses):
    return ('It went non-finite first in local training (train_loss): lower '
            'train.learning_rate or check the data.')
  server = [b.split(':', 1)[0] for b in bad if b.startswith('extra')]
  if server:
    return (f'Local training stayed finite; the server\'s arrays went non-finite first '
            f'({", ".join(server)}): check the aggregation\'s options (temperature, '
            'sharpening, noise) before the learning rates.')
  if losses:
    return (f'Local training stayed finite; it went non-finite in {", ".join(losses)}: lower '
            'distill.learning_rate (or train.learning_rate) or check the data.')
  return 'Lower train.learning_rate (or distill.learning_rate) or check the data.'


def client_record(algo, state, t: int) -> dict[str, Any]:
  """``clients.json``: each client model's test accuracy and loss after round ``t``."""
  spec = algo.spec
  acc, nll = algo.ctx.fed.evaluate(state.clients, per_client_test=spec.data.per_client_test,
                               chunk=spec.eval.chunk)
  d = algo.ctx.data

  def floats(a):
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, np.float64)]

  return {'round': t, 'split': 'client test splits' if spec.data.per_client_test
          else 'server test set', 'acc': floats(acc), 'loss': floats(nll),
          'test_n': (np.asarray(d.test_n).astype(int).tolist()
                     if spec.data.per_client_test and d.test_n is not None else None),
          'train_n': np.asarray(d.client_n).astype(int).tolist(),
          'client_models': list(spec.clients.models)}
