"""FedALA's adaptive local aggregation (ALA) as pure functions over parameter leaves.

J. Zhang, Y. Hua, H. Wang, T. Song, Z. Xue, R. Ma, H. Guan, "FedALA: Adaptive Local
Aggregation for Personalized Federated Learning", AAAI 2023 (Eqs. 3-5):

* the local initialisation of the top layers: ``theta_hat = theta + (theta_g - theta) * W``
  (element-wise, :func:`mix`); the lower layers take ``theta_g``;
* the weight step: ``W <- clip(W - eta * grad_theta_hat L * (theta_g - theta), 0, 1)``
  (:func:`weight_step`), the chain rule of ``dL/dW`` through :func:`mix`;
* the stop rule of the first ALA call: the population standard deviation of the last
  ``window`` recorded losses below ``threshold`` once more than ``window`` are recorded
  (:func:`converged`).

``local``, ``global_`` and ``w`` are sequences (tuples) of arrays of the same shapes: the
parameter leaves of the top layers. :func:`top_layers` finds which leaves those are.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array


def mix(local: Sequence[Array], global_: Sequence[Array], w: Sequence[Array]) -> tuple:
  """``theta + (theta_g - theta) * W`` leaf by leaf (FedALA Eq. 4's top layers)."""
  return tuple(l + (g - l) * wi for l, g, wi in zip(local, global_, w))


def weight_step(w: Sequence[Array], grads: Sequence[Array], local: Sequence[Array],
                global_: Sequence[Array], eta: float | Array) -> tuple:
  """``clip(W - eta * g * (theta_g - theta), 0, 1)`` with ``g = dL/dtheta_hat`` (Eq. 5)."""
  return tuple(jnp.clip(wi - eta * gi * (g - l), 0.0, 1.0)
               for wi, gi, l, g in zip(w, grads, local, global_))


def step(loss: Callable[[tuple], Array], w: Sequence[Array], local: Sequence[Array],
         global_: Sequence[Array], eta: float | Array) -> tuple[tuple, Array]:
  """One ALA weight step: the loss at ``theta_hat = mix(local, global_, w)``, its gradient
  in ``theta_hat``, and :func:`weight_step`.

  Args:
    loss: ``loss(theta_hat_leaves) -> scalar``.

  Returns:
    ``(new W, the loss before the step)``.
  """
  value, grads = jax.value_and_grad(loss)(mix(local, global_, w))
  return weight_step(w, grads, local, global_, eta), value


def converged(history: Array, count: Array, window: int, threshold: float | Array) -> Array:
  """Whether the first ALA call stops: more than ``window`` losses recorded and the
  population std of the last ``window`` below ``threshold`` (the authors' ``ALA.py``).

  Args:
    history: ``[window]`` ring buffer of recorded losses (slot ``i % window`` holds loss i).
    count: how many losses have been recorded.
  """
  return (count > window) & (jnp.std(history) < threshold)


# ------------------------------------------------------------------ layers
def layer_order(module: nn.Module, x: Array) -> list[tuple[str, ...]]:
  """Paths of the submodules that own parameters, in the order the forward pass calls
  them (first call counts), from an abstract initialisation on ``x`` (no compute)."""
  calls: list[tuple[str, ...]] = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == '__call__':
      own = context.module.variables.get('params', {})
      if any(not isinstance(v, dict) for v in own.values()):
        path = tuple(context.module.path)
        if path not in calls:
          calls.append(path)
    return out

  def init(x):
    with nn.intercept_methods(record):
      key = jax.random.PRNGKey(0)
      return module.init({'params': key, 'dropout': key}, x, train=False)

  jax.eval_shape(init, x)
  return calls


def leaf_paths(params: Any) -> list[tuple[str, ...]]:
  """The dict-key path of every leaf of a parameter tree, in ``jax.tree.leaves`` order."""
  flat, _ = jax.tree_util.tree_flatten_with_path(params)
  return [tuple(str(getattr(k, 'key', k)) for k in path) for path, _ in flat]


def top_layers(module: nn.Module, x: Array, params: Any, layers: int) -> tuple[int, ...]:
  """Indices (in ``jax.tree.leaves(params)`` order) of the leaves of the top ``layers``
  parameterised layers (the last ones the forward pass calls)."""
  order = layer_order(module, x)
  top = set(order[-layers:]) if layers > 0 else set()
  return tuple(i for i, p in enumerate(leaf_paths(params)) if p[:-1] in top)


def take_leaves(tree: Any, index: Sequence[int]) -> tuple:
  """The leaves ``index`` of ``tree`` as a tuple."""
  leaves = jax.tree.leaves(tree)
  return tuple(leaves[i] for i in index)


def put_leaves(tree: Any, index: Sequence[int], values: Sequence[Array]) -> Any:
  """``tree`` with its leaves ``index`` replaced by ``values``."""
  leaves, treedef = jax.tree.flatten(tree)
  for i, v in zip(index, values):
    leaves[i] = v
  return jax.tree.unflatten(treedef, leaves)
