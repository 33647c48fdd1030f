"""The error an op raises for an argument outside its domain.

Ops know their own parameter names only, never the config fields that feed
them: the config layer maps a :class:`ParamError` to the field
(``fedjax_kd.fields.field_error``), so a researcher calling an op directly sees
the op's parameter and a user of a config file sees the field.
"""

from __future__ import annotations

from typing import Any, Iterable


class ParamError(ValueError):
  """An op's argument is invalid; the message names it, the value given and what is allowed.

  Attributes:
    param: the op's parameter name (e.g. ``'t0'``).
    value: the value given.
    allowed: what the parameter accepts, in words.
  """

  def __init__(self, param: str, value: Any, allowed: str | Iterable[Any]):
    if not isinstance(allowed, str):
      allowed = 'one of ' + ', '.join(repr(a) for a in allowed)
    self.param = param
    self.value = value
    self.allowed = allowed
    super().__init__(f'{param}={one_line(value)} is not allowed: expected {allowed}.')


def one_line(value: Any) -> str:
  """``repr(value)`` on one line: a config group (anything with ``to_dict()``, such as an
  ``ml_collections.ConfigDict``) as its dict; a repr over several lines (an array's) has its
  line breaks and indents folded to one space."""
  to_dict = getattr(value, 'to_dict', None)
  if callable(to_dict):
    try:
      value = to_dict()
    except Exception:  # pylint: disable=broad-except
      pass
  text = repr(value)
  return ' '.join(text.split()) if '\n' in text else text
