"""How a client trains locally: one static rule and one set of per-call inputs.

Every local update in the engine (private training, distillation on public or
synthetic data, a server model's step) is minibatch SGD-style training shaped
by a :class:`LocalRule` (everything that changes the compiled program: epochs,
batch size, optimizer slot, augmentation, and the algorithm's own hooks) and a
:class:`Local` (the arrays of this call: per-client epoch budgets, the round's
learning-rate factor, the hooks' data). Adding a local-training option is one
field here and its use in ``CohortKernels``' step; the engine's signatures do
not change.

Hooks keep the engine free of any paper: FedProx's proximal term is a
``penalty`` (``fedjax_kd.algorithms.fedprox``), SCAFFOLD's control-variate step
a ``correction`` (``fedjax_kd.algorithms.scaffold``). A hook is a hashable
callable (a frozen dataclass or a module-level function), because the rule is
a static argument of the compiled kernel: equal rules reuse one compilation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax


@dataclasses.dataclass(frozen=True)
class LocalRule:
  """The static part of local training (hashable: a jit static argument).

  Attributes:
    epochs: passes over each client's rows.
    batch_size: minibatch size (Keras semantics: reshuffle every epoch, keep the
      partial last batch, mean loss over the real samples of a batch).
    opt_slot: which optimizer (and optimizer state) to step.
    augment: optional ``augment(key, x) -> x`` applied to every training batch.
    fresh_opt: start from a new optimizer state (default: continue the stored one).
    penalty: optional ``penalty(params, start_params, client, shared) -> scalar`` added
      to every step's mean loss (FedProx's ``mu / 2 ||w - w^r||^2``; SCDPFL's spectral
      term towards a per-client teacher); ``client`` and ``shared`` as for ``correction``.
    correction: optional ``correction(params, client, shared) -> params`` applied
      after every real step, outside the optimizer (SCAFFOLD's ``- lr (c - c_k)``);
      ``client`` and ``shared`` are :attr:`Local.client` / :attr:`Local.shared`.
  """
  epochs: int
  batch_size: int
  opt_slot: str = 'train'
  augment: Callable | None = None
  fresh_opt: bool = False
  penalty: Callable | None = None
  correction: Callable | None = None


@flax.struct.dataclass
class Local:
  """The per-call inputs of local training.

  Attributes:
    epochs_k: ``[S]`` int epochs each client runs (<= ``rule.epochs``;
      stragglers) or None (all ``rule.epochs``).
    lr_scale: scalar multiplying every optimizer update (the round's
      learning-rate decay; exact for SGD with or without momentum and coupled
      weight decay).
    client: per-client data of the rule's hooks (leading axis: the clients).
    shared: data of the rule's hooks shared by every client.
  """
  epochs_k: Any = None
  lr_scale: Any = 1.0
  client: Any = None
  shared: Any = None


def hook_rows(local: Local) -> Any:
  """The per-client parts of ``local`` (``epochs_k`` and ``client``), for row checks."""
  return {'epochs_k': local.epochs_k, 'client': local.client}


def tree_sq_distance(a: Any, b: Any) -> jax.Array:
  """``sum ||a - b||^2`` over the leaves of two pytrees of the same structure."""
  return sum(jax.numpy.sum(jax.numpy.square(x - y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
