"""FedKD's math: SVD compression of updates by an energy threshold, and mutual distillation.

C. Wu, F. Wu, L. Lyu, Y. Huang, X. Xie, "Communication-efficient federated learning via
knowledge distillation", Nature Communications 13, 2032 (2022); authors' code
github.com/wuch15/FedKD (``run.py``, ``model_bert.py``).

* **Dynamic gradient approximation.** Each weight matrix ``G`` of the mentee's update is
  sent as its top-``k`` SVD factors ``U_k, S_k, V_k``, ``k`` the smallest rank whose
  singular values hold at least a fraction ``T(t)`` of the energy:
  ``sum_{i<=k} s_i^2 >= T(t) sum_i s_i^2`` (:func:`kept_rank`). ``T`` rises linearly
  over the rounds, ``T(t) = t_min + (t / rounds) (t_max - t_min)`` for rounds
  ``t = 1..rounds`` (:func:`energy_threshold`; the code's ``tmin + ((1 + r) / epochs)
  (tmax - tmin)`` with 0-based ``r``). Kernels of more than two axes are compressed as
  the matrix ``[prod(shape[:-1]), shape[-1]]``; vectors (biases, norms) travel whole.
  The code searches ``k`` in ``0..n-1`` with ``>`` on the client and ``>=`` on the server,
  so an update that needs full rank is sent as rank 0 there; here ``k`` is in ``1..n``
  with ``>=`` on both sides (full rank when needed), and an all-zero matrix has rank 0.
* **Adaptive mutual distillation** (:func:`mutual_distillation_loss`): the mentor ``t``
  and mentee ``s`` each minimise their task loss plus the distillation and hidden losses
  divided by the sum of both task losses (the paper's eqs. 1-6; the code's ``forward``),
  so the models lean on each other more where both predict well.

All functions are pure and jit friendly (static shapes: a kept rank masks singular
values, it does not slice). To compress many updates at once use :func:`compress_each`, not
``jax.vmap`` of the SVD: on XLA:CPU a batched ``jnp.linalg.svd`` of matrices large enough
(a convolution kernel) splits its batch over the intra-op thread pool and blocks a pool
thread until the pieces are done, so two such SVDs running side by side (one per leaf)
take every thread of a small pool (2 cores) and wait forever. One matrix at a time
(``jax.lax.map``) runs inline.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from fedjax_kd.ops import losses

Array = jax.Array


def energy_threshold(t: int | Array, rounds: int, t_min: float, t_max: float) -> Array:
  """``T(t) = t_min + (t / rounds) (t_max - t_min)``: round ``t`` (from 1) of ``rounds``."""
  return t_min + (jnp.asarray(t, jnp.float32) / rounds) * (t_max - t_min)


def kept_rank(sigma: Array, energy: float | Array) -> Array:
  """The smallest ``k`` with ``sum_{i<k} sigma_i^2 >= energy * sum sigma^2`` (int32).

  ``sigma`` is sorted descending (as ``jnp.linalg.svd`` returns it); 0 for an all-zero
  matrix, at most ``len(sigma)``.
  """
  e = jnp.square(sigma.astype(jnp.float32))
  total = jnp.sum(e)
  cum = jnp.cumsum(e)
  # Relative slack of float32 sums, so that full energy (1.0) is reached at full rank.
  below = cum < energy * total * (1 - 1e-6)
  k = jnp.sum(below).astype(jnp.int32) + 1
  return jnp.where(total > 0, jnp.minimum(k, sigma.shape[0]), 0).astype(jnp.int32)


def as_matrix(x: Array) -> Array:
  """A kernel of two or more axes as the matrix ``[prod(shape[:-1]), shape[-1]]``."""
  return x.reshape(-1, x.shape[-1])


def compress_matrix(g: Array, energy: float | Array) -> tuple[Array, Array]:
  """``(U_k S_k V_k, k)``: ``g`` (a matrix) through its rank-``k`` energy truncation."""
  u, s, vt = jnp.linalg.svd(g.astype(jnp.float32), full_matrices=False)
  k = kept_rank(s, energy)
  s = jnp.where(jnp.arange(s.shape[0]) < k, s, 0.0)
  return ((u * s[None, :]) @ vt).astype(g.dtype), k


def factor_elements(shape: tuple[int, ...], k: Array) -> Array:
  """Floats of ``U_k, S_k, V_k`` for a matrix ``[m, n]`` of rank ``k``: ``k (m + n + 1)``."""
  m = math.prod(shape[:-1])
  return k * (m + shape[-1] + 1)


def compress_tree(tree: Any, energy: float | Array) -> tuple[Any, Array]:
  """A pytree of updates through :func:`compress_matrix`, and the floats it costs to send.

  Leaves of two or more axes are compressed (as :func:`as_matrix`) and cost
  :func:`factor_elements`; other leaves are sent whole (their size).

  Returns:
    ``(reconstructed tree, elements)``: what the receiver rebuilds, and an int32 count.
  """
  leaves, treedef = jax.tree.flatten(tree)
  out, count = [], jnp.zeros((), jnp.int32)
  for leaf in leaves:
    if leaf.ndim >= 2:
      rec, k = compress_matrix(as_matrix(leaf), energy)
      out.append(rec.reshape(leaf.shape))
      count = count + factor_elements(leaf.shape, k).astype(jnp.int32)
    else:
      out.append(leaf)
      count = count + leaf.size
  return jax.tree.unflatten(treedef, out), count


def _masked_mean(x: Array, mask: Array) -> Array:
  return losses.masked_mean(x, mask)


def mutual_distillation_loss(logits_t: Array, logits_s: Array, labels: Array, mask: Array,
                             hidden_t: Array | None = None,
                             hidden_s: Array | None = None) -> tuple[Array, dict]:
  """FedKD's joint mentor/mentee objective on one batch (the sum ``L_t + L_s``).

  With ``L^c`` the batch-mean cross-entropies and ``w = 1 / (L_t^c + L_s^c)``:

    ``L_t = L_t^c + w KL(p_s || p_t) + w L^h``,  ``L_s = L_s^c + w KL(p_t || p_s) + w L^h``

  (paper eqs. 1-6, teacher first in each KL: ``KL(p_s || p_t)`` trains the mentor towards
  the mentee). Each model learns only from its own terms: the other model's prediction and
  the weight ``w`` are constants (``stop_gradient``; the code backpropagates the sum
  through everything). The hidden loss ``L^h`` is the mean squared difference of the two
  models' batch cosine-similarity matrices of ``hidden_*`` (``[B, d]`` features of any
  widths: the analogue for non-transformer models of the paper's attention-matrix MSE;
  None: no hidden loss). KLs are per-sample sums over classes, averaged over the batch.

  Args:
    logits_t, logits_s: ``[B, C]`` mentor and mentee logits.
    labels: ``[B]`` int labels; mask: ``[B]`` bool, the real samples.
    hidden_t, hidden_s: optional ``[B, d_t]``, ``[B, d_s]`` features.

  Returns:
    ``(L_t + L_s, parts)`` with parts ``ce_t, ce_s, kd_t, kd_s, hidden, weight``.
  """
  sg = jax.lax.stop_gradient
  ce_t = _masked_mean(losses.cross_entropy(logits_t, labels), mask)
  ce_s = _masked_mean(losses.cross_entropy(logits_s, labels), mask)
  w = sg(1.0 / jnp.maximum(ce_t + ce_s, 1e-8))
  logp_t = jax.nn.log_softmax(logits_t, -1)
  logp_s = jax.nn.log_softmax(logits_s, -1)
  kd_t = _masked_mean(losses.tempered_kl(logp_t, sg(jnp.exp(logp_s))), mask)
  kd_s = _masked_mean(losses.tempered_kl(logp_s, sg(jnp.exp(logp_t))), mask)
  hidden = jnp.zeros((), jnp.float32)
  if hidden_t is not None and hidden_s is not None:
    m = mask.astype(jnp.float32)
    pair = m[:, None] * m[None, :]

    def gram(h):
      h = h / jnp.maximum(jnp.linalg.norm(h, axis=1, keepdims=True), 1e-12)
      return h @ h.T

    # Each model is pulled towards the other's (constant) similarity matrix.
    g_t, g_s = gram(hidden_t), gram(hidden_s)
    denom = jnp.maximum(jnp.sum(pair), 1.0)
    h_t = jnp.sum(jnp.square(g_t - sg(g_s)) * pair) / denom
    h_s = jnp.sum(jnp.square(g_s - sg(g_t)) * pair) / denom
    hidden = 0.5 * (h_t + h_s)
    total = ce_t + ce_s + w * (kd_t + kd_s + h_t + h_s)
  else:
    total = ce_t + ce_s + w * (kd_t + kd_s)
  return total, {'ce_t': ce_t, 'ce_s': ce_s, 'kd_t': kd_t, 'kd_s': kd_s, 'hidden': hidden,
                 'weight': w}



# --------------------------------------------------------------- the server's step
def compress_tree_ranked(tree: Any, energy: float | Array) -> tuple[Any, Array, Array]:
  """:func:`compress_tree` that also returns the kept rank of every compressed leaf.

  Returns:
    ``(reconstructed tree, elements, ranks)``: ``ranks`` ``[L]`` int32, one per leaf of two
    or more axes in flatten order (``[0]``-shaped when there is none).
  """
  leaves, treedef = jax.tree.flatten(tree)
  out, ranks, count = [], [], jnp.zeros((), jnp.int32)
  for leaf in leaves:
    if leaf.ndim >= 2:
      rec, k = compress_matrix(as_matrix(leaf), energy)
      out.append(rec.reshape(leaf.shape))
      ranks.append(k)
      count = count + factor_elements(leaf.shape, k).astype(jnp.int32)
    else:
      out.append(leaf)
      count = count + leaf.size
  ranks = jnp.stack(ranks) if ranks else jnp.zeros((0,), jnp.int32)
  return jax.tree.unflatten(treedef, out), count, ranks


def compress_each(trees: Any, energy: float | Array) -> tuple[Any, Array, Array]:
  """:func:`compress_tree_ranked` of every tree along the leading axis of ``trees``.

  One tree after another (``jax.lax.map``), so that each SVD is of one matrix: a batched
  SVD on XLA:CPU can deadlock its thread pool (see the module's docstring).

  Returns:
    ``(reconstructed trees [S, ...], elements [S], ranks [S, L])``.
  """
  return jax.lax.map(lambda tree: compress_tree_ranked(tree, energy), trees)


def weighted_sum(trees: Any, weights: Array) -> Any:
  """``sum_s weights[s] trees[s]`` over the leading (client) axis of every leaf."""
  w = weights.astype(jnp.float32)
  return jax.tree.map(lambda a: jnp.tensordot(w, a.astype(jnp.float32), axes=1).astype(a.dtype),
                      trees)


def server_downlink(total: Any, weight: Array,
                    energy: float | Array) -> tuple[Any, Array, Array]:
  """The server's averaged update ``total / weight``, compressed again at ``energy``.

  Returns:
    :func:`compress_tree_ranked` of the mean: what every client rebuilds and adds to its
    mentee, the floats sent, the kept ranks. A zero weight gives a zero update.
  """
  mean = jax.tree.map(lambda a: a / jnp.maximum(weight, 1e-12).astype(a.dtype), total)
  return compress_tree_ranked(mean, energy)


def aggregate_updates(updates: Any, weights: Array,
                      energy: float | Array) -> tuple[Any, Array, Array]:
  """One FedKD exchange of updates ``[S, ...]``: each client compresses its own update
  (:func:`compress_tree`), the server takes the ``weights``-weighted mean of what it rebuilds
  and compresses that again (:func:`server_downlink`).

  Returns:
    ``(the global update every client applies, [S] floats each client uploads, floats of the
    download)``.
  """
  rec, up, _ = compress_each(updates, energy)
  w = weights.astype(jnp.float32)
  down, n_down, _ = server_downlink(weighted_sum(rec, w), jnp.sum(w), energy)
  return down, up, n_down
