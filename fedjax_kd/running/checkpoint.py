"""Round checkpoints with orbax (``<workdir>/checkpoints/<round>/``).

A checkpoint holds the whole :class:`fedjax_kd.algorithms.base.AlgState`
(every client's parameters, batch statistics and optimizer states, the server
model, the soft-label caches with their timestamps, counters) and the loop's
own counters (round, cumulative and setup communication). PRNG keys are not
stored: every key is a pure function of ``(seed, round, phase)``
(:mod:`fedjax_kd.core.rng`), so the round counter restores them.

Orbax writes each step into a temporary directory and renames it when
complete, so a crash mid-save leaves the previous checkpoint intact; the
newest ``keep`` steps are kept. Restoring reads array files (tensorstore) and
JSON, never pickle. Saves are synchronous: the next round donates the state's
buffers to the training step.

Damage: after a save, the size and SHA-256 of every file of the step go to
``<round>/fedjax_kd_checksums.json``. :meth:`Checkpointer.restore` tries the newest
step first; a step whose files differ from their checksums (silent corruption, a
truncated file) or that orbax cannot read is renamed ``<round>.damaged`` (never
deleted: it stays for inspection) with one warning line, and the step before it is
tried, down to the oldest. Where none restores, the run is refused with one line
that says what to do. A step written before checksums existed is trusted as long as
orbax reads it.

Multi-host runs (:mod:`fedjax_kd.running.distributed`): every process calls ``save`` and
``restore`` on the same directory (a file system all hosts share); orbax
writes each array shard once and process 0 commits the step. Process-local
leaves (identical on every process) are saved as replicated global arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from typing import Any, Callable, Iterator

import jax

from fedjax_kd.errors import DataError, disk_full_as, is_disk_full
from fedjax_kd.running import distributed
from fedjax_kd.running import workdir as workdir_lib

DIRNAME = 'checkpoints'
CHECKSUMS = 'fedjax_kd_checksums.json'   # in each step directory, written after the save
DAMAGED = '.damaged'                     # suffix of a step kept aside


def file_digests(step_dir: str) -> dict[str, list]:
  """``{relative path: [size, sha256]}`` of every file under a step directory (the checksum
  file itself left out)."""
  out = {}
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, step_dir)
      if rel.startswith(CHECKSUMS):   # the checksum file (and its .tmp while written)
        continue
      h = hashlib.sha256()
      with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
          h.update(block)
      out[rel] = [os.path.getsize(path), h.hexdigest()]
  return dict(sorted(out.items()))


def verify(step_dir: str) -> str | None:
  """What is wrong with a step's files against its checksums; None when they match (or the
  step has no checksum file: it was written before there were any)."""
  path = os.path.join(step_dir, CHECKSUMS)
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      want = json.load(f)
  except (OSError, ValueError) as e:
    return f'its checksum file is unreadable ({type(e).__name__})'
  got = file_digests(step_dir)
  for rel, (size, digest) in want.items():
    if rel not in got:
      return f'{rel} is missing'
    if got[rel][0] != size:
      return f'{rel} has {got[rel][0]} bytes, {size} when saved'
    if got[rel][1] != digest:
      return f'{rel} differs from its checksum'
  return None


def has_steps(workdir: str) -> bool:
  """Whether ``<workdir>/checkpoints`` holds a saved step (a ``<round>/`` directory)."""
  directory = os.path.join(workdir, DIRNAME)
  return os.path.isdir(directory) and any(
      n.isdigit() and os.path.isdir(os.path.join(directory, n)) for n in os.listdir(directory))


def latest_round(workdir: str) -> int | None:
  """The newest round saved in ``<workdir>/checkpoints`` (a finished step's ``<round>/``
  directory; a save cut short leaves a temporary one), or None: what a resume starts after,
  known before anything of the run is built."""
  directory = os.path.join(workdir, DIRNAME)
  if not os.path.isdir(directory):
    return None
  steps = [int(n) for n in os.listdir(directory)
           if n.isdigit() and os.path.isdir(os.path.join(directory, n))]
  return max(steps) if steps else None


def remove_steps(workdir: str) -> list[str]:
  """Removes the checkpoints a run wrote in ``<workdir>/checkpoints`` (``--noresume``).

  Only orbax's step directories go: ``<round>/`` and the temporary
  ``<round>.orbax-checkpoint-tmp*`` of a save cut short. Anything else in the folder is not
  ours and stays, as does the folder.

  Returns:
    The names removed.
  """
  directory = os.path.join(workdir, DIRNAME)
  if not os.path.isdir(directory):
    return []
  removed = []
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    step = name.split('.orbax-checkpoint-tmp', 1)[0]
    if step.isdigit() and os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path)
      removed.append(name)
  return removed


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
  """Orbax logs each failed write as an error line (a page of TensorStore spec) before it
  raises, and TensorStore's writes still in flight call back into orbax's event loop after
  the failure closed it (each a ``RuntimeError: Event loop is closed`` traceback). The
  exception is what the run reports, in one line, so while a save runs those lines are
  muted and those callbacks' errors dropped (:func:`_ignore_closed_loop_callbacks`)."""
  import sys  # pylint: disable=g-import-not-at-top
  loggers = [logging.getLogger(name) for name in ('absl', 'asyncio')]
  levels = [logger.level for logger in loggers]
  hooks = sys.excepthook, sys.unraisablehook
  for logger in loggers:
    logger.setLevel(logging.CRITICAL)
  _ignore_closed_loop_callbacks()
  try:
    yield
  except BaseException:
    raise                     # the failed save's callbacks may come later: the hooks stay
  else:
    sys.excepthook, sys.unraisablehook = hooks
  finally:
    for logger, level in zip(loggers, levels):
      logger.setLevel(level)


def _closed_loop(exc: BaseException | None) -> bool:
  return isinstance(exc, RuntimeError) and str(exc) == 'Event loop is closed'


def _ignore_closed_loop_callbacks() -> None:
  """Drops ``RuntimeError: Event loop is closed`` (and only that) from ``sys.excepthook`` and
  ``sys.unraisablehook``: what TensorStore's callbacks raise when a failed save has closed
  orbax's event loop under them."""
  import sys  # pylint: disable=g-import-not-at-top
  if getattr(sys.excepthook, '_fedjax_kd', False):
    return
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

  def on_exception(kind, value, tb):
    if not _closed_loop(value):
      excepthook(kind, value, tb)

  def on_unraisable(info):
    if not _closed_loop(info.exc_value):
      unraisablehook(info)

  on_exception._fedjax_kd = True   # pylint: disable=protected-access
  sys.excepthook, sys.unraisablehook = on_exception, on_unraisable


def _abstract(tree: Any) -> Any:
  """Shapes, dtypes and shardings of ``tree`` (the restore target)."""
  def leaf(x):
    if isinstance(x, jax.Array):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
    return x
  return jax.tree.map(leaf, tree)


class Checkpointer:
  """Saves and restores a run's state in ``<workdir>/checkpoints``.

  Args:
    workdir: the run's directory.
    keep: how many of the newest checkpoints to keep (>= 1).
  """

  def __init__(self, workdir: str, keep: int = 2):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self._ocp = ocp
    self.directory = os.path.join(os.path.abspath(workdir), DIRNAME)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=False)
    self._mgr = ocp.CheckpointManager(self.directory, options=options)

  def latest_round(self) -> int | None:
    """The newest saved round, or None."""
    return self._mgr.latest_step()

  def save(self, round_: int, state: Any, meta: dict[str, Any]) -> None:
    """Saves ``state`` and the JSON-able ``meta`` as step ``round_``, then its checksums."""
    ocp = self._ocp
    step_dir = os.path.join(self.directory, str(round_))
    with disk_full_as(step_dir):
      try:
        with _quiet_orbax():
          self._mgr.save(round_, args=ocp.args.Composite(
              state=ocp.args.StandardSave(distributed.globalize(state)),
              meta=ocp.args.JsonSave(meta)), force=True)
          self._mgr.wait_until_finished()
      except Exception as e:  # pylint: disable=broad-except
        if is_disk_full(e):
          self._remove_partial(round_)
        raise
    if distributed.is_primary():
      # Atomic, process 0 only; on a full disk the step is complete and, without its
      # checksums, trusted as orbax reads it.
      workdir_lib.write_json(os.path.join(step_dir, CHECKSUMS), file_digests(step_dir))

  def _remove_partial(self, round_: int) -> None:
    """Removes what a save cut short left: orbax's temporary step directories of ``round_``
    (written by this run; a complete step is never touched)."""
    if not distributed.is_primary() or not os.path.isdir(self.directory):
      return
    for name in os.listdir(self.directory):
      if name.startswith(f'{round_}.orbax-checkpoint-tmp'):
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

  def _set_aside(self, step: int) -> str:
    """Renames a damaged step ``<round>.damaged`` (``.damaged2``, ... if taken); returns it."""
    src = os.path.join(self.directory, str(step))
    dst, n = src + DAMAGED, 1
    while os.path.exists(dst):
      n += 1
      dst = f'{src}{DAMAGED}{n}'
    if distributed.is_primary():
      os.rename(src, dst)
    return dst

  def restore(self, like: Any, warn: Callable[[str], None] | None = None
              ) -> tuple[Any, dict[str, Any]] | None:
    """The newest checkpoint that restores, onto ``like``'s structure, or None.

    A damaged step (its files differ from their checksums, or orbax cannot read it) is kept
    aside as ``<round>.damaged`` with a ``warn`` line, and the step before it is tried.

    Args:
      like: a state with the structure, shapes, dtypes and shardings expected
        (e.g. ``algorithm.init()``).
      warn: where the line about a damaged step goes (default: nowhere).

    Returns:
      ``(state, meta)`` or None when the directory holds no checkpoint.

    Raises:
      DataError: no step restores, or the newest readable one belongs to another experiment
        (different structure).
    """
    steps = sorted(self._mgr.all_steps(), reverse=True)
    if not steps:
      return None
    ocp = self._ocp
    aside = []
    for step in steps:
      step_dir = os.path.join(self.directory, str(step))
      problem = verify(step_dir)
      if problem is None:
        try:
          out = self._mgr.restore(step, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(distributed.abstract_global(_abstract(like))),
              meta=ocp.args.JsonRestore()))
        except Exception as e:  # pylint: disable=broad-except
          if os.path.isfile(os.path.join(step_dir, CHECKSUMS)):
            # Its files are as saved: not damage, a state of another shape.
            raise DataError(
                f'checkpoint {step_dir} cannot be restored into this experiment '
                f'({type(e).__name__}: {" ".join(str(e).split())[:300]}). Use a new '
                f'--workdir, or rerun with --noresume to start over.') from e
          problem = f'{type(e).__name__}: {" ".join(str(e).split())[:200]}'
      if problem is None:
        break
      aside.append(self._set_aside(step))
      if warn is not None:
        warn(f'warning: checkpoint {self.directory}/{step} is damaged ({problem}); kept '
             f'aside as {aside[-1]}' + ('; trying the one before it' if step != steps[-1]
                                         else ''))
    else:
      self._mgr.reload()
      raise DataError(
          f'no checkpoint in {self.directory} restores (kept aside: {", ".join(aside)}); '
          'rerun with --noresume to start this workdir over, or use a new --workdir')
    if aside:
      self._mgr.reload()
    got, want = jax.tree.structure(out.state), jax.tree.structure(like)
    if got != want:
      raise DataError(f'checkpoint {self.directory}/{step} does not match this experiment\'s '
                      'state; use a new --workdir or delete the checkpoints directory.')
    return distributed.localize(out.state, like), dict(out.meta)

  def close(self) -> None:
    self._mgr.close()
