"""Randomness by identity: a client's key depends on (round, client id, phase).

``client_key(root, t, k, phase) = fold_in(fold_in(fold_in(root, t), k), phase)``,
so results do not change when clients are regrouped into cohorts, sharded over
1 or 8 devices, or run as a subset.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

PHASES = {'init': 0, 'train': 1, 'distill': 2, 'predict': 3, 'select': 4,
          'sample': 5, 'server': 6, 'custom': 7, 'stragglers': 8, 'straggle': 9,
          'dropout': 10}


def phase_id(phase: str) -> int:
  return PHASES[phase]


def client_keys(root: jax.Array, t: int, client_ids: np.ndarray | jax.Array,
                phase: str) -> jax.Array:
  """Keys ``[len(client_ids)]`` for clients in round ``t`` and ``phase``."""
  rk = jax.random.fold_in(root, t)
  ids = jnp.asarray(client_ids, jnp.uint32)
  return jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(rk, k),
                                               phase_id(phase)))(ids)


def server_key(root: jax.Array, t: int, phase: str) -> jax.Array:
  """Key for the server in round ``t``; never equal to a client's key."""
  rk = jax.random.fold_in(jax.random.fold_in(root, t), 0xFFFFFF)
  return jax.random.fold_in(rk, phase_id(phase))


def host_rng(seed: int, t: int, phase: str) -> np.random.Generator:
  """A numpy generator for host-side choices (open-set sample, client subset)."""
  return np.random.default_rng([seed, t, phase_id(phase)])
