"""Model state pytrees shared by every algorithm."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class ModelState:
  """Parameters, BatchNorm statistics and optimizer states of one or more models.

  In a cohort every leaf has a leading client axis. ``opt_state`` maps an
  optimizer slot name (``'train'``, and ``'distill'`` when distillation uses its
  own optimizer) to that optimizer's state.
  """
  params: Any
  batch_stats: Any
  opt_state: Any


def take_clients(tree: Any, idx: jax.Array) -> Any:
  """Gathers rows ``idx`` of every leaf (out-of-range rows are clamped)."""
  return jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode='clip'), tree)


def put_clients(tree: Any, idx: jax.Array, rows: Any) -> Any:
  """Writes ``rows`` into rows ``idx`` of every leaf; out-of-range ids are dropped."""
  return jax.tree.map(lambda a, r: a.at[idx].set(r.astype(a.dtype), mode='drop'),
                      tree, rows)


def wrong_rows(tree: Any, num_rows: int) -> tuple[str, tuple[int, ...]] | None:
  """``(path, shape)`` of the first leaf of ``tree`` without ``num_rows`` rows, or None."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if np.ndim(leaf) < 1 or np.shape(leaf)[0] != num_rows:
      return jax.tree_util.keystr(path), tuple(np.shape(leaf))
  return None


def num_elements(tree: Any) -> int:
  """Number of scalar elements in a pytree (per model when unstacked)."""
  return int(sum(x.size for x in jax.tree.leaves(tree)))
