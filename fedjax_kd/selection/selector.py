"""The round's plan for every algorithm: the selection method's cohort, then dropout and
stragglers (FedEntOpt, arXiv 2411.01240v2, §V-B6).

After selection, ``round(dropout * M)`` of the selected clients (or each with probability
``dropout``) are unavailable; they are not replaced and stay in FedEntOpt's buffer. A fixed
``stragglers`` fraction of the pool, drawn once per seed, runs
``U{straggler_min_epochs, ..., train.epochs}`` epochs each time it is selected. Every random
choice is a pure function of ``(seed, round)``.
"""

from __future__ import annotations

import numpy as np

from fedjax_kd.core import rng
from fedjax_kd.ops import comm
from fedjax_kd.selection import base
from fedjax_kd.selection import counts as counts_lib


class ClientSelector:
  """Builds each round's :class:`~fedjax_kd.selection.base.RoundPlan` from the validated spec.

  Args:
    spec: the experiment spec (``spec.selection``, participation, seed, rounds).
    label_counts: ``[K, C]`` true label counts of the clients' training data.
    sizes: ``[K]`` training-set sizes ``n_k``.
    method: the class of ``spec.selection.method`` (``fedjax_kd.selection.METHODS``).
  """

  def __init__(self, spec, label_counts: np.ndarray, sizes: np.ndarray, *,
               method: type[base.Method]):
    self.spec = spec
    self.sel = spec.selection
    self.k = spec.clients.num_clients
    self.true_counts = np.asarray(label_counts, np.float64)
    self.method = method(spec, self.true_counts, np.asarray(sizes, np.int64))
    n_strag = int(round(self.sel.stragglers * self.k))
    self.stragglers = np.zeros(self.k, bool)
    if n_strag:
      self.stragglers[rng.host_rng(spec.seed, 0, 'stragglers').choice(
          self.k, n_strag, replace=False)] = True

  def setup_payloads(self) -> list[comm.Payload]:
    """The one-time upload of a C-float label-count vector per client, for a method that
    selects on them (FedEntOpt, KL)."""
    if not self.method.uploads_label_counts:
      return []
    return [comm.Payload('label_counts', comm.UP, 'float', int(self.true_counts.shape[1]),
                         self.k)]

  def plan(self, t: int, losses_fn: base.LossesFn | None = None) -> base.RoundPlan:
    """The plan of round ``t`` (1-based).

    Args:
      t: round number.
      losses_fn: ``[K]`` candidate mask -> ``[K]`` local losses on the current
        model (a method with ``needs_losses``: Power-of-Choice).
    """
    order, cands = self.method.select(t, losses_fn)
    selected = np.zeros(self.k, bool)
    selected[order] = True
    active = selected.copy()
    if self.sel.dropout > 0:
      r = rng.host_rng(self.spec.seed, t, 'dropout')
      ids = np.sort(order)
      if self.sel.dropout_mode == 'exact':
        drop = r.choice(ids, int(round(self.sel.dropout * len(ids))), replace=False)
      else:
        drop = ids[r.random(len(ids)) < self.sel.dropout]
      active[drop] = False
    return base.RoundPlan(order=order, selected=selected, active=active, candidates=cands)

  def local_epochs(self, t: int, epochs: int) -> np.ndarray | None:
    """``[K]`` epochs each client runs in round ``t`` (None: ``epochs`` for all)."""
    if not self.stragglers.any():
      return None
    lo = min(self.sel.straggler_min_epochs, epochs)
    draw = rng.host_rng(self.spec.seed, t, 'straggle').integers(lo, epochs + 1, self.k)
    return np.where(self.stragglers, draw, epochs).astype(np.int32)

  def round_metrics(self, plan: base.RoundPlan) -> dict[str, float]:
    """Label coverage and entropy (bits) of the active cohort's true label counts."""
    ids = np.flatnonzero(plan.active)
    out = {'selected': int(plan.selected.sum()),
           'dropped': int(plan.selected.sum() - plan.active.sum())}
    if len(ids):
      out['label_coverage'] = int(counts_lib.label_coverage(self.true_counts, ids))
      out['cohort_entropy'] = float(counts_lib.cohort_entropy(self.true_counts, ids))
    return out

  def description(self) -> dict:
    """What a run records in ``selection.json``."""
    return {'method': self.sel.method, 'm': self.method.m, 'k': self.k,
            'label_counts': self.true_counts.astype(int).tolist(),
            'stragglers': np.flatnonzero(self.stragglers).tolist(),
            **self.method.description()}
