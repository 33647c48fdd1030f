"""Counting and timing XLA compilations.

:func:`count_compiles` checks that a loop compiles only once;
:func:`time_compiles` measures how long a block spent compiling (the runner's
``compile_s`` and its "compiled N programs" line).

JAX reports every compilation through :mod:`jax.monitoring`: each jitted
function (or eager primitive) that misses JAX's in-memory executable cache is
lowered to StableHLO and handed to the backend, and the backend step is timed
under the ``'/jax/core/compile/backend_compile_duration'`` event. That event
fires whether the executable is then built by XLA or read back from the
persistent compilation cache (the tests enable one), so it counts compile
*requests*: a retrace of a function whose program is already on disk still
counts. A repeat call with the same shapes, dtypes and static arguments hits
the in-memory cache and records nothing.

Compile time is what JAX reports for the three steps that precede running a
program the first time: tracing the Python function to a jaxpr
(``jaxpr_trace_duration``), lowering it to StableHLO
(``jaxpr_to_mlir_module_duration``) and the backend step above. Each is timed
by JAX for the outermost function only (nested jits are part of their
caller's trace), so the sum counts every second once. A persistent-cache hit
skips XLA's compilation but not the tracing and lowering: a warm start still
spends those.

Example::

  with count_compiles() as log:
    step(state, batch)
  assert log.count == 0, log.names
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Iterator

from jax import monitoring

BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'
TRACE_EVENT = '/jax/core/compile/jaxpr_trace_duration'
LOWER_EVENT = '/jax/core/compile/jaxpr_to_mlir_module_duration'
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'


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


@dataclasses.dataclass
class CompileTime:
  """What :func:`time_compiles` has seen so far (read it during the block or after).

  Attributes:
    programs: compilations requested (backend compiles, persistent-cache hits included).
    cache_hits: of those, the programs loaded from the persistent compilation cache.
    seconds: wall time spent tracing, lowering and compiling (or loading) them: the length
      of the union of those steps' intervals, since JAX's events nest (a jit traced inside
      another's trace) and their durations do not add up.
    last: ``time.monotonic()`` at the end of the latest of those steps (0.0: none yet).
  """
  programs: int = 0
  cache_hits: int = 0
  seconds: float = 0.0
  last: float = 0.0
  spans: list = dataclasses.field(default_factory=list, repr=False)

  def add(self, start: float, end: float) -> None:
    """Adds the interval ``[start, end]`` and updates ``seconds`` to the union's length."""
    kept = []
    for a, b in self.spans:
      if b < start or a > end:
        kept.append((a, b))
      else:
        start, end = min(a, start), max(b, end)
    kept.append((start, end))
    self.spans = kept
    self.seconds = float(sum(b - a for a, b in kept))


@contextlib.contextmanager
def time_compiles() -> Iterator[CompileTime]:
  """Times the compilations of the thread that enters the block.

  Yields:
    A :class:`CompileTime`, updated as compilations happen.
  """
  out = CompileTime()
  thread = threading.get_ident()
  timed = (TRACE_EVENT, LOWER_EVENT, BACKEND_COMPILE_EVENT)

  def on_duration(event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event in timed and threading.get_ident() == thread:
      now = time.monotonic()
      out.add(now - float(duration), now)
      out.last = now
      out.programs += event == BACKEND_COMPILE_EVENT

  def on_event(event: str, **kwargs) -> None:
    del kwargs
    if event == CACHE_HIT_EVENT and threading.get_ident() == thread:
      out.cache_hits += 1

  monitoring.register_event_duration_secs_listener(on_duration)
  monitoring.register_event_listener(on_event)
  try:
    yield out
  finally:
    monitoring.unregister_event_duration_listener(on_duration)
    monitoring.unregister_event_listener(on_event)
