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
