"""Label-count statistics the selection methods share: entropies, coverage and a
schedule's per-round figures (host-side numpy in float64).

Float64 because float32 sums can straddle FedEntOpt's tie tolerance and then break ties
differently from a float64 reference.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_counts(counts) -> np.ndarray:
  counts = np.asarray(counts, dtype=np.float64)
  if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
    raise ValueError(f'counts must be a non-empty [K, C] array, got shape '
                     f'{counts.shape}')
  if not np.all(np.isfinite(counts)) or np.any(counts < 0):
    raise ValueError('counts must be finite and non-negative')
  return counts


def entropy_bits(p: np.ndarray) -> np.ndarray:
  """Shannon entropy in bits over the last axis, ``0 * log 0 = 0``.

  Args:
    p: ``[..., C]`` already normalised rows (each sums to 1, or is all 0).

  Returns:
    float64 ``[...]`` entropies.
  """
  p = np.asarray(p, dtype=np.float64)
  pos = p > 0
  logs = np.log2(np.where(pos, p, 1.0))
  return -np.sum(np.where(pos, p * logs, 0.0), axis=-1)


def count_entropy(counts) -> np.ndarray:
  """Entropy in bits of ``counts / counts.sum()`` over the last axis.

  Args:
    counts: ``[..., C]`` non-negative counts (float or int).

  Returns:
    float64 ``[...]`` entropies; an all-zero row has entropy 0.
  """
  counts = np.asarray(counts, dtype=np.float64)
  total = np.sum(counts, axis=-1, keepdims=True)
  p = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
  return entropy_bits(p)


def check_schedule_args(k: int, rounds, m) -> None:
  if not is_int(rounds) or rounds < 0:
    raise ValueError(f'rounds={rounds!r} must be an integer >= 0')
  if not is_int(m) or not 1 <= m <= k:
    raise ValueError(f'm={m!r} must be an integer in [1, K] = [1, {k}]')


def label_coverage(counts, cohort) -> int:
  """Number of classes with a positive summed count over ``cohort``."""
  counts = check_counts(counts)
  total = counts[np.asarray(cohort, dtype=np.int64)].sum(axis=0)
  return int(np.count_nonzero(total > 0))


def cohort_entropy(counts, cohort) -> float:
  """Entropy in bits of the summed label counts of ``cohort``."""
  counts = check_counts(counts)
  total = counts[np.asarray(cohort, dtype=np.int64)].sum(axis=0)
  return float(count_entropy(total))


def schedule_stats(counts, schedule, num_classes_threshold=None) -> dict:
  """Per-round label statistics of a selection schedule.

  Evaluate on the **true** counts, also for schedules chosen from DP-noised
  counts (noise makes absent classes look present).

  Args:
    counts: ``[K, C]`` label counts.
    schedule: int ``[R, M]`` client ids.
    num_classes_threshold: a round has full coverage when at least this many
      classes are present; ``None`` means all C classes.

  Returns:
    A dict with ``entropy`` float64 ``[R]`` (bits of the summed cohort counts),
    ``coverage`` int64 ``[R]`` (classes present), ``full_coverage`` bool
    ``[R]``, ``participation`` int64 ``[K]`` (selections per client), and the
    scalars ``entropy_mean``, ``entropy_std`` (population std over rounds, 0
    if R = 0), ``full_coverage_rate`` (fraction of rounds) and
    ``above_log2_cm1`` (fraction of rounds with entropy > log2(C - 1), which
    implies full coverage).
  """
  counts = check_counts(counts)
  k, c = counts.shape
  schedule = np.asarray(schedule, dtype=np.int64)
  if schedule.ndim != 2:
    raise ValueError(f'schedule must be [R, M], got shape {schedule.shape}')
  if schedule.size and (schedule.min() < 0 or schedule.max() >= k):
    raise ValueError(f'schedule holds ids outside [0, {k})')
  threshold = c if num_classes_threshold is None else num_classes_threshold
  totals = counts[schedule].sum(axis=1)  # [R, C]
  entropy = count_entropy(totals).reshape(schedule.shape[0])
  coverage = np.count_nonzero(totals > 0, axis=-1).astype(np.int64)
  full = coverage >= threshold
  rounds = schedule.shape[0]
  above = entropy > math.log2(c - 1) if c > 1 else np.zeros(rounds, bool)
  return {
      'entropy': entropy,
      'coverage': coverage,
      'full_coverage': full,
      'participation': np.bincount(schedule.reshape(-1),
                                   minlength=k).astype(np.int64),
      'entropy_mean': float(entropy.mean()) if rounds else float('nan'),
      'entropy_std': float(entropy.std()) if rounds else 0.0,
      'full_coverage_rate': float(full.mean()) if rounds else float('nan'),
      'above_log2_cm1': float(np.mean(above)) if rounds else float('nan'),
  }
