"""ACE-pFL's dynamic distillation temperature (Eq. 2) and its alternatives.

K. He, H. Bai, Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation", IEEE/ACM
Transactions on Networking 2025.

The temperature is one scalar per round, so everything here is host-side
Python / numpy (float64). Round indices are 1-based (``r = 1..rounds``).

Eq. (2) as printed::

  T_r = T0 + k1 / (1 + e^{-k2}) * floor(r / T0) + 2 k1 / (1 + e^{-k2 dr}),
  dr  = r - r0 * floor(r / r0).

Our readings of it:

  * ``stage_div='r0'`` (default) uses the stage ``floor(r / r0)`` that the
    paper's text describes twice; ``stage_div='T0'`` is the literal
    ``floor(r / T0)`` of the printed equation (non-monotone, which contradicts
    the text's "continuously increase").
  * ``normalize_delta=True`` (default) feeds ``x = dr / r0`` in ``[0, 1)`` to
    the sigmoid, giving a smooth rise from 35.125 to 49.900 over 300 rounds
    with the defaults; ``normalize_delta=False`` is the literal raw ``dr``
    (the sigmoid saturates within 1-2 rounds: a staircase 40 / 45 / 50).

So the default curve ``'f1'`` is, with ``sigma(u) = 1 / (1 + e^{-u})``::

  stage = floor(r / r0),  x = (r - r0 * stage) / r0,
  T_r   = T0 + k1 sigma(k2) stage + 2 k1 sigma(k2 x).

Alternative curves (Fig. 5 / Table XIII):

  * ``'f4'`` (paper): ``T0 + (1 + e^{k1}) / k2 * stage + (1 + e^{k1 x}) / k2``,
    accelerating within each stage. ``stage_div`` and ``normalize_delta`` apply
    exactly as for f1; with the literal raw ``dr`` the exponential reaches
    ``e^{k1 (r0 - 1)}`` (``e^{495}`` with the defaults) and a
    :class:`~fedjax_kd.ops.errors.ParamError` is raised if it overflows float64.
    With the defaults (normalised) it runs from 30.41 (r=1) through 58.43
    (r=99) and 60.28 (r=100) to 120.05 (r=300).
  * ``'f2'``, ``'f3'``, ``'f5'``: the paper gives no formula. These are **our
    construction**, endpoint-matched to f1 on
    ``[1, rounds]``: with ``T_s = f1(1)``, ``T_e = f1(rounds)`` (same
    ``stage_div`` / ``normalize_delta``) and ``u = (r - 1) / (rounds - 1)``::

      f5 = T_s + (T_e - T_s) u                                     (linear)
      f2 = T_s + (T_e - T_s) (2 sigma(k2 u) - 1) / (2 sigma(k2) - 1)  (concave)
      f3 = T_s + (T_e - T_s) (e^{k2 u} - 1) / (e^{k2} - 1)            (convex)

    For ``k2 = 0`` f2 and f3 reduce to their limit, f5. ``rounds = 1`` gives
    ``T_s``.
  * ``'fixed'``: the "Fix." ablation (Table XII), ``T_r = T0``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fedjax_kd.ops.errors import ParamError

CURVES = ('f1', 'f2', 'f3', 'f4', 'f5', 'fixed')
STAGE_DIVS = ('r0', 'T0')


def _is_real(v) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool)


def validate_temperature(t0: float, k1: float, k2: float, r0: int,
                         curve: str = 'f1', stage_div: str = 'r0') -> None:
  """Checks the temperature hyperparameters; raises ``ParamError`` naming the bad one.

  Parameters: ``t0`` (finite, > 0), ``k1`` and ``k2``
  (finite; ``k2 != 0`` for ``'f4'``, which divides by it), ``r0``
  (an integer >= 1), ``acepfl.curve`` (one of :data:`CURVES`) and
  ``acepfl.stage_div`` (one of :data:`STAGE_DIVS`).
  """
  if not _is_real(t0) or not math.isfinite(t0) or t0 <= 0:
    raise ParamError('t0', t0, 'a finite number > 0')
  for name, v in (('k1', k1), ('k2', k2)):
    if not _is_real(v) or not math.isfinite(v):
      raise ParamError(name, v, 'a finite number')
  if not isinstance(r0, numbers.Integral) or isinstance(r0, bool) or r0 < 1:
    raise ParamError('r0', r0, 'an integer >= 1')
  if curve not in CURVES:
    raise ParamError('curve', curve, CURVES)
  if stage_div not in STAGE_DIVS:
    raise ParamError('stage_div', stage_div, STAGE_DIVS)
  if curve == 'f4' and k2 == 0:
    raise ParamError('k2', k2, "a non-zero number for curve 'f4'")


def _sigmoid(u: float) -> float:
  """Overflow-free logistic function."""
  if u >= 0:
    return 1.0 / (1.0 + math.exp(-u))
  e = math.exp(u)
  return e / (1.0 + e)


def _stage_and_x(r: int, t0: float, r0: int, stage_div: str,
                 normalize_delta: bool) -> tuple[int, float]:
  """The stage counter and the (normalised or raw) in-stage offset."""
  div = r0 if stage_div == 'r0' else t0
  stage = math.floor(r / div)
  dr = r - r0 * (r // r0)
  x = dr / r0 if normalize_delta else float(dr)
  return stage, x


def _f1(r, t0, k1, k2, r0, stage_div, normalize_delta) -> float:
  stage, x = _stage_and_x(r, t0, r0, stage_div, normalize_delta)
  return t0 + k1 * _sigmoid(k2) * stage + 2.0 * k1 * _sigmoid(k2 * x)


def _f4(r, t0, k1, k2, r0, stage_div, normalize_delta) -> float:
  stage, x = _stage_and_x(r, t0, r0, stage_div, normalize_delta)
  try:
    seg = (1.0 + math.exp(k1)) / k2 * stage
    rise = (1.0 + math.exp(k1 * x)) / k2
  except OverflowError:
    max_x = 1.0 if normalize_delta else float(r0 - 1)
    raise ParamError(
        'k1', k1,
        f"a value with exp(k1 * {max_x:g}) finite in float64 for curve 'f4' "
        f'(normalize_delta={normalize_delta})') from None
  out = t0 + seg + rise
  if not math.isfinite(out):
    raise ParamError('k1', k1,
                      "a value giving a finite temperature for curve 'f4'")
  return out


def _concave_ratio(k2: float, u: float) -> float:
  """``(2 sigma(k2 u) - 1) / (2 sigma(k2) - 1) = tanh(k2 u / 2) / tanh(k2 / 2)``."""
  if k2 == 0:
    return u
  return math.tanh(0.5 * k2 * u) / math.tanh(0.5 * k2)


def _convex_ratio(k2: float, u: float) -> float:
  """``(e^{k2 u} - 1) / (e^{k2} - 1)``, overflow-free for large ``|k2|``."""
  if k2 == 0:
    return u
  if k2 > 0:
    # e^{k2 (u - 1)} (1 - e^{-k2 u}) / (1 - e^{-k2}).
    return math.exp(k2 * (u - 1.0)) * math.expm1(-k2 * u) / math.expm1(-k2)
  return math.expm1(k2 * u) / math.expm1(k2)


def dynamic_temperature(r: int, t0: float = 30., k1: float = 5.,
                        k2: float = 5., r0: int = 100, *, curve: str = 'f1',
                        stage_div: str = 'r0', normalize_delta: bool = True,
                        rounds: int = 300) -> float:
  """The distillation temperature ``T_r`` of round ``r`` (1-based).

  Args:
    r: the round, an integer >= 1 (and <= ``rounds`` for f2 / f3 / f5).
    t0: the initial temperature ``T0``.
    k1, k2: the curve hyperparameters.
    r0: the stage length in rounds.
    curve: one of :data:`CURVES` (see the module docstring).
    stage_div: ``'r0'`` (recommended) or ``'T0'`` (literal Eq. 2).
    normalize_delta: ``True`` (recommended) feeds ``dr / r0`` to the
      sigmoid / exponential; ``False`` the literal raw ``dr``.
    rounds: the total number of rounds ``R``; only f2 / f3 / f5 use it (their
      endpoints are ``f1(1)`` and ``f1(rounds)``).

  Returns:
    ``T_r`` as a Python float.

  Raises:
    ParamError: a hyperparameter is invalid (see :func:`validate_temperature`),
      or f4's exponential overflows.
    ValueError: ``r`` or ``rounds`` is out of range.
  """
  validate_temperature(t0, k1, k2, r0, curve, stage_div)
  if not isinstance(r, numbers.Integral) or isinstance(r, bool) or r < 1:
    raise ValueError(f'round r={r!r} must be an integer >= 1')
  r = int(r)
  if curve == 'fixed':
    return float(t0)
  args = (t0, k1, k2, r0, stage_div, normalize_delta)
  if curve == 'f1':
    return _f1(r, *args)
  if curve == 'f4':
    return _f4(r, *args)
  if not isinstance(rounds, numbers.Integral) or isinstance(rounds, bool) \
      or rounds < 1:
    raise ParamError('rounds', rounds, 'an integer >= 1')
  if r > rounds:
    raise ValueError(f'round r={r} is beyond rounds={rounds} for curve '
                     f'{curve!r} (defined on [1, rounds])')
  t_s = _f1(1, *args)
  t_e = _f1(int(rounds), *args)
  u = 0.0 if rounds == 1 else (r - 1) / (rounds - 1)
  if curve == 'f5':
    ratio = u
  elif curve == 'f2':
    ratio = _concave_ratio(k2, u)
  else:  # 'f3'
    ratio = _convex_ratio(k2, u)
  return t_s + (t_e - t_s) * ratio


def temperature_schedule(rounds: int, t0: float = 30., k1: float = 5.,
                         k2: float = 5., r0: int = 100, *, curve: str = 'f1',
                         stage_div: str = 'r0',
                         normalize_delta: bool = True) -> np.ndarray:
  """``[T_1, ..., T_rounds]`` as a float64 array (see :func:`dynamic_temperature`)."""
  if not isinstance(rounds, numbers.Integral) or isinstance(rounds, bool) \
      or rounds < 1:
    raise ParamError('rounds', rounds, 'an integer >= 1')
  return np.array([
      dynamic_temperature(r, t0, k1, k2, r0, curve=curve, stage_div=stage_div,
                          normalize_delta=normalize_delta, rounds=rounds)
      for r in range(1, int(rounds) + 1)], dtype=np.float64)
