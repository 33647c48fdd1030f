"""Uniform client selection: ``M = round(participation * K)`` clients uniformly without
replacement, a fresh draw each round, ignoring data sizes; everybody under full
participation (the sampling of FedAvg, McMahan et al., AISTATS 2017).
"""

from __future__ import annotations

import numpy as np

from fedjax_kd.core import rng
from fedjax_kd.selection import base
from fedjax_kd.selection import counts as counts_lib


def uniform_round(num_clients: int, m: int, seed: int, t: int) -> np.ndarray:
  """Round ``t``'s uniform cohort: ``m`` distinct ids without replacement, drawn from the
  engine's host generator of the round's ``'select'`` phase
  (:func:`fedjax_kd.core.rng.host_rng`), so a schedule computed here is the one a run uses.
  """
  gen = rng.host_rng(seed, t, 'select')
  return np.asarray(gen.choice(num_clients, size=m, replace=False), np.int64)


def uniform_schedule(num_clients: int, rounds: int, m: int,
                     seed: int) -> np.ndarray:
  """Uniform selection without replacement, a fresh draw per round.

  Ignores client sizes. Row ``r`` is :func:`uniform_round` of round ``r + 1``.

  Args:
    num_clients: K >= 1.
    rounds: R >= 0.
    m: clients per round, in ``[1, K]``.
    seed: non-negative integer seed.

  Returns:
    int64 ``[rounds, m]``, distinct ids within each row.
  """
  if not counts_lib.is_int(num_clients) or num_clients < 1:
    raise ValueError(f'num_clients={num_clients!r} must be an integer >= 1')
  counts_lib.check_schedule_args(num_clients, rounds, m)
  if not counts_lib.is_int(seed) or seed < 0:
    raise ValueError(f'seed={seed!r} must be a non-negative integer')
  out = np.zeros((rounds, m), np.int64)
  for r in range(rounds):
    out[r] = uniform_round(num_clients, m, seed, r + 1)
  return out


class Uniform(base.Method):
  """``selection.method='uniform'``: :func:`uniform_round` each round."""
  name = 'uniform'

  def select(self, t, losses_fn):
    del losses_fn
    if self.m >= self.k:
      return np.arange(self.k, dtype=np.int64), base.NO_CANDIDATES
    return uniform_round(self.k, self.m, self.spec.seed, t), base.NO_CANDIDATES
