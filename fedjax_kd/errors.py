"""Errors raised for bad user input (before any compute starts) and for faults under a run."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable, Iterator

from fedjax_kd.ops.errors import ParamError


class ConfigError(ParamError):
  """A configuration field (or command-line flag) has a bad value.

  The message always names the field, the value given and what is allowed
  (``field=value is not allowed: expected ...``), as an op's
  :class:`~fedjax_kd.ops.errors.ParamError` names its parameter.
  """

  def __init__(self, field: str, value: Any, allowed: str | Iterable[Any]):
    super().__init__(field, value, allowed)
    self.field = field


class DataError(ValueError):
  """A data file or data source is missing, corrupt or has the wrong layout."""


class DivergenceError(RuntimeError):
  """A round produced NaN or Inf; the run stopped before recording it.

  Attributes:
    round: the round that diverged.
    cohort: the ids of the clients that took part in it.
    quantities: the arrays (and metrics) holding non-finite values.
  """

  def __init__(self, round_: int, cohort: list[int], quantities: list[str], advice: str = ''):
    self.round = round_
    self.cohort = list(cohort)
    self.quantities = list(quantities)
    shown = ', '.join(map(str, self.cohort[:20])) + (' ...' if len(self.cohort) > 20 else '')
    names = '; '.join(self.quantities[:8]) + (
        f'; and {len(self.quantities) - 8} more' if len(self.quantities) > 8 else '')
    super().__init__(f'round {round_} produced NaN or Inf in {names}. The round\'s cohort: '
                     f'clients [{shown}] ({len(self.cohort)} clients). '
                     f'Nothing of round {round_} was written; {advice}')


def is_disk_full(error: BaseException) -> bool:
  """Whether ``error`` says a write ran out of disk space (or over quota): an ``OSError``
  with ``ENOSPC``/``EDQUOT``, or a wrapped one (TensorStore's ``RESOURCE_EXHAUSTED``)."""
  import errno  # pylint: disable=g-import-not-at-top
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
    return True
  text = str(error)
  return 'No space left on device' in text or 'Disk quota exceeded' in text


class DiskFullError(DataError):
  """A file of the run could not be written: its device is full (or over quota).

  The run stops at once. What it wrote before stays and the file being written is left as
  it was (no half row, no half checkpoint), so the same command resumes from the newest
  checkpoint once there is room.

  Attributes:
    path: the file (or checkpoint) that could not be written.
    free: the bytes free on its device when it failed (None if unknown).
  """

  def __init__(self, path: str):
    import shutil  # pylint: disable=g-import-not-at-top
    probe = path
    while probe and not os.path.exists(probe):
      probe = os.path.dirname(probe)
    try:
      self.free = shutil.disk_usage(probe or '.').free
      free = (f'{self.free / 1e6:.1f} MB' if self.free >= 1e5 else f'{self.free:,} bytes')
    except OSError:
      self.free, free = None, 'unknown'
    self.path = path
    super().__init__(f'no space left to write {path} ({free} free on its device): free some '
                     'space or move the workdir to a larger disk, then rerun the same command '
                     'to resume from the newest checkpoint')


@contextlib.contextmanager
def disk_full_as(path: str) -> Iterator[None]:
  """Inside, an error saying the disk is full (:func:`is_disk_full`) becomes
  :class:`DiskFullError` naming ``path``; other errors pass unchanged."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if is_disk_full(e):
      raise DiskFullError(path) from None
    raise


class DeviceMemoryError(DataError):
  """A run does not fit its device's memory: refused before it compiles (the estimate
  exceeds the device), or stopped when XLA ran out of memory mid-run. The message is one
  line with the estimate, the device's memory and the settings that would fit."""
