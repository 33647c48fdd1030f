"""Power-of-Choice client selection: Y. J. Cho, J. Wang, G. Joshi, "Client Selection in
Federated Learning: Convergence Analysis and Power-of-Choice Selection Strategies" (2020).

``d`` candidates drawn without replacement with probability ``n_k / N``
(:func:`power_of_choice_candidates`), of which the ``M`` with the highest local loss on the
current model are selected (:func:`power_of_choice_select`). Model-dependent, so chosen in
the loop; the algorithm supplies the losses (``Algorithm.selection_losses``).
"""

from __future__ import annotations

import numpy as np

from fedjax_kd.core import rng
from fedjax_kd.errors import ConfigError
from fedjax_kd.selection import base
from fedjax_kd.selection import counts as counts_lib


def power_of_choice_candidates(rng: np.random.Generator, sizes,
                               d: int) -> np.ndarray:
  """Power-of-Choice step 1: ``d`` distinct candidates, ``P ∝ n_k / N``.

  Sequential sampling without replacement (numpy's ``Generator.choice`` with
  ``p``): each draw is proportional to the sizes of the clients not drawn yet.
  Clients of size 0 are never drawn.

  Args:
    rng: the generator.
    sizes: ``[K]`` non-negative client sizes ``n_k``.
    d: the candidate-set size, in ``[1, #clients with n_k > 0]``.

  Returns:
    int64 ``[d]`` distinct client ids in draw order.
  """
  sizes = np.asarray(sizes, dtype=np.float64)
  if sizes.ndim != 1 or not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
    raise ValueError('sizes must be a finite non-negative [K] vector')
  positive = int(np.count_nonzero(sizes))
  if not counts_lib.is_int(d) or not 1 <= d <= positive:
    raise ValueError(f'd={d!r} must be an integer in [1, {positive}] (the '
                     'number of clients with positive size)')
  p = sizes / sizes.sum()
  return np.asarray(rng.choice(sizes.size, size=d, replace=False, p=p),
                    np.int64)


def power_of_choice_select(candidates, losses, m: int) -> np.ndarray:
  """Power-of-Choice step 3: the ``m`` candidates with the highest loss.

  Ties are broken by the lower client id; NaN losses rank last.

  Args:
    candidates: int ``[d]`` distinct client ids.
    losses: float ``[d]`` the candidates' local losses ``F_k(theta)``.
    m: clients to select, in ``[1, d]``.

  Returns:
    int64 ``[m]`` client ids, highest loss first.
  """
  candidates = np.asarray(candidates, dtype=np.int64).reshape(-1)
  losses = np.asarray(losses, dtype=np.float64).reshape(-1)
  if candidates.shape != losses.shape:
    raise ValueError(f'candidates {candidates.shape} and losses '
                     f'{losses.shape} must have the same length')
  if np.unique(candidates).size != candidates.size:
    raise ValueError('candidates must be distinct')
  if not counts_lib.is_int(m) or not 1 <= m <= candidates.size:
    raise ValueError(f'm={m!r} must be an integer in [1, d] = '
                     f'[1, {candidates.size}]')
  nan = np.isnan(losses)
  neg = np.where(nan, 0.0, -losses)
  order = np.lexsort((candidates, neg, nan))  # last key is the primary one
  return candidates[order[:m]]


class PowerOfChoice(base.Method):
  """``selection.method='power_of_choice'``: ``selection.candidates`` candidates a round."""
  name = 'power_of_choice'
  needs_losses = True

  @classmethod
  def validate(cls, spec) -> None:
    sel, k = spec.selection, spec.clients.num_clients
    if sel.candidates < sel.m:
      raise ConfigError('selection.candidates', sel.candidates,
                        f'0 (= min(K, 2M)) or an integer in [M, K] = [{sel.m}, {k}]')

  def select(self, t, losses_fn):
    k, m = self.k, self.m
    if m >= k:
      return np.arange(k, dtype=np.int64), base.NO_CANDIDATES
    r = rng.host_rng(self.spec.seed, t, 'select')
    cands = power_of_choice_candidates(r, self.sizes, min(self.sel.candidates, k))
    mask = np.zeros(k, bool)
    mask[cands] = True
    if losses_fn is None:
      raise ValueError('power_of_choice needs the candidates\' losses (losses_fn)')
    losses = np.asarray(losses_fn(mask), np.float64)
    return power_of_choice_select(cands, losses[cands], m), cands
