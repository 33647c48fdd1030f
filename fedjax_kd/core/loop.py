"""A client's minibatch loop with a local step the algorithm writes.

The engine's ``CohortKernels.fit`` steps one optimizer on one loss. Where a paper's local
step is not that (pFedMe's inner solve for a personalised model, Per-FedAvg's meta step
on two or three parts of each batch), the algorithm writes the step and :func:`local_loop`
runs it over the client's rows with the engine's batching: Keras-style epochs, reshuffled
each epoch, the partial last batch kept, stragglers' epoch budgets, and steps without a
real sample leaving everything unchanged. It runs per client under
``Federation.map_clients``, which vmaps it over a cohort's clients.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedjax_kd.core.kernels import batch_rows, budget_positions
from fedjax_kd.ops import losses
from fedjax_kd.ops import personal


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """Static options of :func:`local_loop` (hashable: part of a map function's options).

  Attributes:
    epochs: passes over the client's rows (the compiled maximum; ``epochs_k`` cuts it).
    batch_size: minibatch size B.
    parts: each minibatch is split into this many interleaved parts (positions ``i`` with
      ``i % parts == j`` form part ``j``), one gradient function each: Per-FedAvg's
      ``D, D' (, D'')``. A part with no real sample uses the whole batch.
    augment: optional ``augment(key, x) -> x`` of every training batch.
  """
  epochs: int
  batch_size: int
  parts: int = 1
  augment: Callable | None = None


def batch_grad_fn(kernels, x: jax.Array, y: jax.Array, mask: jax.Array,
                  key: jax.Array) -> personal.GradFn:
  """``grad_fn(params, aux) -> (grads, aux)`` of the mean cross-entropy over ``mask``'s rows
  of one gathered batch, in training mode (dropout from ``key``; ``aux['stats']`` are the
  BatchNorm statistics it updates, ``aux['loss']`` becomes this evaluation's loss)."""
  def grad_fn(params, aux):
    stats = aux['stats']

    def loss(p):
      kw = dict(train=True, mask=mask, rngs={'dropout': key})
      if stats:
        logits, upd = kernels.apply_model(p, stats, x, mutable=['batch_stats'], **kw)
        new = upd['batch_stats']
      else:
        logits, new = kernels.apply_model(p, stats, x, **kw), stats
      return losses.masked_mean(losses.cross_entropy(logits, y), mask), new

    (value, new), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return grads, {'stats': new, 'loss': value.astype(jnp.float32)}
  return grad_fn


def local_loop(kernels, key: jax.Array, idx: jax.Array, n: jax.Array, epochs_k: jax.Array,
               x: jax.Array, y: jax.Array, carry: Any, stats: Any, step: Callable,
               opts: LoopOptions) -> tuple[Any, Any, jax.Array]:
  """One client's minibatch loop with an arbitrary local step.

  The engine's batching (``CohortKernels.fit``): Keras-style epochs over the client's rows
  ``idx[:n]`` (reshuffled each epoch, partial last batch kept), steps past the client's
  ``epochs_k`` and steps without a real sample leave everything unchanged. Each step calls
  ``step(grad_fns, carry, aux) -> (carry, aux)`` with one gradient function per part of
  the batch (:func:`batch_grad_fn`; ``aux = {'stats', 'loss'}``).

  Returns:
    ``(carry, stats, mean over the steps run of each step's last loss; NaN if none ran)``.
  """
  b = opts.batch_size
  positions, step_keys = budget_positions(key, idx.shape[0], n, opts.epochs, b, epochs_k)
  part_of = jnp.arange(b) % opts.parts

  def body(state, inputs):
    pos, k = inputs
    rows, valid = batch_rows(idx, pos, n)
    xb, yb = kernels.inputs(x[rows]), y[rows]
    k_aug, k_drop = jax.random.split(k)
    if opts.augment is not None:
      xb = opts.augment(k_aug, xb)
    fns = []
    for j in range(opts.parts):
      m = valid & (part_of == j)
      m = jnp.where(jnp.any(m), m, valid)
      fns.append(batch_grad_fn(kernels, xb, yb, m, jax.random.fold_in(k_drop, j)))
    new = step(tuple(fns), *state)
    used = jnp.any(valid)
    new = jax.tree.map(lambda a, c: jnp.where(used, a, c), new, state)
    return new, (new[1]['loss'], used)

  aux = {'stats': stats, 'loss': jnp.float32(0.0)}
  (carry, aux), (values, used) = jax.lax.scan(body, (carry, aux), (positions, step_keys))
  usedf = used.astype(jnp.float32)
  loss = jnp.sum(values * usedf) / jnp.maximum(jnp.sum(usedf), 1.0)
  return carry, aux['stats'], jnp.where(jnp.any(used), loss, jnp.nan)
