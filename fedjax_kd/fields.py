"""Reading config fields: one checked value per call, one clear error per bad value.

Each reader takes an ``ml_collections.ConfigDict`` (or any nested mapping) and
a dotted field name, and returns the value or raises
:class:`~fedjax_kd.errors.ConfigError` naming the field, the value and what is
allowed. ``fedjax_kd.options`` checks every declared option with these; a leaf
module.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import numpy as np

from fedjax_kd.errors import ConfigError
from fedjax_kd.ops.errors import ParamError

# The smallest temperature a softmax(x / T) option takes: at 1e-4 ERA is already an argmax
# of the averaged probabilities, and at 1e-30 a DS-FL round produced NaN in float32.
MIN_TEMPERATURE = 1e-4


def get(c, field: str):
  node = c
  for part in field.split('.'):
    try:
      node = node[part]
    except (KeyError, AttributeError):
      raise ConfigError(field, None, 'a value (the field is missing)') from None
  return node


def integer(c, field: str, lo: int | None = None, hi: int | None = None) -> int:
  v = get(c, field)
  if isinstance(v, bool) or not isinstance(v, int):
    raise ConfigError(field, v, 'an integer')
  if (lo is not None and v < lo) or (hi is not None and v > hi):
    rng = f'>= {lo}' if hi is None else f'in [{lo}, {hi}]'
    raise ConfigError(field, v, f'an integer {rng}')
  return v


def number(c, field: str, lo: float | None = None, lo_open: bool = False,
           hi: float | None = None) -> float:
  v = get(c, field)
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise ConfigError(field, v, 'a finite number')
  v = float(v)
  if lo is not None and (v <= lo if lo_open else v < lo):
    raise ConfigError(field, v, f'a number {">" if lo_open else ">="} {lo}'
                      + ('' if hi is None else f' and <= {hi}'))
  if hi is not None and v > hi:
    raise ConfigError(field, v, f'a number <= {hi}')
  return v


def boolean(c, field: str) -> bool:
  v = get(c, field)
  if not isinstance(v, (bool, np.bool_)):
    raise ConfigError(field, v, 'True or False')
  return bool(v)


def choice(c, field: str, allowed: Sequence[str]) -> str:
  v = get(c, field)
  if v not in allowed:
    raise ConfigError(field, v, tuple(allowed))
  return v


@contextlib.contextmanager
def as_fields(fields_by_param: dict[str, str]) -> Iterator[None]:
  """Raises a library's :class:`~fedjax_kd.ops.errors.ParamError` as the config field that fed it.

  The layers below the config (``ops``, ``data``, ``models``) name their own parameters; the
  code that calls them with a config's values wraps the call::

    with fields.as_fields({'alpha': 'data.alpha', 'num_clients': 'clients.num_clients'}):
      partition.partition(...)

  A :class:`ConfigError` (already a field) passes through unchanged.
  """
  try:
    yield
  except ConfigError:
    raise
  except ParamError as e:
    raise field_error(e, fields_by_param) from None


def field_error(error: ParamError, fields_by_param: dict[str, str]) -> ConfigError:
  """An op's :class:`~fedjax_kd.ops.errors.ParamError` as the config field that fed it.

  Args:
    error: what the op raised (it names the op's parameter).
    fields_by_param: op parameter name -> config field name; a parameter not
      listed keeps its own name.
  """
  return ConfigError(fields_by_param.get(error.param, error.param), error.value, error.allowed)
