"""Synchronised soft-label cache as device arrays (SCARLET, Algorithm 2).

K. Azuma, T. Nishio, Y. Kitagawa, W. Nakano, T. Tanimura, "Soft-Label Caching
and Sharpening for Communication-Efficient Federated Distillation" (SCARLET),
arXiv 2504.19602 / IEEE TMC 2026, Section IV-B and Algorithm 2.

A cache is two arrays: ``labels f32[N_public, C]`` and ``stamp i32[N_public]``
(the round an entry was cached, ``EMPTY`` = -1). Validity is computed, never
stored: an entry cached at round ``t_c`` is reused while ``t - t_c <= D``
(the authors' reproducibility branch; their ``main`` branch reuses one round
less, an off-by-one we do not copy). The first
draw after that uses a fresh label once without re-caching it (``EXPIRED``);
the draw after that caches it again (``NEWLY_CACHED``). With ``D = 0`` nothing
is ever reused.

Every function here is pure and jitted; there are no Python loops over
indices. The round protocol (``fedjax_kd.algorithms.protocol``) calls
:func:`select` (which of this round's indices must be requested),
:func:`update_global` (server: merge fresh aggregates, emit signals) and
:func:`rebuild_local` (client: rebuild the full label set from its local cache,
the received fresh labels in FIFO order and the signals). Partial
participation adds per-client stamps: :func:`catch_up_counts` and
:func:`sync_clients` track which server entry each client holds, which is all
that is needed because an entry's label never changes while it is cached.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp

Array = jax.Array

EMPTY = -1
# Signal encoding (any would do; this is the authors' ``main`` branch).
CACHED = 0
NEWLY_CACHED = 1
EXPIRED = 2
ABSENT = 3        # requested but no label was produced (e.g. Selective-FD filtered it)
SIGNAL_NAMES = ('cached', 'newly_cached', 'expired', 'absent')


@flax.struct.dataclass
class SoftLabelCache:
  """Aggregated soft labels keyed by public-sample index.

  Attributes:
    labels: ``[N_public, C]`` (or ``[K, N_public, C]`` for per-client content).
    stamp: ``[N_public]`` round each entry was cached, ``EMPTY`` if none.
  """
  labels: Array
  stamp: Array


def empty_cache(num_public: int, num_classes: int,
                num_clients: int | None = None) -> SoftLabelCache:
  """An empty cache; ``num_clients`` gives per-client label content."""
  shape = (num_public, num_classes) if num_clients is None else (
      num_clients, num_public, num_classes)
  return SoftLabelCache(labels=jnp.zeros(shape, jnp.float32),
                        stamp=jnp.full((num_public,), EMPTY, jnp.int32))


def is_valid(stamp: Array, t: Array | int, duration: Array | int) -> Array:
  """Entries reusable at round ``t``: cached and ``t - t_c <= D``."""
  return (stamp >= 0) & (t - stamp <= duration)


@jax.jit
def select(stamp: Array, indices: Array, t: Array | int,
           duration: Array | int) -> tuple[Array, Array]:
  """Orders this round's draw and marks what must be requested (``I_req``).

  Implements the semantics of the paper's text and the authors' code: an index
  is requested if it has no entry *or* its entry has expired. (Algorithm 1 read
  literally never requests a stale entry, so a client would pop a label that
  was never sent.)

  Args:
    stamp: ``[N]`` cache stamps.
    indices: ``[n]`` this round's public indices ``I^t`` (draw order).
    t: the round.
    duration: cache duration ``D >= 0``.

  Returns:
    ``(ordered [n], requested [n] bool)``: requested indices first, then the
    cached ones, each group in draw order (the authors' order); ``requested``
    is aligned with ``ordered``.
  """
  req = ~is_valid(stamp[indices], t, duration)
  order = jnp.argsort(~req, stable=True)
  return indices[order], req[order]


@jax.jit
def update_global(cache: SoftLabelCache, indices: Array, fresh: Array, has_label: Array,
                  t: Array | int, duration: Array | int
                  ) -> tuple[SoftLabelCache, Array, Array]:
  """UpdateGlobalCache (Algorithm 2) for one round, vectorised.

  Args:
    cache: the server cache before this round.
    indices: ``[n]`` ``I^t`` (distinct).
    fresh: ``[n, C]`` fresh aggregates, used where an index is not validly
      cached (values at cached positions are ignored).
    has_label: ``[n]`` bool, False where a requested index got no aggregate
      (nobody uploaded it, or a server selector dropped it).
    t: the round (the new stamp).
    duration: ``D``.

  Returns:
    ``(new cache, labels [n, C], signals [n] int32)``: ``labels`` is ``zhat^t``
    (cached entries as stored, fresh ones otherwise); signals are
    ``NEWLY_CACHED`` (stored now), ``CACHED`` (reused), ``EXPIRED`` (stale
    entry removed, fresh label used once, not stored) or ``ABSENT``.
  """
  stamp = cache.stamp[indices]
  present = stamp >= 0
  valid = is_valid(stamp, t, duration)
  signals = jnp.where(valid, CACHED, jnp.where(present, EXPIRED, NEWLY_CACHED))
  signals = jnp.where(~valid & ~has_label, ABSENT, signals).astype(jnp.int32)
  labels = jnp.where(valid[:, None], cache.labels[indices], fresh)
  new_stamp = jnp.where(signals == NEWLY_CACHED, t,
                        jnp.where(signals == EXPIRED, EMPTY, stamp)).astype(jnp.int32)
  store = signals == NEWLY_CACHED
  new_labels = cache.labels.at[indices].set(
      jnp.where(store[:, None], fresh, cache.labels[indices]))
  return SoftLabelCache(labels=new_labels, stamp=cache.stamp.at[indices].set(new_stamp)), \
      labels, signals


def is_fresh(signals: Array) -> Array:
  """Positions whose label travels in the downlink queue (NEWLY_CACHED, EXPIRED)."""
  return (signals == NEWLY_CACHED) | (signals == EXPIRED)


def fifo_queue(labels: Array, signals: Array) -> Array:
  """The downlink ``zhat_req``: fresh rows of ``labels`` first, in order.

  Args:
    labels: ``[..., n, C]`` labels aligned with the signals.
    signals: ``[n]``.

  Returns:
    ``[..., n, C]``; rows past ``#fresh`` are padding.
  """
  order = jnp.argsort(~is_fresh(signals), stable=True)
  return jnp.take(labels, order, axis=-2)


def _rebuild_one(labels: Array, stamp: Array, indices: Array, signals: Array, queue: Array,
                 t: Array | int):
  fresh_pos = jnp.cumsum(is_fresh(signals)) - 1   # position in the FIFO queue
  popped = queue[jnp.clip(fresh_pos, 0, queue.shape[0] - 1)]
  cached = signals == CACHED
  out = jnp.where(cached[:, None], labels[indices], popped)
  store = signals == NEWLY_CACHED
  new_labels = labels.at[indices].set(jnp.where(store[:, None], popped, labels[indices]))
  old = stamp[indices]
  new_stamp = jnp.where(store, t, jnp.where(signals == EXPIRED, EMPTY, old))
  return new_labels, stamp.at[indices].set(new_stamp.astype(jnp.int32)), out


@jax.jit
def rebuild_local(cache: SoftLabelCache, indices: Array, signals: Array, queue: Array,
                  t: Array | int) -> tuple[SoftLabelCache, Array]:
  """UpdateLocalCache (Algorithm 2): a client rebuilds ``zhat^{t}`` and its cache.

  Args:
    cache: the client's local cache (``labels [N, C]``, or ``[K, N, C]`` with
      per-client content, then ``queue`` is ``[K, m, C]``).
    indices: ``[n]`` ``I^t`` as received.
    signals: ``[n]`` ``gamma^t`` aligned with ``indices``.
    queue: ``[m, C]`` the received fresh labels in order (FIFO); only the first
      ``#(NEWLY_CACHED or EXPIRED)`` rows are read.
    t: the round the labels belong to (the stamp of new entries).

  Returns:
    ``(new local cache, labels [n, C] or [K, n, C])``. Positions signalled
    ``ABSENT`` carry no label (they are never trained on).
  """
  if cache.labels.ndim == 3:
    fn = jax.vmap(_rebuild_one, in_axes=(0, None, None, None, 0, None),
                  out_axes=(0, None, 0))
  else:
    fn = _rebuild_one
  labels, stamp, out = fn(cache.labels, cache.stamp, indices, signals, queue, t)
  return SoftLabelCache(labels=labels, stamp=stamp), out


@jax.jit
def catch_up_counts(client_stamp: Array, indices: Array, server_stamp: Array,
                    receivers: Array) -> tuple[Array, Array]:
  """Per-client catch-up diff sizes before a client applies round signals.

  Under partial participation a client may have missed signals. Before it
  processes ``gamma^t`` for ``I^t`` it must hold the same entries as the
  server did when ``gamma^t`` was computed (the authors' code sends this diff
  as ``update_indices``/``update_probs``/``stale_indices``).

  Args:
    client_stamp: ``[K, N]`` stamp of the entry each client holds.
    indices: ``[n]`` ``I^t``.
    server_stamp: ``[n]`` the server's stamps of ``I^t`` *before* its update.
    receivers: ``[K]`` bool, the clients receiving this downlink.

  Returns:
    ``(updates [K], stale [K])`` int32: entries to send (index + label) and
    entries to delete (index only), zero for non-receivers.
  """
  held = client_stamp[:, indices]
  update = (server_stamp[None, :] >= 0) & (held != server_stamp[None, :])
  stale = (server_stamp[None, :] < 0) & (held >= 0)
  r = receivers[:, None]
  return (jnp.sum(update & r, axis=1).astype(jnp.int32),
          jnp.sum(stale & r, axis=1).astype(jnp.int32))


@functools.partial(jax.jit, donate_argnums=(0,))
def sync_clients(client_stamp: Array, indices: Array, server_stamp: Array,
                 receivers: Array) -> Array:
  """After catch-up and signals, receivers hold the server's entries of ``I^t``."""
  held = client_stamp[:, indices]
  new = jnp.where(receivers[:, None], server_stamp[None, :], held)
  return client_stamp.at[:, indices].set(new)


def signal_counts(signals: Array) -> dict[str, Array]:
  """``{'newly_cached': .., 'cached': .., 'expired': .., 'absent': ..}``: int32 device scalars
  (no host read; ``int()`` one to read it)."""
  counts = jnp.bincount(signals, length=len(SIGNAL_NAMES))
  return dict(zip(SIGNAL_NAMES, counts))
