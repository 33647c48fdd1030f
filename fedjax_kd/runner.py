"""The experiment loop: rounds, metrics files, progress, checkpoints, resume.

``workdir`` receives the files described in :mod:`fedjax_kd.running.workdir`: the
config, ``metrics.jsonl``/``metrics.csv`` (a row per round, written as it
goes), ``partition.json``, ``selection.json``, ``clients.json``,
``summary.json``, TensorBoard scalars and orbax checkpoints every
``checkpoint.every`` rounds and at exit (:mod:`fedjax_kd.running.checkpoint`).

Nothing is lost (docs/workdir.md):

* one run at a time holds the workdir (an OS lock; a second run is refused at start);
* rerunning the same command on the same workdir resumes after the newest
  checkpoint; the rows of rounds after it are recomputed, and because every
  random draw is a function of ``(seed, round)`` the resumed run's metrics
  equal an uninterrupted run's; TensorBoard's event files are rebuilt from
  ``metrics.jsonl`` at every start, so they hold every round once;
* SIGINT (Ctrl-C) or SIGTERM (preemption) finishes the current round, saves a
  checkpoint and stops; a second Ctrl-C aborts at once;
* a round that leaves NaN or Inf in the state stops the run with
  :class:`fedjax_kd.errors.DivergenceError` naming the round, the cohort and
  the arrays, before anything of that round is written, so the last good
  checkpoint stays the newest.

The loop is here; what it plays, records and checkpoints is a
:class:`fedjax_kd.running.session.Session` (its set-up, the rounds' rows, the compile
progress lines and the NaN guard).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Callable

from fedjax_kd.config.spec import ExperimentSpec
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.running import memory as memory_lib
from fedjax_kd.running import watchdog
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.running.session import Session


# ------------------------------------------------------- graceful stop
class _StopOnSignal(contextlib.AbstractContextManager):
  """SIGINT/SIGTERM set a flag the loop checks after each round.

  A second SIGINT aborts at once: it raises KeyboardInterrupt, and whatever leaves the block
  after it leaves as KeyboardInterrupt. Python code that C calls back (numpy's dtype
  lookup, a garbage-collector callback) cannot pass a KeyboardInterrupt on: C wraps it (a
  ``SystemError`` whose cause is the KeyboardInterrupt) or prints and drops it. So the
  abort is remembered here, and :meth:`check` (after each round) raises it again should it
  have been dropped. Handlers are installed only on the main thread (Python's rule) and
  restored on exit.
  """

  def __init__(self, log: Callable[[str], None]):
    self.signum: int | None = None
    self.aborted = False
    self._log = log
    self._old: dict[int, Any] = {}

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None and signum == signal.SIGINT:
      self.aborted = True
      raise KeyboardInterrupt
    self.signum = signum
    self._log(f'{signal.Signals(signum).name}: stopping after this round and saving a '
              'checkpoint (Ctrl-C again to abort at once)')

  def check(self) -> None:
    """Raises KeyboardInterrupt if a second SIGINT came and its exception was dropped."""
    if self.aborted:
      raise KeyboardInterrupt

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for s in (signal.SIGINT, signal.SIGTERM):
        self._old[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, exc_type, exc, tb):
    for s, h in self._old.items():
      signal.signal(s, h)
    if self.aborted and exc is not None and not isinstance(exc, KeyboardInterrupt):
      raise KeyboardInterrupt from exc   # the abort, wrapped on its way out by C code
    return False


# ---------------------------------------------------------------- loop
def run(spec: ExperimentSpec, workdir: str, *, resume: bool = True,
        progress: bool = True, log: Callable[[str], None] | None = None,
        memory_check: bool | None = None, until: int | None = None) -> dict[str, Any]:
  """Runs an experiment end to end, or resumes it; returns the summary dict.

  Args:
    spec: a validated experiment (:func:`fedjax_kd.config.validate`).
    workdir: output directory; a checkpoint in it is resumed from.
    resume: False ignores (and overwrites) an existing checkpoint.
    progress: print a line per round and the closing table.
    log: where progress lines go (default: stderr).
    memory_check: refuse a run whose estimated device memory exceeds the device's before
      anything compiles (:mod:`fedjax_kd.running.memory`); None: on unless
      ``$FEDJAX_KD_MEMORY_CHECK`` is 0/off/false/no.
    until: stop after this round, everything else (schedules over ``spec.rounds``
      included) as in the whole run, so its rows are the whole run's first rows
      (a replay of an archived run's start); None: run every round.

  Returns:
    The content of ``summary.json``; ``stopped_by`` names the signal when the
    run was stopped early.

  Raises:
    ConfigError: the workdir holds a checkpoint of a different config.
    DataError: bad data files or an unreadable checkpoint.
    DeviceMemoryError: the run does not fit the device (refused before it compiles), or
      the device ran out of memory mid-run.
    DivergenceError: a round produced NaN or Inf.
  """
  if memory_check is None:
    memory_check = memory_lib.enabled()
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  with contextlib.ExitStack() as cleanup:
    # One run at a time per workdir (and per disk client store): a second run is refused
    # before anything is built or written. Taking the lock also proves the folder writable.
    held = [cleanup.enter_context(workdir_lib.DirLock(workdir))]
    try:
      session = Session(spec, workdir, resume=resume, progress=progress, log=log,
                        cleanup=cleanup, held=held, memory_check=memory_check)
    except (ConfigError, DataError):   # refused before writing: leave no new empty folder
      for lock in reversed(held):
        lock.discard()
      raise
    return _loop(session, log, until)


def _loop(session: Session, log: Callable[[str], None], until: int | None) -> dict[str, Any]:
  """The rounds of a set-up session, up to ``until`` (None: every round), checkpointed as
  due and stopped gracefully by a signal; returns the summary."""
  with _StopOnSignal(log) as stop:
    try:
      with session.out_of_memory():
        last = session.spec.rounds if until is None else min(until, session.spec.rounds)
        for t in range(session.start, last + 1):
          watchdog.note_round(t, session.last_saved)   # named if a process is lost
          session.record(session.play(t))
          stop.check()
          if session.checkpoint(t, stop.signum):
            break
        stop.check()   # a second Ctrl-C dropped during the last checkpoint
    finally:
      session.close()
  return session.finish(stop.signum)
