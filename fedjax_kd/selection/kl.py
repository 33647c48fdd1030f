"""The "KL" client selection of FedEntOpt's comparison: M. Seol, T. Kim, "Performance
Enhancement in Federated Learning by Reducing Class Imbalance of Non-IID Data", Sensors
23(3):1152, 2023, Algorithm 2.

FedEntOpt's §V-A4 cites L. Wang et al., AAAI 2021, but the method it describes, in its §II
and §V-B1, is Seol and Kim's. Clients upload their label counts once; the server greedily
builds, from the clients with the most data, a cohort of at most M clients whose summed
(capped) counts approach the uniform distribution, stopping at M clients or once their KL
divergence to uniform is below ``selection.kl_threshold`` (:func:`kl_selection`). It is
deterministic, so every round selects the same cohort (the property FedEntOpt names as its
weakness). Selected clients train on all their data: Seol and Kim's per-class data
allocation (which would leave the rest of a client's data out) is recorded in
``selection.json``, not applied.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fedjax_kd.selection import base
from fedjax_kd.selection import counts as counts_lib


def kl_to_uniform(counts) -> float:
  """``D_KL(P || U)`` in nats of ``P = counts / sum(counts)`` against the uniform
  distribution over the entries of ``counts`` (``0 log 0 = 0``; 0 for an all-zero vector)."""
  counts = np.asarray(counts, dtype=np.float64).reshape(-1)
  total = counts.sum()
  if total <= 0 or counts.size == 0:
    return 0.0
  p = counts / total
  pos = p > 0
  return float(np.sum(p[pos] * np.log(p[pos] * counts.size)))


def kl_selection(counts, m: int, threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
  """The "KL" client selection FedEntOpt compares with (M. Seol, T. Kim, Sensors 23(3):1152,
  2023, Algorithm 2): a greedy, deterministic cohort from the uploaded label counts.

  Clients are visited in descending order of their data amount (ties: lower id). The first
  one is taken whole and sets the cap ``cap = max_c v_c`` of the cohort's class volume
  ``v``. Each later client is taken if it has a sample of the cohort's currently rarest
  class ``f = argmin_c v_c`` (lowest class index on ties); it contributes
  ``s_c = min(cap - v_c, n_c)`` of each class (the rest of its data would be left out).
  The selection stops when ``m`` clients are taken or ``D_KL(v / sum v || uniform) <
  threshold``; a pass that takes nobody ends it early (fewer than ``m`` clients).

  Choices where the pseudo-code is open: the stop test runs after every pick (``h`` is a
  maximum, which a test only after a full pass could overshoot); a repeated pass visits
  only clients not yet taken; classes no client has are left out of ``argmin`` and of the
  uniform target (otherwise nobody could ever be added); clients with no data are never
  taken. No randomness: the same counts give the same cohort in every round.

  Args:
    counts: ``[K, C]`` finite non-negative label counts.
    m: the maximum number of clients (``h``), in ``[1, K]``.
    threshold: ``theta_KLD`` (nats) >= 0; 0 stops only at ``m`` clients.

  Returns:
    ``(ids, allocation)``: int64 ``[<= m]`` client ids in pick order and float64 ``[K, C]``
    each client's allocated per-class sample counts ``s`` (zero rows for the others).
  """
  counts = counts_lib.check_counts(counts)
  k, _ = counts.shape
  if not counts_lib.is_int(m) or not 1 <= m <= k:
    raise ValueError(f'm={m!r} must be an integer in [1, K] = [1, {k}]')
  if not (isinstance(threshold, numbers.Real) and math.isfinite(threshold)
          and threshold >= 0):
    raise ValueError(f'threshold={threshold!r} must be a finite number >= 0')
  classes = counts.sum(axis=0) > 0          # classes some client has
  totals = counts.sum(axis=1)
  order = np.argsort(-totals, kind='stable')
  order = order[totals[order] > 0]
  v = np.zeros(counts.shape[1], np.float64)
  alloc = np.zeros_like(counts)
  taken = np.zeros(k, bool)
  picked: list[int] = []
  cap = 0.0
  while len(picked) < m:
    added = False
    for c in order:
      if taken[c]:
        continue
      if not picked:
        share = counts[c].copy()
        cap = float(np.max(v + share))
      else:
        rare = np.flatnonzero(classes)[np.argmin(v[classes])]
        if counts[c, rare] <= 0:
          continue
        share = np.minimum(cap - v, counts[c])
      v += share
      alloc[c] = share
      taken[c] = True
      picked.append(int(c))
      added = True
      if len(picked) >= m or kl_to_uniform(v[classes]) < threshold:
        return np.asarray(picked, np.int64), alloc
    if not added:
      break
  return np.asarray(picked, np.int64), alloc


class KL(base.Method):
  """``selection.method='kl'``: the one cohort of :func:`kl_selection`, every round."""
  name = 'kl'
  uploads_label_counts = True

  def __init__(self, spec, counts, sizes):
    super().__init__(spec, counts, sizes)
    self.cohort, self.allocation = kl_selection(counts, self.m, self.sel.kl_threshold)

  def select(self, t, losses_fn):
    del t, losses_fn
    return self.cohort.copy(), base.NO_CANDIDATES

  def description(self):
    return {'kl_threshold': self.sel.kl_threshold, 'cohort': self.cohort.tolist(),
            'allocation': self.allocation[self.cohort].tolist()}
