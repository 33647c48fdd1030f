"""Client selection for every algorithm: which clients take part in each round.

The layer between the runner and an algorithm. Each round it returns a
:class:`RoundPlan`: the clients *selected* (uniform, FedEntOpt or
Power-of-Choice), the ones *active* after dropout, and each client's local
epoch budget (stragglers). Algorithms only see the ``active`` mask and ask
:meth:`ClientSelector.local_epochs` when they train.

Methods (``selection.method``):

* ``'uniform'``: ``M = round(participation * K)`` clients uniformly without
  replacement, a fresh draw each round, ignoring data sizes; everybody under full
  participation.
* ``'fedentopt'``: A. Lutz, G. Steidl, K. Müller, W. Samek, "Boosting Federated
  Learning with FedEntOpt: Mitigating Label Skew by Entropy-Based Client
  Selection", arXiv 2411.01240v2, Algorithm 1. Clients upload their label
  counts once (optionally Laplace-noised, ``selection.dp``); the server greedily
  maximises the entropy of the cohort's summed counts with a FIFO buffer of
  ``Q`` recently selected clients. The selection does not depend on the model,
  so the whole ``[R, M]`` schedule is computed up front
  (:func:`fedjax_kd.ops.selection.fedentopt_schedule`, float64, lowest-index
  ties) and a resumed run recomputes the same schedule.
* ``'power_of_choice'``: Y. J. Cho, J. Wang, G. Joshi, "Client Selection in
  Federated Learning: Convergence Analysis and Power-of-Choice Selection
  Strategies" (2020): ``d`` candidates drawn without replacement with
  probability ``n_k / N``, of which the ``M`` with the highest local loss on the
  current model are selected. Model-dependent, so chosen in the loop; the
  algorithm supplies the losses (:meth:`Algorithm.selection_losses`).
* ``'kl'``: the "KL" baseline of FedEntOpt (its §V-A4 cites L. Wang et al., AAAI 2021,
  but the method it describes, in its §II and §V-B1, is M. Seol, T. Kim, Sensors
  23(3):1152, 2023, Algorithm 2). Clients upload their label counts once; the server
  greedily builds, from the clients with the most data, a cohort of at most M clients
  whose summed (capped) counts approach the uniform distribution, stopping at M clients
  or once their KL divergence to uniform is below ``selection.kl_threshold``
  (:func:`fedjax_kd.ops.selection.kl_selection`). It is deterministic, so every round
  selects the same cohort (the property FedEntOpt names as its weakness). Selected
  clients train on all their data: Seol & Kim's per-class data allocation (which would
  leave the rest of a client's data out) is recorded in ``selection.json``, not applied.

Dropout and stragglers (FedEntOpt §V-B6): after selection,
``round(dropout * M)`` of the selected clients (or each with probability
``dropout``) are unavailable; they are not replaced and stay in FedEntOpt's
buffer. A fixed ``stragglers`` fraction of the pool, drawn once per seed, runs
``U{straggler_min_epochs, ..., train.epochs}`` epochs each time it is selected.
Every random choice is a pure function of ``(seed, round)``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from fedjax_kd.core import rng
from fedjax_kd.ops import comm
from fedjax_kd.ops import selection as sel_ops
from fedjax_kd.spec import ExperimentSpec


@dataclasses.dataclass(frozen=True)
class RoundPlan:
  """Who takes part in one round.

  Attributes:
    order: ids of the selected clients in selection order.
    selected: ``[K]`` bool, the selected clients.
    active: ``[K]`` bool, selected and not dropped out (they train and upload).
    candidates: Power-of-Choice's candidate ids (empty otherwise).
  """
  order: np.ndarray
  selected: np.ndarray
  active: np.ndarray
  candidates: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))


class ClientSelector:
  """Builds each round's :class:`RoundPlan` from the validated spec.

  Args:
    spec: the experiment spec (``spec.selection``, participation, seed, rounds).
    label_counts: ``[K, C]`` true label counts of the clients' training data.
    sizes: ``[K]`` training-set sizes ``n_k``.
  """

  def __init__(self, spec: ExperimentSpec, label_counts: np.ndarray, sizes: np.ndarray):
    self.spec = spec
    self.sel = spec.selection
    self.k = spec.clients.num_clients
    self.m = self.sel.m
    self.true_counts = np.asarray(label_counts, np.float64)
    self.sizes = np.asarray(sizes, np.int64)
    self.counts = self.true_counts   # what the server selects on (noisy under DP)
    if self.sel.method == 'fedentopt' and self.sel.dp:
      self.counts = sel_ops.dp_counts(self.true_counts, self.sel.epsilon, spec.seed)
    self._schedule = None
    self._kl_cohort = self._kl_allocation = None
    if self.sel.method == 'kl':
      self._kl_cohort, self._kl_allocation = sel_ops.kl_selection(
          self.counts, self.m, self.sel.kl_threshold)
    if self.sel.method == 'fedentopt':
      self._schedule = sel_ops.fedentopt_schedule(
          self.counts, spec.rounds, self.m, self.sel.q, spec.seed,
          tie_tol=self.sel.tie_tol, tie_break=self.sel.tie_break)
    n_strag = int(round(self.sel.stragglers * self.k))
    self.stragglers = np.zeros(self.k, bool)
    if n_strag:
      self.stragglers[rng.host_rng(spec.seed, 0, 'stragglers').choice(
          self.k, n_strag, replace=False)] = True

  @property
  def schedule(self) -> np.ndarray | None:
    """FedEntOpt's precomputed ``[R, M]`` schedule (row r is round r + 1), else None."""
    return self._schedule

  def setup_payloads(self) -> list[comm.Payload]:
    """FedEntOpt's (and KL's) one-time upload of a C-float label-count vector per client."""
    if self.sel.method not in ('fedentopt', 'kl'):
      return []
    return [comm.Payload('label_counts', comm.UP, 'float', int(self.counts.shape[1]), self.k)]

  def _select(self, t: int, losses_fn: Callable[[np.ndarray], np.ndarray] | None):
    k, m = self.k, self.m
    if self.sel.method == 'fedentopt':
      return np.asarray(self._schedule[t - 1], np.int64), np.zeros(0, np.int64)
    if self.sel.method == 'kl':
      return self._kl_cohort.copy(), np.zeros(0, np.int64)
    if m >= k:
      return np.arange(k, dtype=np.int64), np.zeros(0, np.int64)
    if self.sel.method == 'uniform':
      return sel_ops.uniform_round(k, m, self.spec.seed, t), np.zeros(0, np.int64)
    r = rng.host_rng(self.spec.seed, t, 'select')
    cands = sel_ops.power_of_choice_candidates(r, self.sizes, min(self.sel.candidates, k))
    mask = np.zeros(k, bool)
    mask[cands] = True
    if losses_fn is None:
      raise ValueError('power_of_choice needs the candidates\' losses (losses_fn)')
    losses = np.asarray(losses_fn(mask), np.float64)
    return sel_ops.power_of_choice_select(cands, losses[cands], m), cands

  def plan(self, t: int,
           losses_fn: Callable[[np.ndarray], np.ndarray] | None = None) -> RoundPlan:
    """The plan of round ``t`` (1-based).

    Args:
      t: round number.
      losses_fn: ``[K]`` candidate mask -> ``[K]`` local losses on the current
        model (Power-of-Choice only).
    """
    order, cands = self._select(t, losses_fn)
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
    return RoundPlan(order=order, selected=selected, active=active, candidates=cands)

  def local_epochs(self, t: int, epochs: int) -> np.ndarray | None:
    """``[K]`` epochs each client runs in round ``t`` (None: ``epochs`` for all)."""
    if not self.stragglers.any():
      return None
    lo = min(self.sel.straggler_min_epochs, epochs)
    draw = rng.host_rng(self.spec.seed, t, 'straggle').integers(lo, epochs + 1, self.k)
    return np.where(self.stragglers, draw, epochs).astype(np.int32)

  def round_metrics(self, plan: RoundPlan) -> dict[str, float]:
    """Label coverage and entropy (bits) of the active cohort's true label counts."""
    ids = np.flatnonzero(plan.active)
    out = {'selected': int(plan.selected.sum()),
           'dropped': int(plan.selected.sum() - plan.active.sum())}
    if len(ids):
      out['label_coverage'] = int(sel_ops.label_coverage(self.true_counts, ids))
      out['cohort_entropy'] = float(sel_ops.cohort_entropy(self.true_counts, ids))
    return out

  def description(self) -> dict:
    """What a run records in ``selection.json``."""
    out = {'method': self.sel.method, 'm': self.m, 'k': self.k,
           'label_counts': self.true_counts.astype(int).tolist(),
           'stragglers': np.flatnonzero(self.stragglers).tolist()}
    if self.sel.method == 'fedentopt':
      out.update({'q': self.sel.q, 'dp': self.sel.dp,
                  'epsilon': self.sel.epsilon if self.sel.dp else None,
                  'selection_counts': self.counts.tolist(),
                  'schedule': self._schedule.tolist()})
    if self.sel.method == 'kl':
      out.update({'kl_threshold': self.sel.kl_threshold, 'cohort': self._kl_cohort.tolist(),
                  'allocation': self._kl_allocation[self._kl_cohort].tolist()})
    return out
