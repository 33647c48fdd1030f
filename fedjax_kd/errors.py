"""Errors raised for bad user input, before any compute starts."""

from __future__ import annotations

from typing import Any, Iterable

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
