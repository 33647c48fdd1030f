"""Server-side parameter aggregation of the parameter-exchange baselines.

Pure, jitted functions over pytrees whose leaves carry a leading client axis
(a cohort's stacked params), as FedEntOpt (Lutz et al., arXiv 2411.01240v2,
§V-B4) combines them with client selection:

* FedAvg -- H. B. McMahan et al., "Communication-Efficient Learning of Deep
  Networks from Decentralized Data", AISTATS 2017: the ``n_k``-weighted mean
  (:func:`weighted_average`).
* FedNova -- J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, "Tackling the
  Objective Inconsistency Problem in Heterogeneous Federated Optimization",
  NeurIPS 2020, in NIID-Bench's form for SGD with momentum ``rho``:
  ``a_k = [tau_k - rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)``,
  ``d_k = (theta - theta_k) / a_k`` and
  ``theta <- theta - (sum_k p_k a_k) sum_k p_k d_k`` (:func:`fednova_average`).
* SCAFFOLD -- S. P. Karimireddy et al., "SCAFFOLD: Stochastic Controlled
  Averaging for Federated Learning", ICML 2020, option II:
  ``c_k+ = c_k - c + (theta - y_k) / (tau_k lr)`` and
  ``c <- c + (1 / K) sum_{k in S} (c_k+ - c_k)`` (:func:`scaffold_controls`).

``p_k = n_k / sum_S n_j`` over the clients that trained (FedEntOpt weights
every method by data size, as its fairness statement asks); ``weights`` is zero
for the others.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

Array = jax.Array
PyTree = Any


def _normalise(weights: Array) -> Array:
  w = jnp.asarray(weights, jnp.float32)
  return w / jnp.maximum(jnp.sum(w), 1e-30)


@jax.jit
def weighted_average(stacked: PyTree, weights: Array) -> PyTree:
  """``sum_k p_k x_k`` of every leaf ``[K, ...]`` -> ``[1, ...]`` (FedAvg, eq. 3).

  Args:
    stacked: pytree with a leading client axis.
    weights: ``[K]`` nonnegative weights (e.g. ``n_k * active``); normalised here.

  Returns:
    The average with a leading axis of 1, in each leaf's dtype.
  """
  p = _normalise(weights)
  return jax.tree.map(lambda c: jnp.tensordot(p, c, axes=1)[None].astype(c.dtype), stacked)


def fednova_coefficient(tau: Array, rho: float) -> Array:
  """FedNova's ``a_k`` for ``tau_k`` local SGD steps with momentum ``rho`` (``tau`` if 0)."""
  tau = jnp.asarray(tau, jnp.float32)
  if rho == 0:
    return tau
  return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


@functools.partial(jax.jit, static_argnames=('rho',))
def fednova_average(start: PyTree, stacked: PyTree, weights: Array, tau: Array,
                    rho: float) -> PyTree:
  """FedNova's normalised averaging.

  Args:
    start: the global params ``theta`` the round started from, leaves ``[1, ...]``.
    stacked: the clients' params after local training, leaves ``[K, ...]``.
    weights: ``[K]`` data sizes (zero for clients that did not train).
    tau: ``[K]`` local steps each client actually ran.
    rho: the SGD momentum (static).

  Returns:
    The new global params, leaves ``[1, ...]``.
  """
  p = _normalise(weights)
  a = fednova_coefficient(tau, rho)
  a_safe = jnp.where(p > 0, jnp.maximum(a, 1e-12), 1.0)
  tau_eff = jnp.sum(p * a)

  def leaf(s, c):
    d = (s - c) / a_safe.reshape((-1,) + (1,) * (c.ndim - 1))
    return (s[0] - tau_eff * jnp.tensordot(p, d, axes=1))[None].astype(c.dtype)

  return jax.tree.map(leaf, start, stacked)


@jax.jit
def scaffold_controls(c: PyTree, c_k: PyTree, start: PyTree, stacked: PyTree, trained: Array,
                      tau: Array, lr: float | Array, num_clients: int | Array):
  """SCAFFOLD option II control-variate update.

  Args:
    c: server control variate, leaves ``[1, ...]``.
    c_k: every client's control variate, leaves ``[K, ...]``.
    start: global params the round started from, leaves ``[1, ...]``.
    stacked: the clients' params after local training, leaves ``[K, ...]``.
    trained: ``[K]`` bool, clients that trained this round (the others keep ``c_k``).
    tau: ``[K]`` local steps each client ran (0 keeps ``c_k``).
    lr: the local learning rate of this round.
    num_clients: K, the ``1 / K`` factor of the server update.

  Returns:
    ``(c_new [1, ...], c_k_new [K, ...])``.
  """
  tau = jnp.asarray(tau, jnp.float32)
  ok = jnp.asarray(trained) & (tau > 0)
  scale = jnp.where(ok, 1.0 / (jnp.maximum(tau, 1.0) * lr), 0.0)

  def client(ck, s, y, cs):
    sh = (-1,) + (1,) * (y.ndim - 1)
    new = ck - cs + (s - y) * scale.reshape(sh)
    return jnp.where(ok.reshape(sh), new, ck)

  c_k_new = jax.tree.map(client, c_k, start, stacked, c)
  c_new = jax.tree.map(lambda cs, a, b: cs + (jnp.sum(a - b, axis=0) / num_clients)[None],
                       c, c_k_new, c_k)
  return c_new, c_k_new
