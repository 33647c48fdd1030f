"""Counting XLA compilations, to check that a loop compiles only once.

JAX reports every compilation through :mod:`jax.monitoring`: each jitted
function (or eager primitive) that misses JAX's in-memory executable cache is
lowered to StableHLO and handed to the backend, and the backend step is timed
under the ``'/jax/core/compile/backend_compile_duration'`` event. That event
fires whether the executable is then built by XLA or read back from the
persistent compilation cache (the tests enable one), so it counts compile
*requests*: a retrace of a function whose program is already on disk still
counts. A repeat call with the same shapes, dtypes and static arguments hits
the in-memory cache and records nothing.

Example::

  with count_compiles() as log:
    step(state, batch)
  assert log.count == 0, log.names
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator

from jax import monitoring

BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


@dataclasses.dataclass
class CompileLog:
  """The compilations seen while :func:`count_compiles` was active.

  Attributes:
    names: the compiled functions' names (``jit(<name>)`` or a primitive's
      name), one entry per compilation, in order.
  """
  names: list[str] = dataclasses.field(default_factory=list)

  @property
  def count(self) -> int:
    """How many compilations were requested."""
    return len(self.names)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileLog]:
  """Counts XLA compilations (including persistent-cache hits) while active.

  Yields:
    A :class:`CompileLog` filled in as compilations happen; read it after the
    block (or during it, for a running count). Only compilations of the
    thread that entered the block are counted.
  """
  log = CompileLog()
  thread = threading.get_ident()

  def listener(event: str, duration: float, **kwargs) -> None:
    del duration
    if event == BACKEND_COMPILE_EVENT and threading.get_ident() == thread:
      log.names.append(str(kwargs.get('fun_name', '?')))

  monitoring.register_event_duration_secs_listener(listener)
  try:
    yield log
  finally:
    monitoring.unregister_event_duration_listener(listener)
