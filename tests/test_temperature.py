"""ACE-pFL dynamic temperature (Eq. 2) against a reference table computed from its formula."""

import math

import numpy as np
import pytest

from fedjax_kd.ops import temperature as temp
from fedjax_kd.ops.errors import ParamError

ROUNDS = (1, 2, 50, 99, 100, 101, 150, 199, 200, 201, 250, 299, 300)
RECOMMENDED = (35.1250, 35.2498, 39.2414, 39.9297, 39.9665, 40.0915, 44.2080,
               44.8962, 44.9331, 45.0580, 49.1745, 49.8627, 49.8996)
RAW_DELTA = (39.9331, 39.9995, 40.0000, 40.0000, 39.9665, 44.8996, 44.9665,
             44.9665, 44.9331, 49.8661, 49.9331, 49.9331, 49.8996)
AS_PRINTED = (39.9331, 39.9995, 44.9665, 54.8996, 49.8996, 54.8327, 64.8327,
              69.7992, 64.7992, 69.7323, 79.7323, 84.6988, 84.6654)


@pytest.mark.parametrize('kwargs,expected', [
    ({}, RECOMMENDED),
    ({'normalize_delta': False}, RAW_DELTA),
    ({'normalize_delta': False, 'stage_div': 'T0'}, AS_PRINTED),
])
def test_reference_table(kwargs, expected):
  got = [temp.dynamic_temperature(r, **kwargs) for r in ROUNDS]
  np.testing.assert_allclose(got, expected, atol=1e-4)
  sched = temp.temperature_schedule(300, **kwargs)
  np.testing.assert_allclose(sched[np.array(ROUNDS) - 1], expected, atol=1e-4)


def test_hand_value_r1():
  # stage 0, x = 0.01: 30 + 2 * 5 * sigma(0.05).
  assert temp.dynamic_temperature(1) == pytest.approx(
      30 + 10 / (1 + math.exp(-0.05)), abs=1e-12)


def test_recommended_monotone_and_continuous():
  sched = temp.temperature_schedule(300)
  assert sched.dtype == np.float64 and sched.shape == (300,)
  assert np.all(np.diff(sched) >= 0)
  # Largest step is at a stage restart: k1 sigma(k2) + 2 k1 (sigma(0) - sigma(k2 .99)) ~ 0.037.
  assert np.max(np.diff(sched)) < 0.2


def test_as_printed_is_not_monotone():
  sched = temp.temperature_schedule(300, normalize_delta=False, stage_div='T0')
  assert np.any(np.diff(sched) < 0)


def test_f4_spec_values():
  f4 = lambda r: temp.dynamic_temperature(r, curve='f4')
  # Spec: "about 30.4", 58.43, 60.28, 120.05 (two decimals).
  assert f4(1) == pytest.approx(30.4, abs=0.05)
  assert f4(99) == pytest.approx(58.43, abs=0.01)
  assert f4(100) == pytest.approx(60.28, abs=0.005)
  assert f4(300) == pytest.approx(120.05, abs=0.005)
  # Exact: 30 + 3 (1 + e^5) / 5 + 2 / 5.
  assert f4(300) == pytest.approx(30 + 3 * (1 + math.exp(5)) / 5 + 0.4,
                                  abs=1e-12)
  sched = temp.temperature_schedule(300, curve='f4')
  assert np.all(np.diff(sched) > 0)


def test_f4_raw_delta_overflow_is_a_param_error():
  # Raw dr with k1 = 5 is finite (e^495) but absurd; with k1 = 10 it overflows.
  assert temp.dynamic_temperature(99, curve='f4', normalize_delta=False) > 1e200
  with pytest.raises(ParamError) as err:
    temp.dynamic_temperature(99, k1=10., curve='f4', normalize_delta=False)
  assert err.value.param == 'k1'


@pytest.mark.parametrize('curve', ['f2', 'f3', 'f5'])
@pytest.mark.parametrize('rounds', [300, 120])
def test_alt_curve_endpoints(curve, rounds):
  sched = temp.temperature_schedule(rounds, curve=curve)
  f1 = temp.temperature_schedule(rounds)
  assert sched[0] == pytest.approx(f1[0], abs=1e-12)
  assert sched[-1] == pytest.approx(f1[-1], abs=1e-12)
  assert np.all(np.diff(sched) > 0)


def test_alt_curve_shapes():
  f2, f3, f5 = (temp.temperature_schedule(300, curve=c) for c in ('f2', 'f3', 'f5'))
  ts, te = temp.dynamic_temperature(1), temp.dynamic_temperature(300)
  np.testing.assert_allclose(f5, ts + (te - ts) * np.arange(300) / 299, atol=1e-12)
  mid = slice(1, -1)
  assert np.all(f2[mid] > f5[mid]) and np.all(f3[mid] < f5[mid])
  # Hand values at u = 1/2: tanh(1.25) / tanh(2.5) and 1 / (e^2.5 + 1).
  u_mid = temp.dynamic_temperature(150, curve='f2', rounds=299)
  assert u_mid == pytest.approx(
      ts + (temp.dynamic_temperature(299) - ts) * math.tanh(1.25) / math.tanh(2.5))
  u_mid = temp.dynamic_temperature(150, curve='f3', rounds=299)
  assert u_mid == pytest.approx(
      ts + (temp.dynamic_temperature(299) - ts) / (math.exp(2.5) + 1))
  # k2 = 0: both reduce to the linear curve.
  lin = temp.temperature_schedule(50, k2=0., curve='f5')
  for c in ('f2', 'f3'):
    np.testing.assert_allclose(temp.temperature_schedule(50, k2=0., curve=c), lin)
  # Large k2 stays finite.
  assert np.all(np.isfinite(temp.temperature_schedule(50, k2=2000., curve='f3')))


def test_fixed():
  np.testing.assert_array_equal(temp.temperature_schedule(10, t0=7.5, curve='fixed'),
                                np.full(10, 7.5))


@pytest.mark.parametrize('kwargs,field', [
    ({'t0': 0.}, 't0'),
    ({'t0': -3.}, 't0'),
    ({'t0': float('nan')}, 't0'),
    ({'k1': float('inf')}, 'k1'),
    ({'k2': float('nan')}, 'k2'),
    ({'r0': 0}, 'r0'),
    ({'r0': 2.5}, 'r0'),
    ({'curve': 'f9'}, 'curve'),
    ({'stage_div': 'rounds'}, 'stage_div'),
    ({'curve': 'f4', 'k2': 0.}, 'k2'),
])
def test_bad_args_raise_a_param_error(kwargs, field):
  with pytest.raises(ParamError) as err:
    temp.dynamic_temperature(5, **kwargs)
  assert err.value.param == field
  assert field in str(err.value)


def test_validate_temperature_accepts_defaults_and_bad_rounds():
  temp.validate_temperature(30., 5., 5., 100, 'f1', 'r0')
  with pytest.raises(ParamError):
    temp.validate_temperature(30., 5., 5., 100, 'bogus', 'r0')
  with pytest.raises(ValueError):
    temp.dynamic_temperature(0)
  with pytest.raises(ValueError):
    temp.dynamic_temperature(301, curve='f5', rounds=300)
