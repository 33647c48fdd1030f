"""Aggregation of client soft labels: mean, ERA and power sharpening.

Implements
  * simple aggregation (SA) and entropy reduction aggregation (ERA) from
    S. Itahara et al., "Distillation-Based Semi-Supervised Federated Learning for
    Communication-Efficient Collaborative Training With Non-IID Private Data",
    IEEE TMC 2021 (DS-FL), eqs. (13)-(16);
  * Enhanced ERA (power sharpening, ``p^beta`` renormalised) from
    "Soft-Label Caching and Sharpening for Communication-Efficient Federated
    Distillation" (SCARLET), IEEE TMC 2026, and the per-sample means over
    uploaders its baselines use: CFD's vote frequencies (Sattler et al.,
    2020) and Selective-FD's L1 server selector (Shao et al., 2024);
  * the entropy used for DS-FL's global-logit entropy plots, eq. (12);
  * ACE-pFL's top-K filtering of uploaded soft predictions and its per-cluster
    means (K. He, H. Bai, Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient
    Personalized Federated Learning With Knowledge Distillation", IEEE/ACM
    ToN 2025, §III-D and Eq. 3). Eq. 3's global teacher is
    :func:`mean_aggregate` with the per-client weights of
    :func:`fedjax_kd.ops.label_cluster.cluster_weights`.

Every function is pure and jitted. Inputs are probability vectors (the DS-FL
paper's "logits" are softmax outputs), class axis last. Client uploads are
stacked as ``[K, n, C]``; an optional ``weights`` vector ``[K]`` (e.g. a
participation mask) turns the mean into a weighted mean.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.jit
def mean_aggregate(probs: Array, weights: Array | None = None) -> Array:
  """SA (DS-FL eq. 16): the (weighted) mean over the client axis.

  Args:
    probs: ``[K, n, C]`` client probability vectors.
    weights: optional ``[K]`` non-negative weights; a client with weight 0 (an
      absent or padded client) does not count. ``None`` is the plain 1/K mean.

  Returns:
    ``[n, C]`` mean probabilities.
  """
  if weights is None:
    return jnp.mean(probs, axis=0)
  w = jnp.asarray(weights, probs.dtype)
  return jnp.einsum('k,knc->nc', w, probs) / jnp.sum(w)


@jax.jit
def uploader_mean(probs: Array, mask: Array) -> tuple[Array, Array]:
  """Per-sample mean over the clients that uploaded that sample.

  SCARLET's denominator, as in its authors' code: ``K`` under full
  participation, the uploaders otherwise (Selective-FD: inlier clients only).

  Args:
    probs: ``[K, n, C]`` client vectors.
    mask: ``[K, n]`` bool, which client uploaded which sample.

  Returns:
    ``(mean [n, C], count [n])``; rows nobody uploaded are uniform with count 0.
  """
  w = mask.astype(probs.dtype)
  count = jnp.sum(w, axis=0)
  total = jnp.einsum('kn,knc->nc', w, probs)
  uniform = jnp.full_like(total, 1.0 / probs.shape[-1])
  mean = jnp.where(count[:, None] > 0, total / jnp.maximum(count, 1.0)[:, None], uniform)
  return mean, count


@jax.jit
def vote(probs: Array, mask: Array) -> tuple[Array, Array]:
  """CFD: vote frequencies of the clients' hard labels ``argmax_c p``.

  Args:
    probs: ``[K, n, C]`` client probabilities.
    mask: ``[K, n]`` uploads.

  Returns:
    ``(frequencies [n, C], count [n])``.
  """
  onehot = jax.nn.one_hot(jnp.argmax(probs, -1), probs.shape[-1], dtype=probs.dtype)
  return uploader_mean(onehot, mask)


@jax.jit
def l1_to_onehot(probs: Array) -> Array:
  """``|| onehot(argmax p) - p ||_1`` per row, ties giving several ones.

  Selective-FD's server-side selector keeps a sample iff this is below
  ``tau_server`` (Shao et al., Nat. Commun. 2024).
  """
  onehot = (probs == jnp.max(probs, axis=-1, keepdims=True)).astype(probs.dtype)
  return jnp.sum(jnp.abs(onehot - probs), axis=-1)


@functools.partial(jax.jit, static_argnames=())
def era(mean_probs: Array, temperature: Array | float) -> Array:
  """ERA (DS-FL eqs. 13-15): ``softmax(mean_probs / T)`` over classes.

  The softmax is applied to the averaged *probabilities*, not to logits or
  log-probabilities, exactly as the paper and SCARLET's code do it: with inputs
  in [0, 1] the output odds between two classes are at most ``exp(1/T)``, so
  ``T = 0.5`` can raise the entropy above SA's (DS-FL Fig. 6).

  Args:
    mean_probs: ``[..., C]`` averaged probabilities (e.g. from
      :func:`mean_aggregate`).
    temperature: ERA temperature ``T > 0`` (0.1 in DS-FL).

  Returns:
    ``[..., C]`` sharpened probabilities.
  """
  return jax.nn.softmax(mean_probs / temperature, axis=-1)


@jax.jit
def power_sharpen(probs: Array, beta: Array | float) -> Array:
  """Enhanced ERA (SCARLET): ``p^beta / sum_c p_c^beta``.

  Computed stably as ``softmax(beta * log p)`` with ``log 0 = -inf`` handled:
  a zero probability stays zero for ``beta > 0`` and a row of all zeros never
  occurs for probability inputs. ``beta = 1`` is the identity.

  Args:
    probs: ``[..., C]`` probability vectors.
    beta: sharpening exponent ``beta > 0``.

  Returns:
    ``[..., C]`` sharpened probabilities.
  """
  tiny = jnp.finfo(probs.dtype).tiny
  logp = jnp.where(probs > 0, jnp.log(jnp.maximum(probs, tiny)), -jnp.inf)
  return jax.nn.softmax(beta * logp, axis=-1)


@jax.jit
def entropy(probs: Array) -> Array:
  """Shannon entropy in nats along the last axis (DS-FL eq. 12), 0 log 0 = 0."""
  return jnp.sum(jax.scipy.special.entr(probs), axis=-1)


@functools.partial(jax.jit, static_argnames=('k', 'renormalize'))
def top_k_filter(probs: Array, k: int, renormalize: bool = True) -> tuple[Array, Array]:
  """ACE-pFL's top-K filtering: keep each row's ``k`` largest entries, zero the rest.

  Ties go to the lower class index (``lax.top_k`` order), so exactly ``k``
  entries are kept per row.

  Args:
    probs: ``[..., C]`` probabilities.
    k: entries kept per row, ``1 <= k <= C``.
    renormalize: rescale the kept entries to sum to 1 (zeros elsewhere).

  Returns:
    ``(filtered [..., C], kept [..., C] bool)``.
  """
  c = probs.shape[-1]
  if not 1 <= k <= c:
    raise ValueError(f'top-K k={k}: expected 1 <= k <= {c} (the number of classes)')
  _, top = jax.lax.top_k(probs, k)
  kept = jnp.sum(jax.nn.one_hot(top, c, dtype=jnp.int32), axis=-2) > 0
  out = jnp.where(kept, probs, 0.0)
  if renormalize:
    out = out / jnp.maximum(jnp.sum(out, axis=-1, keepdims=True), 1e-30)
  return out, kept


TOP_K_COMPLETIONS = ('fill', 'renormalize', 'none')


@functools.partial(jax.jit, static_argnames=('mode',))
def complete_top_k(values: Array, kept: Array, mode: str = 'fill') -> Array:
  """Turns received top-K values back into a distribution over all classes.

  Args:
    values: ``[..., C]`` the kept probabilities (0 elsewhere), as uploaded.
    kept: ``[..., C]`` bool, which entries were sent.
    mode: ``'fill'`` spreads the missing mass ``1 - sum(values)`` uniformly over
      the entries not sent (the maximum-entropy completion: the receiver knows
      only that each of them is at most the K-th largest value);
      ``'renormalize'`` rescales the kept entries to sum to 1 and leaves zeros
      elsewhere (a target the student cannot reach at high temperatures);
      ``'none'`` returns ``values`` unchanged.
      If noise pushed the kept mass above 1, ``'fill'`` rescales it to 1.

  Returns:
    ``[..., C]``.
  """
  if mode == 'none':
    return values
  mass = jnp.sum(values, axis=-1, keepdims=True)
  if mode == 'renormalize':
    return values / jnp.maximum(mass, 1e-30)
  if mode != 'fill':
    raise ValueError(f'mode={mode!r}: expected one of {TOP_K_COMPLETIONS}')
  missing = jnp.sum(~kept, axis=-1, keepdims=True).astype(values.dtype)
  rest = jnp.maximum(1.0 - mass, 0.0) / jnp.maximum(missing, 1.0)
  scaled = values / jnp.maximum(mass, 1.0)
  return jnp.where(kept, scaled, rest)


@functools.partial(jax.jit, static_argnames=('num_clusters',))
def cluster_means(probs: Array, labels: Array, weights: Array, num_clusters: int) -> Array:
  """Per-cluster (weighted) means of client soft labels: ACE-pFL's inner mean of Eq. 3.

  Args:
    probs: ``[K, n, C]`` client vectors.
    labels: ``[K]`` int cluster of each client, in ``[0, num_clusters)``.
    weights: ``[K]`` non-negative weights (1 for a participating client, 0
      for an absent one).
    num_clusters: ``V``.

  Returns:
    ``[V, n, C]``; a cluster with no weight gets the uniform distribution.
  """
  w = jax.nn.one_hot(labels, num_clusters, dtype=probs.dtype) * weights[:, None]
  total = jnp.einsum('kv,knc->vnc', w, probs)
  mass = jnp.sum(w, axis=0)
  uniform = jnp.full_like(total, 1.0 / probs.shape[-1])
  return jnp.where(mass[:, None, None] > 0, total / jnp.maximum(mass, 1e-30)[:, None, None],
                   uniform)


AGGREGATIONS = ('sa', 'era')


def aggregate(probs: Array, method: str, temperature: float = 0.1,
              weights: Array | None = None) -> Array:
  """DS-FL server aggregation: ``'sa'`` (eq. 16) or ``'era'`` (eq. 13).

  Args:
    probs: ``[K, n, C]`` client probabilities.
    method: ``'sa'`` or ``'era'``.
    temperature: ERA temperature.
    weights: optional ``[K]`` client weights or participation mask.

  Returns:
    ``[n, C]`` soft labels to broadcast.
  """
  mean = mean_aggregate(probs, weights)
  if method == 'sa':
    return mean
  if method == 'era':
    return era(mean, temperature)
  raise ValueError(f'aggregation={method!r}: expected one of {AGGREGATIONS}')
