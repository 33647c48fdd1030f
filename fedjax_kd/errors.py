"""Errors raised for bad user input, before any compute starts."""

from __future__ import annotations

from typing import Any, Iterable


class ConfigError(ValueError):
  """A configuration field has a bad value.

  The message always names the field, the value given and what is allowed.
  """

  def __init__(self, field: str, value: Any, allowed: str | Iterable[Any]):
    if not isinstance(allowed, str):
      allowed = 'one of ' + ', '.join(repr(a) for a in allowed)
    self.field = field
    self.value = value
    self.allowed = allowed
    super().__init__(f'{field}={value!r} is not allowed: expected {allowed}.')


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
