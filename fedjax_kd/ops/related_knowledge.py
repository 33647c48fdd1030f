"""FedCache's sample-grained knowledge cache: hashes, related samples and their mean logits.

Z. Wu, S. Sun, Y. Wang, M. Liu, K. Xu, W. Wang, X. Jiang, B. Gao, J. Lu, "FedCache: A
Knowledge Cache-Driven Federated Learning Architecture for Personalized Edge Intelligence",
IEEE TMC 2024 (quoted as eqs. 2-3 of FedCache 2.0, arXiv 2405.13378).

Every private sample ``i`` (a row of the pooled private data) has a hash vector ``h_i``
computed once by a fixed encoder. The server relates each sample to its ``R`` nearest
samples by cosine similarity of the hashes (:func:`related_samples`; the authors' code
searches an HNSW index per class, here the search is exact and batched), keeps the latest
logits of every sample, and hands a client, for each of its samples, the mean of the
cached logits of the related ones (:func:`related_targets`). The client distils towards
them (:func:`cache_kd_loss`).

All functions are pure and jitted; no Python loop over samples or clients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd.ops import losses

Array = jax.Array

NONE = -1   # ``owner`` of a row no client holds; neighbour slots beyond the candidates


def projection(key: Array, in_dim: int, out_dim: int) -> Array:
  """A fixed Gaussian random projection ``[in_dim, out_dim]`` (entries ``N(0, 1/out_dim)``).

  Johnson-Lindenstrauss: inner products, hence cosine similarities, of the projected
  vectors approximate those of the inputs.
  """
  return jax.random.normal(key, (in_dim, out_dim), jnp.float32) / np.sqrt(out_dim)


@functools.partial(jax.jit, static_argnames=('normalize', 'chunk'))
def hash_features(x: Array, proj: Array | None, normalize, chunk: int = 1024) -> Array:
  """``[N, d]`` hash vectors: the flattened model inputs ``normalize(x)``, times ``proj``.

  Args:
    x: ``[N, ...]`` stored inputs (uint8 pixels, floats or token ids).
    proj: ``[D, d]`` a fixed projection of the flattened inputs, or None (the raw inputs).
    normalize: the stored-to-model input map (hashable; e.g. ``data.normalize``).
    chunk: rows mapped at a time (bounds the float32 copy of the inputs).
  """
  n = x.shape[0]
  pad = (-n) % chunk
  xs = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((-1, chunk) + x.shape[1:])

  def one(xc):
    f = normalize(xc).astype(jnp.float32).reshape(chunk, -1)
    return f if proj is None else f @ proj

  out = jax.lax.map(one, xs)
  return out.reshape(-1, out.shape[-1])[:n]


@functools.partial(jax.jit, static_argnames=('r', 'same_class', 'other_clients', 'chunk'))
def related_samples(features: Array, labels: Array, owner: Array, r: int, *,
                    same_class: bool = True, other_clients: bool = False,
                    chunk: int = 256) -> tuple[Array, Array]:
  """The ``r`` most cosine-similar candidate samples of every sample.

  A candidate of sample ``i`` is a row ``j != i`` held by a client (``owner[j] >= 0``),
  with ``labels[j] == labels[i]`` if ``same_class`` (the authors' per-class index) and
  ``owner[j] != owner[i]`` if ``other_clients``. Ties go to the lower row.

  Args:
    features: ``[N, d]`` hash vectors (a zero vector has similarity 0 with everything).
    labels: ``[N]`` int labels.
    owner: ``[N]`` int client of each row, ``NONE`` (-1) for rows no client holds.
    r: neighbours per sample (R).
    same_class, other_clients: the candidate rules above.
    chunk: query rows per step (memory ``chunk * N`` floats).

  Returns:
    ``(idx [N, r] int32, valid [N, r] bool)``: the neighbours, most similar first; slots
    beyond the candidates have ``valid`` False and ``idx`` 0.
  """
  n = features.shape[0]
  f = features.astype(jnp.float32)
  f = f / jnp.maximum(jnp.linalg.norm(f, axis=1, keepdims=True), 1e-12)
  pad = (-n) % chunk
  rows = jnp.arange(n + pad, dtype=jnp.int32).reshape(-1, chunk)
  cand = owner >= 0
  k = min(r, n)

  def one(q):
    qc = jnp.minimum(q, n - 1)
    sims = f[qc] @ f.T                                        # [chunk, N]
    ok = cand[None, :] & (jnp.arange(n)[None, :] != q[:, None])
    if same_class:
      ok &= labels[None, :] == labels[qc][:, None]
    if other_clients:
      ok &= owner[None, :] != owner[qc][:, None]
    vals, idx = jax.lax.top_k(jnp.where(ok, sims, -jnp.inf), k)
    return idx.astype(jnp.int32), jnp.isfinite(vals)

  idx, valid = jax.lax.map(one, rows)
  idx, valid = idx.reshape(-1, k)[:n], valid.reshape(-1, k)[:n]
  if k < r:   # fewer samples than R
    idx = jnp.pad(idx, [(0, 0), (0, r - k)])
    valid = jnp.pad(valid, [(0, 0), (0, r - k)])
  return jnp.where(valid, idx, 0), valid


@jax.jit
def related_targets(cache: Array, idx: Array, valid: Array) -> tuple[Array, Array]:
  """Eq. 3's teacher logits: the mean cached logits of each sample's valid related samples.

  Args:
    cache: ``[N, C]`` the cached logits of every sample.
    idx, valid: ``[N, R]`` from :func:`related_samples` (``valid`` may also drop entries
      never written, FedCache's ``cold_start='skip'``).

  Returns:
    ``(targets [N, C], weight [N])``: the mean over the valid related samples (zeros and
    weight 0 where there is none), weight 1 elsewhere.
  """
  w = valid.astype(cache.dtype)
  count = jnp.sum(w, axis=1)
  total = jnp.einsum('nr,nrc->nc', w, jnp.take(cache, idx, axis=0))
  return total / jnp.maximum(count, 1.0)[:, None], (count > 0).astype(cache.dtype)


def cache_kd_loss(logits: Array, labels: Array, targets: Array, weight: Array,
                  beta: float | Array, temperature: float | Array) -> Array:
  """FedCache's per-sample local objective (FedCache 2.0 eqs. 2-3, the authors' KL_Loss).

  ``CE(logits, y) + beta * weight * T^2 * KL(softmax(targets / T) || softmax(logits / T))``:
  the teacher is the softmax of the mean related logits, the student the client's own
  prediction (standard KD direction, as the code's ``nn.KLDivLoss(log q, t)``).

  Returns:
    ``[B]`` per-sample losses.
  """
  t = jnp.asarray(temperature, jnp.float32)
  log_q = jax.nn.log_softmax(logits / t, axis=-1)
  teacher = jax.nn.softmax(targets / t, axis=-1)
  kl = losses.tempered_kl(log_q, teacher)
  return losses.cross_entropy(logits, labels) + beta * weight * t * t * kl


@jax.jit
def write_logits(cache: Array, seen: Array, rows: Array, values: Array,
                 mask: Array) -> tuple[Array, Array]:
  """The cache with ``cache[rows[m]] = values[m]`` where ``mask[m]`` (others dropped).

  Args:
    cache: ``[N, C]``; seen: ``[N]`` bool, rows ever written.
    rows: ``[...]`` int rows; values: ``[..., C]``; mask: ``[...]`` bool.
  """
  n = cache.shape[0]
  dest = jnp.where(mask, rows, n).reshape(-1)
  cache = cache.at[dest].set(values.reshape(-1, values.shape[-1]).astype(cache.dtype),
                             mode='drop')
  return cache, seen.at[dest].set(True, mode='drop')


def owners(client_idx: np.ndarray, client_n: np.ndarray, num_rows: int) -> np.ndarray:
  """``[num_rows]`` int32 client holding each private row (``NONE`` if none; the last
  client listing a row wins, partitions are disjoint)."""
  idx, n = np.asarray(client_idx), np.asarray(client_n)
  real = np.arange(idx.shape[1])[None, :] < n[:, None]
  out = np.full(num_rows, NONE, np.int32)
  out[idx[real]] = np.broadcast_to(np.arange(idx.shape[0])[:, None], idx.shape)[real]
  return out
