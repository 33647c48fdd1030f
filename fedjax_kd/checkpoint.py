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

Multi-host runs (:mod:`fedjax_kd.distributed`): every process calls ``save`` and
``restore`` on the same directory (a file system all hosts share); orbax
writes each array shard once and process 0 commits the step. Process-local
leaves (identical on every process) are saved as replicated global arrays.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import jax

from fedjax_kd import distributed
from fedjax_kd.errors import DataError

DIRNAME = 'checkpoints'


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
    """Saves ``state`` and the JSON-able ``meta`` as step ``round_``."""
    ocp = self._ocp
    self._mgr.save(round_, args=ocp.args.Composite(
        state=ocp.args.StandardSave(distributed.globalize(state)),
        meta=ocp.args.JsonSave(meta)), force=True)
    self._mgr.wait_until_finished()

  def restore(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
    """The newest checkpoint restored onto ``like``'s structure, or None.

    Args:
      like: a state with the structure, shapes, dtypes and shardings expected
        (e.g. ``algorithm.init()``).

    Returns:
      ``(state, meta)`` or None when the directory holds no checkpoint.

    Raises:
      DataError: the checkpoint cannot be read or belongs to another
        experiment (different shapes or structure).
    """
    step = self.latest_round()
    if step is None:
      return None
    ocp = self._ocp
    try:
      out = self._mgr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(distributed.abstract_global(_abstract(like))),
          meta=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(
          f'checkpoint {self.directory}/{step} cannot be restored into this experiment '
          f'({type(e).__name__}: {str(e)[:300]}). Use a new --workdir, or delete '
          f'{self.directory} to start over.') from e
    got, want = jax.tree.structure(out.state), jax.tree.structure(like)
    if got != want:
      raise DataError(f'checkpoint {self.directory}/{step} does not match this experiment\'s '
                      'state; use a new --workdir or delete the checkpoints directory.')
    return distributed.localize(out.state, like), dict(out.meta)

  def close(self) -> None:
    self._mgr.close()
