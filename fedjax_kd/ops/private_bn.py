"""Private BatchNorm layers and the FedAdam server step of MTFL.

J. Mills, J. Hu, G. Min, "Multi-Task Federated Learning for Personalised Deep
Neural Networks in Edge Computing", IEEE TPDS 33(3), 2022 (MTFL). Each client
keeps some BatchNorm (BN) values private: the running mean ``u`` and variance
``s`` (``batch_stats`` 'mean'/'var') and/or the affine ``y`` (gamma, 'scale')
and ``b`` (beta, 'bias'); ``bn_private`` names which ('usyb', 'yb', 'us' or
'none', as the authors' ``-bn_private``). Everything else is federated. The
server step is FedAdam (Reddi et al., "Adaptive Federated Optimization", ICLR
2021) as the authors' ``ServerAdam`` writes it (no bias correction):

* pseudo-gradient ``g = w - sum_k p_k w_k`` (``p_k = n_k / sum_S n_j`` over the
  round's clients),
* ``m <- beta1 m + (1 - beta1) g``, ``v <- beta2 v + (1 - beta2) g^2``,
* ``w <- w - lr m / (sqrt(v) + eps)``.

BN leaves are found by their Flax path: a leaf under a module whose name starts
with ``BatchNorm`` (every BN of :mod:`fedjax_kd.models` is a
``layers.BatchNorm`` auto-named ``BatchNorm_<i>``, as ``flax.linen.BatchNorm``
is), 'scale'/'bias' in ``params`` (y, b), 'mean'/'var' in ``batch_stats`` (u, s).
Pure functions over pytrees; the masks are static Python booleans.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
SETTINGS = ('usyb', 'yb', 'us', 'none')


def _key_name(k) -> str:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def is_bn_path(path) -> bool:
  """Whether a Flax variable path lies inside a BatchNorm module."""
  return any(_key_name(k).startswith('BatchNorm') for k in path)


def private_mask(variables: PyTree, setting: str = 'usyb') -> PyTree:
  """A tree of Python bools, True for the leaves a client keeps private.

  Args:
    variables: ``{'params': ..., 'batch_stats': ...}`` of one model (leaves of any
      shape: stacked or not, or ShapeDtypeStructs).
    setting: which BN values are private: 'usyb' (all), 'yb' (gamma, beta),
      'us' (running mean, variance) or 'none'.

  Returns:
    The same tree structure with a bool per leaf.
  """
  if setting not in SETTINGS:
    raise ValueError(f'bn_private={setting!r}: expected one of {SETTINGS}')

  def one(path, _):
    if not is_bn_path(path):
      return False
    collection, last = _key_name(path[0]), _key_name(path[-1])
    if collection == 'params' and last in ('scale', 'bias'):
      return 'y' in setting
    if collection == 'batch_stats' and last in ('mean', 'var'):
      return 'u' in setting
    return False

  return jax.tree_util.tree_map_with_path(one, variables)


def shared_elements(variables: PyTree, mask: PyTree) -> int:
  """Scalars in one model's federated (non-private) leaves: what travels each way."""
  return int(sum(int(np.prod(x.shape)) for x, m in
                 zip(jax.tree.leaves(variables), jax.tree.leaves(mask)) if not m))


def merge(private: PyTree, shared: PyTree, mask: PyTree) -> PyTree:
  """Private leaves from ``private``, the others from ``shared`` (broadcast to its shape)."""
  return jax.tree.map(lambda m, p, s: p if m else jnp.broadcast_to(s, p.shape).astype(p.dtype),
                      mask, private, shared)


@functools.partial(jax.jit, static_argnames=('lr', 'beta1', 'beta2', 'eps'))
def server_adam(w: PyTree, mean: PyTree, m: PyTree, v: PyTree, *, lr: float, beta1: float,
                beta2: float, eps: float) -> tuple[PyTree, PyTree, PyTree]:
  """One FedAdam step (the authors' ``ServerAdam.apply_gradients``) on every leaf.

  Args:
    w: the global model before the round.
    mean: the weighted mean of the round's client models (same structure).
    m, v: the first and second moments (zeros before round 1).
    lr, beta1, beta2, eps: the server learning rate, the moment decays, the stabiliser.

  Returns:
    ``(w_new, m_new, v_new)``.
  """
  g = jax.tree.map(lambda a, b: a - b, w, mean)
  m = jax.tree.map(lambda mm, gg: beta1 * mm + (1 - beta1) * gg, m, g)
  v = jax.tree.map(lambda vv, gg: beta2 * vv + (1 - beta2) * gg * gg, v, g)
  w = jax.tree.map(lambda a, mm, vv: (a - lr * mm / (jnp.sqrt(vv) + eps)).astype(a.dtype),
                   w, m, v)
  return w, m, v
