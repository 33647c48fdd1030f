"""The selection method's interface and its registry: a method says which clients a round
selects; :class:`~fedjax_kd.selection.selector.ClientSelector` adds dropout and stragglers.

A method is a subclass of :class:`Method` registered under its ``name`` with
``fedjax_kd.selection.register``, as algorithms are; ``selection.method`` names one of
``fedjax_kd.selection.METHODS``. Its
class attributes say what the rest of the engine must know about it (whether the clients
upload their label counts once, whether it needs the candidates' losses on the current
model); :meth:`Method.validate` holds its rules on the spec, which the config layer runs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import numpy as np

LossesFn = Callable[[np.ndarray], np.ndarray]   # [K] candidate mask -> [K] local losses


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


NO_CANDIDATES = np.zeros(0, np.int64)


class Method:
  """A client selection method, built once per run from the validated spec.

  Args:
    spec: the experiment spec (``spec.selection`` validated: ``m``, ``q``, ``candidates``).
    counts: ``[K, C]`` float64 true label counts of the clients' training data.
    sizes: ``[K]`` int64 training-set sizes ``n_k``.
  """
  name: ClassVar[str] = ''
  uploads_label_counts: ClassVar[bool] = False
  """True: every client uploads its C label counts once, before round 1 (a setup payload)."""
  needs_losses: ClassVar[bool] = False
  """True: :meth:`select` needs the candidates' losses on the current model each round, so
  a round runs client models outside the cohort (the memory plan counts that pass)."""

  @classmethod
  def validate(cls, spec) -> None:
    """The method's rules on the validated spec; raises ``ConfigError`` naming the field."""
    del spec

  def __init__(self, spec, counts: np.ndarray, sizes: np.ndarray):
    self.spec, self.sel = spec, spec.selection
    self.k, self.m = spec.clients.num_clients, spec.selection.m
    self.true_counts, self.sizes = counts, sizes

  @property
  def counts(self) -> np.ndarray:
    """``[K, C]`` the label counts the server selects on (the true ones unless noised)."""
    return self.true_counts

  def select(self, t: int, losses_fn: LossesFn | None) -> tuple[np.ndarray, np.ndarray]:
    """Round ``t``'s (1-based) cohort: ``(ids in selection order, candidate ids)``."""
    raise NotImplementedError

  def description(self) -> dict:
    """The method's own entries of ``selection.json``."""
    return {}
