"""Ensemble distillation for model fusion (FedDF): the ensemble target and the KD loss.

T. Lin, L. Kong, S. U. Stich, M. Jaggi, "Ensemble Distillation for Robust Model Fusion in
Federated Learning", NeurIPS 2020. The server fuses the clients' models of each architecture
by averaging (:func:`group_average`, FedAvg inside the group) and then distils every fused
model on unlabelled data towards the ensemble of *all* participating clients: the mean of
their logits (:func:`ensemble_logits`), with ``T^2 KL(softmax(t / T) || softmax(z / T))``
(:class:`TemperedKD`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_kd.ops import param_aggregate

Array = jax.Array


@jax.jit
def ensemble_logits(logits: Array, active: Array) -> Array:
  """``(1 / |S|) sum_{k in S} z_k``: the mean over the active clients ``[m, C]``.

  Args:
    logits: ``[K, m, C]`` each client's logits (or log-probabilities: they differ from the
      logits by a per-sample constant, so the softmax of the mean is the same) on the
      unlabelled inputs; rows of inactive clients are ignored.
    active: ``[K]`` bool.
  """
  w = active.astype(jnp.float32)
  return jnp.tensordot(w, logits, axes=1) / jnp.maximum(jnp.sum(w), 1.0)


def group_average(stacked, weights: Array):
  """FedAvg inside one architecture group: ``sum_k p_k x_k`` with ``p_k = w_k / sum w``
  over the group's rows ``[K_c, ...]`` -> ``[1, ...]`` (``w_k = n_k`` for participants, 0
  otherwise)."""
  return param_aggregate.weighted_average(stacked, weights)


@dataclasses.dataclass(frozen=True)
class TemperedKD:
  """Per-sample ``T^2 KL(softmax(t / T) || softmax(z / T))`` towards ``batch['t']`` (teacher
  logits): a loss function of the engine's kernels (hashable: one compile per T)."""
  temperature: float = 1.0

  def __call__(self, logits: Array, batch: dict, aux: dict) -> Array:
    del aux
    return kd_loss(logits, batch['t'], self.temperature)


def kd_loss(student_logits: Array, teacher_logits: Array, temperature: float) -> Array:
  """``T^2 sum_c q_c (log q_c - log p_c)``, ``q = softmax(t / T)``, ``p = softmax(z / T)``;
  ``[B]``."""
  t = jnp.float32(temperature)
  log_q = jax.nn.log_softmax(teacher_logits / t, -1)
  log_p = jax.nn.log_softmax(student_logits / t, -1)
  return t * t * jnp.sum(jnp.exp(log_q) * (log_q - log_p), -1)
