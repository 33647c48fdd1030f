"""FedCache 2.0's server knowledge cache of distilled samples, as device arrays.

Q. Pan, S. Sun, Z. Wu, Y. Wang, M. Liu, B. Gao, J. Wang, "FedCache 2.0:
Federated Edge Learning with Knowledge Caching and Dataset Distillation",
arXiv 2405.13378.

The server keeps, for each of ``K`` clients, the client's latest distilled set
``D_b^k`` (Eq. 13: ``KC[client, k] <- D_b^k``). Each client owns
``S = C * ipc`` slots (``ipc`` synthetic samples per class); slot ``s`` always
holds class ``slot_class[s] = s // ipc`` (:func:`slot_classes`). A slot is
``valid`` once it has been written with a real sample; ``stamp`` is the round
it was written (``-1`` = never) and ``nbytes`` its encoded size, used for the
communication accounting (see :mod:`fedjax_kd.ops.codec`).

Device-centric sampling (Eq. 17): client ``k`` with local label frequencies
``p^k`` (summing to 1) downloads, for every class ``c``, a fraction

    q_c = tau + (1 - tau) * p_c^k,        tau in [0, 1]

of the cached class-``c`` items ``S_c`` (``tau = 1`` downloads everything,
``tau = 0`` a fraction ``p_c``). :func:`sample` implements three readings:

  * ``'count'`` (default, ``q_c`` read as a fraction): ``n_c = floor(q_c |S_c| + u_c)``
    with ``u_c ~ U[0, 1)`` (stochastic rounding, ``E[n_c] = q_c |S_c|``),
    drawn uniformly without replacement among the valid class-``c`` items.
  * ``'bernoulli'``: each valid class-``c`` item is kept independently with
    probability ``q_c``.
  * ``'repo'``: the authors' released code
    (``Server.get_distilled_data_by_distribution``): with
    ``m = min_c |S_c|`` and ``n_c = floor(m q_c / max_c' q_c')``, ``n_c``
    random class-``c`` items are taken (so the normalisation of ``q`` does not
    matter). The repository takes the minimum over *all* bincount entries,
    which is 0 -- and downloads nothing -- as soon as an intermediate class is
    empty; here the minimum is taken over the non-empty classes only.

Every function is pure and jit/vmap friendly; there are no Python loops over
items. Uniform draws without replacement rank the items in a random order
grouped by class -- one lexicographic sort on ``(class, random uint32)`` with
invalid items given class ``C`` (the same as sorting the keys
``2 * class + U[0, 1)`` with ``+inf`` for invalid items, without float32
precision loss for many classes) -- and select the items whose rank within
their class, global rank minus the number of valid items of lower classes, is
below ``n_c``. Ties between random keys (probability ~ ``n^2 / 2^33``) are
broken by position.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

NEVER = -1
MODES = ('count', 'bernoulli', 'repo')


@flax.struct.dataclass
class KnowledgeCache:
  """The server's cache of every client's distilled samples.

  Attributes:
    x: ``f32[K, S, *input_shape]`` each sample as received by clients (i.e.
      after the codec round trip).
    valid: ``bool[K, S]`` slots holding a sample.
    stamp: ``i32[K, S]`` round each slot was written, ``NEVER`` (-1) if none.
    nbytes: ``f32[K, S]`` encoded size of each item in bytes.
  """
  x: Array
  valid: Array
  stamp: Array
  nbytes: Array


def empty_cache(num_clients: int, slots: int,
                input_shape: tuple[int, ...]) -> KnowledgeCache:
  """An empty cache of ``num_clients`` rows with ``slots`` slots each.

  Args:
    num_clients: ``K``.
    slots: ``S = C * ipc``.
    input_shape: shape of one sample, e.g. ``(32, 32, 3)``.

  Returns:
    A :class:`KnowledgeCache` with zero samples, no valid slot and stamps -1.
  """
  k, s = num_clients, slots
  return KnowledgeCache(x=jnp.zeros((k, s, *input_shape), jnp.float32),
                        valid=jnp.zeros((k, s), bool),
                        stamp=jnp.full((k, s), NEVER, jnp.int32),
                        nbytes=jnp.zeros((k, s), jnp.float32))


def slot_classes(num_classes: int, ipc: int) -> np.ndarray:
  """Class of each slot: ``int32 [C * ipc] = arange(C * ipc) // ipc``."""
  return (np.arange(num_classes * ipc) // ipc).astype(np.int32)


@jax.jit
def write(cache: KnowledgeCache, x: Array, valid: Array, nbytes: Array,
          writers: Array, t: int | Array, rows: Array | None = None) -> KnowledgeCache:
  """Eq. 13, ``KC[client, k] <- D_b^k``, for the clients that uploaded.

  Args:
    cache: the cache before the round.
    x: ``[M, S, *input_shape]`` new rows (only writer rows are read).
    valid: ``bool[M, S]`` which new slots hold a sample.
    nbytes: ``[M, S]`` encoded sizes of the new items.
    writers: ``bool[M]`` clients whose whole row is replaced.
    t: the round (stamp of the written valid slots).
    rows: ``int[M]`` cache row of each of the M clients (default ``0..M-1``,
      i.e. all K clients in order); a round view passes its clients' global ids.

  Returns:
    The new cache: writer rows replaced entirely (``x``, ``valid``,
    ``nbytes``, and ``stamp = t`` where valid else -1); other rows unchanged.
  """
  k = cache.x.shape[0]
  if rows is None:
    rows = jnp.arange(x.shape[0], dtype=jnp.int32)
  dest = jnp.where(jnp.asarray(writers, bool), rows, k)   # non-writers are dropped
  valid = jnp.asarray(valid, bool)
  new_stamp = jnp.where(valid, jnp.asarray(t, jnp.int32), NEVER)
  put = lambda a, v: a.at[dest].set(jnp.asarray(v, a.dtype), mode='drop')
  return KnowledgeCache(x=put(cache.x, x), valid=put(cache.valid, valid),
                        stamp=put(cache.stamp, new_stamp),
                        nbytes=put(cache.nbytes, nbytes))


def class_sizes(valid: Array, slot_class: Array, num_classes: int) -> Array:
  """``|S_c|``: number of valid items of each class over all clients.

  Args:
    valid: ``bool[..., S]`` (typically ``[K, S]``).
    slot_class: ``int[S]`` class of each slot.
    num_classes: ``C``.

  Returns:
    ``i32[C]``.
  """
  valid = jnp.asarray(valid)
  per_slot = valid.reshape(-1, valid.shape[-1]).astype(jnp.int32).sum(0)
  return jnp.zeros((num_classes,), jnp.int32).at[jnp.asarray(slot_class)].add(per_slot)


def _available(valid: Array, exclude_row: Array | int | None) -> Array:
  valid = jnp.asarray(valid, bool)
  if exclude_row is None:
    return valid
  rows = jnp.arange(valid.shape[0])
  return valid & (rows != jnp.asarray(exclude_row))[:, None]


def _fractions(p: Array, tau: float | Array) -> Array:
  tau = jnp.asarray(tau, jnp.float32)
  return tau + (1.0 - tau) * jnp.asarray(p, jnp.float32)


def expected_download(valid: Array, slot_class: Array, p: Array, tau: float | Array,
                      exclude_row: Array | int | None = None) -> Array:
  """Expected per-class download ``q_c * |S_c|`` of the ``'count'`` mode.

  Args:
    valid: ``bool[K, S]``.
    slot_class: ``int[S]``.
    p: ``[C]`` the client's label frequencies.
    tau: the mixing weight of Eq. 17.
    exclude_row: optional client row left out of the download.

  Returns:
    ``f32[C]``.
  """
  avail = _available(valid, exclude_row)
  sizes = class_sizes(avail, slot_class, p.shape[-1])
  return _fractions(p, tau) * sizes.astype(jnp.float32)


def _rank_within_class(key: Array, avail: Array, cls: Array, num_classes: int,
                       sizes: Array) -> Array:
  """A uniformly random rank ``0 .. |S_c|-1`` of each available item in its class."""
  n = avail.shape[0]
  bits = jax.random.bits(key, (n,), jnp.uint32)
  group = jnp.where(avail, cls, num_classes)          # invalid items sort last
  order = jnp.lexsort((bits, group))                  # by class, then random key
  rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  offset = jnp.cumsum(sizes) - sizes                   # valid items of lower classes
  return rank - offset[jnp.clip(cls, 0, num_classes - 1)]


def _cap(key: Array, selected: Array, cap: int) -> Array:
  """Keeps a uniformly random subset of ``cap`` selected items (all if fewer)."""
  n = selected.shape[0]
  bits = jax.random.bits(key, (n,), jnp.uint32)
  order = jnp.lexsort((bits, ~selected))              # selected first, random order
  rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
  return selected & (rank < cap)


@functools.partial(jax.jit, static_argnames=('mode', 'cap'))
def sample(key: Array, valid: Array, slot_class: Array, p: Array, tau: float | Array, *,
           mode: str = 'count', cap: int = 0,
           exclude_row: Array | int | None = None) -> Array:
  """Device-centric sampling of Eq. 17 for one client.

  Args:
    key: PRNG key.
    valid: ``bool[K, S]`` cache validity.
    slot_class: ``int[S]`` class of each slot.
    p: ``[C]`` the client's local label frequencies (sum to 1).
    tau: mixing weight in ``[0, 1]``; ``q_c = tau + (1 - tau) p_c``.
    mode: ``'count'``, ``'bernoulli'`` or ``'repo'`` (see the module doc).
    cap: if positive and more than ``cap`` items are selected, a uniformly
      random subset of ``cap`` of them is kept (not the repository's
      truncation, which drops the high class ids); 0 = no cap.
    exclude_row: optional client row (the caller's own) left out of the
      download, before ``|S_c|`` is counted; -1 or ``K`` mean none. The paper
      and the authors' code do not exclude it.

  Returns:
    ``bool[K, S]``: the items downloaded (always a subset of ``valid``).

  Raises:
    ValueError: unknown ``mode`` (at trace time).
  """
  if mode not in MODES:
    raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
  avail2 = _available(valid, exclude_row)
  shape = avail2.shape
  num_classes = p.shape[-1]
  cls = jnp.broadcast_to(jnp.asarray(slot_class, jnp.int32), shape).reshape(-1)
  avail = avail2.reshape(-1)
  sizes = class_sizes(avail2, slot_class, num_classes)
  q = _fractions(p, tau)
  k_rank, k_round, k_cap = jax.random.split(key, 3)
  safe_cls = jnp.clip(cls, 0, num_classes - 1)

  if mode == 'bernoulli':
    u = jax.random.uniform(k_rank, (avail.shape[0],))
    selected = avail & (u < q[safe_cls])
  else:
    if mode == 'count':
      target = q * sizes.astype(jnp.float32)
      whole = jnp.floor(target)
      u = jax.random.uniform(k_round, (num_classes,))
      # floor(target + u) without the float32 rounding of ``target + u``.
      n = whole.astype(jnp.int32) + (u < target - whole).astype(jnp.int32)
    else:  # 'repo'
      nonempty = sizes > 0
      m = jnp.min(jnp.where(nonempty, sizes, jnp.iinfo(jnp.int32).max))
      m = jnp.where(jnp.any(nonempty), m, 0)
      ratio = q / jnp.max(q)
      # Small tolerance so exact ratios (e.g. 2 * 2/3 * 3/2) are not floored down.
      n = jnp.floor(m.astype(jnp.float32) * ratio + 1e-5).astype(jnp.int32)
    n = jnp.clip(n, 0, sizes)
    rank = _rank_within_class(k_rank, avail, cls, num_classes, sizes)
    selected = avail & (rank < n[safe_cls])

  if cap > 0:
    selected = _cap(k_cap, selected, cap)
  return selected.reshape(shape)


@functools.partial(jax.jit, static_argnames=('mode', 'cap'))
def sample_clients(keys: Array, valid: Array, slot_class: Array, p: Array,
                   tau: float | Array, *, mode: str = 'count', cap: int = 0,
                   exclude_rows: Array | None = None) -> Array:
  """:func:`sample` for ``M`` clients at once (vmapped).

  Args:
    keys: ``[M]`` PRNG keys (or raw ``uint32[M, 2]``).
    valid: ``bool[K, S]`` shared cache validity.
    slot_class: ``int[S]``.
    p: ``[M, C]`` each client's label frequencies.
    tau: mixing weight (shared).
    mode: see :func:`sample`.
    cap: see :func:`sample`.
    exclude_rows: optional ``int[M]`` row each client excludes (its own
      client id; -1 or ``K`` = none).

  Returns:
    ``bool[M, K, S]``.
  """
  if exclude_rows is None:
    fn = lambda k, pk: sample(k, valid, slot_class, pk, tau, mode=mode, cap=cap)
    return jax.vmap(fn)(keys, p)
  fn = lambda k, pk, r: sample(k, valid, slot_class, pk, tau, mode=mode, cap=cap,
                               exclude_row=r)
  return jax.vmap(fn)(keys, p, jnp.asarray(exclude_rows, jnp.int32))
