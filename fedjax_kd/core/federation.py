"""The federation: client cohorts and their kernels over the device-resident data.

The data (:class:`fedjax_kd.data.federated.FederatedData`) lives on device once; clients
hold index tables into one shared private array (``client_idx[k, :client_n[k]]``),
never copies. Clients are grouped into
cohorts by model spec (``'cnn@0.5'``, ``'resnet20@1.0'``, ...); each cohort's
state is one stacked pytree and every phase is one compiled call per cohort.
Results of all cohorts are put back in client order so that aggregation ops
see a single ``[K, ...]`` array and never know about cohorts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd.core import rng
from fedjax_kd.core import store as store_lib
from fedjax_kd.core.kernels import CohortKernels, client_mesh
from fedjax_kd.core.program import Program, Ran, Rows
from fedjax_kd.core.state import ModelState, wrong_rows
from fedjax_kd.data.federated import FederatedData
from fedjax_kd.data.inputs import Normalize

Array = jax.Array


@jax.jit
def join_rows(idx: Array, n: Array, extra: Array, extra_n: Array) -> tuple[Array, Array]:
  """Per-client row tables ``idx[k, :n[k]] ++ extra[k, :extra_n[k]]`` ``[K, n_max + s_max]``
  and their counts (each client's own rows, then its extra ones)."""
  n_max = idx.shape[1]
  pos = jnp.broadcast_to(jnp.arange(n_max + extra.shape[1], dtype=jnp.int32),
                         (idx.shape[0], n_max + extra.shape[1]))
  own = jnp.take_along_axis(idx, jnp.minimum(pos, n_max - 1), axis=1)
  add = jnp.take_along_axis(extra, jnp.clip(pos - n[:, None], 0, extra.shape[1] - 1), axis=1)
  return jnp.where(pos < n[:, None], own, add), n + extra_n


def _device_only(states, phase: str) -> None:
  if any(store_lib.is_host(s) for s in states):
    raise ValueError(f'{phase}: host-resident client states train on a round view '
                     '(Federation.round_view + ClientStore.gather), not in place')


# ---------------------------------------------------------------- cohorts
@dataclasses.dataclass(frozen=True, eq=False)
class Cohort:
  """Clients sharing one model spec; ``client_ids`` are global ids, ascending."""
  spec: str
  client_ids: np.ndarray
  kernels: CohortKernels

  @property
  def size(self) -> int:
    return int(self.client_ids.shape[0])


def bucket(count: int, size: int, multiple: int) -> int:
  """Slot count for ``count`` active clients of a cohort of ``size``.

  The full cohort uses exactly ``size`` (rounded up to the device multiple);
  a subset uses the next power of two, so at most log2(size) shapes compile.
  """
  if count >= size:
    s = size
  else:
    s = 1
    while s < count:
      s *= 2
    s = min(s, size)
  return -(-s // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class RoundView:
  """A round's participants as a compact federation of their own.

  Attributes:
    fed: a :class:`Federation` over clients ``ids`` only (sorted global ids,
      padded per cohort to a fixed slot bucket with inactive clients).
    ids: ``[S]`` global client ids of the view's clients.
    active: ``[S]`` bool, which of them participate (the rest is padding).
    cohort_rows: for each cohort of ``fed``, ``(parent cohort index, [S_c] rows
      of that parent cohort)``.
  """
  fed: 'Federation'
  ids: np.ndarray
  active: np.ndarray
  cohort_rows: tuple


class Federation:
  """Runs phases over all clients, cohort by cohort, in client order.

  Args:
    data: the device-resident data.
    client_models: model spec of each client (length K).
    modules: spec -> Flax module.
    optimizers: optimizer slot name -> optax transformation (shared by all).
    use_mesh: shard each cohort's slot axis over all local devices.
    store: where client states live between rounds: ``None`` (device-resident
      stacked states) or a :class:`fedjax_kd.core.store.ClientStore` (host
      memory or disk; rounds then run on a :meth:`round_view` of the
      participants and only their rows travel to the device).
    compute_dtype: forward-pass dtype of the kernels, see `CohortKernels`.
    client_chunk: how many clients each device runs at once in every per-client phase
      (training, prediction, evaluation, per-client maps), in a ``lax.map`` over chunks
      inside one program (:func:`fedjax_kd.core.kernels.in_chunks`); ``None``: all of a
      cohort's slots at once. Memory for time: a step holds one chunk's activations. The
      attribute of the same name may be set before the first phase runs (the memory planner
      chooses it once the experiment is built, :func:`fedjax_kd.running.memory.choose`).
  """

  def __init__(self, data: FederatedData, client_models: Sequence[str],
               modules: dict[str, Any], optimizers: dict[str, optax.GradientTransformation],
               use_mesh: bool = True, store: Any = None, compute_dtype: str = 'float32',
               client_chunk: int | None = None):
    mesh = client_mesh() if use_mesh else None
    specs = sorted(set(client_models), key=tuple(client_models).index)
    kernels = {s: CohortKernels(modules[s], optimizers, mesh, compute_dtype,
                                normalize=data.normalize) for s in specs}
    scatter = jax.jit(lambda full, ids, vals: full.at[ids].set(vals, mode='drop'))
    k = len(client_models)
    self._setup(data, client_models, kernels, optimizers, mesh, store, scatter,
                np.arange(k, dtype=np.int32), k, client_chunk)

  def _setup(self, data: FederatedData, client_models: Sequence[str],
             kernels: dict[str, CohortKernels], optimizers, mesh, store, scatter,
             global_ids: np.ndarray, population: int, client_chunk: int | None = None) -> None:
    """Every attribute of a federation; clients are grouped into cohorts by spec.

    Cohorts come in order of first appearance of each spec. ``global_ids`` are
    the experiment's ids of these clients (a view's clients are a subset) and
    ``population`` is K, the experiment's client count.
    """
    if client_chunk is not None and int(client_chunk) < 1:
      raise ValueError(f'client_chunk must be a positive number of clients, got {client_chunk}')
    self.data = data
    self.client_chunk = None if client_chunk is None else int(client_chunk)
    self.client_models = tuple(client_models)
    self.mesh = mesh
    self.multiple = 1 if mesh is None else mesh.size
    self.optimizers = optimizers
    self.store = store
    self._scatter = scatter
    specs = sorted(set(self.client_models), key=self.client_models.index)
    ids = np.asarray(self.client_models)
    self.cohorts = [Cohort(s, np.flatnonzero(ids == s).astype(np.int32), kernels[s])
                    for s in specs]
    self.global_ids = np.asarray(global_ids, np.int32)
    self.population = int(population)
    self._cohort_of = np.zeros(len(self.client_models), np.int32)
    self._row_of = np.zeros(len(self.client_models), np.int32)
    for c, cohort in enumerate(self.cohorts):
      self._cohort_of[cohort.client_ids] = c
      self._row_of[cohort.client_ids] = np.arange(cohort.size)

  def _key_ids(self, gids: np.ndarray) -> np.ndarray:
    """Global client ids of slots ``gids`` (padding slots map to the last client)."""
    return self.global_ids[np.minimum(gids, self.num_clients - 1)]

  def round_view(self, active: np.ndarray) -> RoundView:
    """The participants of a round as a federation of their own (see :class:`RoundView`).

    Each cohort's participants are padded, with non-participating clients of
    the same cohort, to the slot bucket the device-resident engine would use,
    so a view of any cohort of the same size reuses the compiled kernels.
    """
    active = self._active(active)
    pos, act, cohort_rows = [], [], []
    for c, cohort in enumerate(self.cohorts):
      rows = np.flatnonzero(active[cohort.client_ids])
      if not len(rows):
        continue
      s = bucket(len(rows), cohort.size, self.multiple)
      rest = np.flatnonzero(~active[cohort.client_ids])[:s - len(rows)]
      pad = np.full(s - len(rows) - len(rest), rows[-1])
      cohort_rows.append((c, np.concatenate([rows, rest, pad]).astype(np.int32)))
      pos.append(cohort.client_ids[cohort_rows[-1][1]])
      act.append(np.arange(s) < len(rows))
    pos_all, act_all = np.concatenate(pos), np.concatenate(act)
    order = np.argsort(pos_all, kind='stable')   # client order, as the full engine sees it
    pos_all, act_all = pos_all[order], act_all[order]
    view = Federation.__new__(Federation)
    view._setup(self.data.subset(pos_all), [self.client_models[i] for i in pos_all],
                {c.spec: c.kernels for c in self.cohorts}, self.optimizers, self.mesh,
                None, self._scatter, self.global_ids[pos_all], self.population,
                self.client_chunk)
    # The view's cohorts come in the parent's cohort order; rows follow the sorted ids.
    rows_by_cohort = []
    for vc in view.cohorts:
      parent = next(i for i, c in enumerate(self.cohorts) if c.spec == vc.spec)
      rows_by_cohort.append((parent, self._row_of[pos_all[vc.client_ids]]))
    return RoundView(fed=view, ids=self.global_ids[pos_all], active=act_all,
                     cohort_rows=tuple(rows_by_cohort))

  @property
  def num_clients(self) -> int:
    return len(self.client_models)

  # ------------------------------------------------------------ helpers
  def _active(self, active: np.ndarray | None) -> np.ndarray:
    if active is None:
      return np.ones(self.num_clients, bool)
    active = np.asarray(active, bool)
    if active.shape != (self.num_clients,):
      raise ValueError(f'active mask has shape {active.shape}, expected ({self.num_clients},)')
    return active

  def plan(self, cohort: Cohort, active: np.ndarray):
    """Slots for the active clients of ``cohort``.

    Returns:
      ``(slots [S] int32 cohort rows, valid [S] bool, global_ids [S] int32)``;
      padding slots have an out-of-range row and global id ``K``.
    """
    rows = np.flatnonzero(active[cohort.client_ids]).astype(np.int32)
    s = bucket(len(rows), cohort.size, self.multiple)
    slots = np.full(s, cohort.size, np.int32)
    slots[:len(rows)] = rows
    valid = np.zeros(s, bool)
    valid[:len(rows)] = True
    gids = np.full(s, self.num_clients, np.int32)
    gids[:len(rows)] = cohort.client_ids[rows]
    return slots, valid, gids

  def check_rows(self, name: str, tree: Any) -> None:
    """Raises ValueError unless every leaf of ``tree`` has one row per client of this federation.

    Per-client inputs are gathered by slot with clipping, so a table of the
    wrong length would silently give clients other clients' rows. The usual
    cause is a per-client array kept outside the algorithm's client table: a
    round with a client store sees only its participants' rows of the table.
    """
    bad = wrong_rows(tree, self.num_clients)
    if bad is not None:
      raise ValueError(
          f'{name}{bad[0]} has shape {bad[1]}, but this round has '
          f'{self.num_clients} clients (of {self.population}): per-client arrays must come '
          'from the round (state.table, Round.active, fed.data), whose rows are the '
          "round's clients; keep them in the algorithm's client table, not in server state")

  # -------------------------------------------------------- cohort loop
  def _each_cohort(self, states, active: np.ndarray | None, read_only: bool = False):
    """The one loop over cohorts every phase runs: what to call each kernel on.

    Yields ``(c, kernels, state, slots, valid, gids, rows)`` for each cohort
    ``c`` with active clients: the state piece and ``[S]`` slots to run on,
    which slots are real, their global slot ids (``K`` for padding) and a
    function ``rows(a)`` that gathers the slots' rows of a per-client ``[K, ...]``
    array. A read-only phase on host-resident clients visits the cohort
    ``store.chunk`` clients at a time (see :meth:`_batches`); otherwise the
    cohort is one piece.
    """
    active = self._active(active)
    for c, (cohort, state) in enumerate(zip(self.cohorts, states)):
      if read_only:
        pieces = self._batches(cohort, state, active)
      else:
        slots, valid, gids = self.plan(cohort, active)
        pieces = [(state, jnp.asarray(slots), valid, gids)] if valid.any() else []
      for st, slots, valid, gids in pieces:
        g = jnp.asarray(gids)
        rows = lambda a, g=g: jnp.take(a, g, axis=0, mode='clip')
        yield c, cohort.kernels, st, slots, valid, gids, rows

  def _chunk(self, slots: Array) -> int | None:
    """The client chunk of a phase over ``slots``: ``client_chunk`` where it is smaller than
    the slots each device runs, else None (all at once: the same program as no chunking)."""
    per_device = -(-int(slots.shape[0]) // self.multiple)
    if self.client_chunk is None or self.client_chunk >= per_device:
      return None
    return self.client_chunk

  def _put(self, full: Any, valid: np.ndarray, gids: np.ndarray, vals: Any) -> Any:
    """``full`` (leaves ``[K, ...]``) with the real slots' rows set to ``vals``."""
    w = jnp.asarray(np.where(valid, gids, self.num_clients))
    return jax.tree.map(lambda f, v: self._scatter(f, w, v), full, vals)

  def _batches(self, cohort: Cohort, state: ModelState, active: np.ndarray):
    """``(state, slots, valid, gids)`` pieces to run a read-only kernel on.

    A device-resident cohort (or one in host arrays of a federation without a store: they
    go to the device with the call) is one piece (its full state and the slots of
    `plan`). A host-resident cohort is visited ``store.chunk`` clients at a
    time: only those rows are copied to the device, as a compact state whose
    slots are ``0..chunk-1``.
    """
    slots, valid, gids = self.plan(cohort, active)
    if not valid.any():
      return
    if self.store is None or not store_lib.is_host(state):
      yield state, jnp.asarray(slots), valid, gids
      return
    rows = slots[valid]
    e = min(bucket(len(rows), cohort.size, self.multiple),
            -(-self.store.chunk // self.multiple) * self.multiple)
    for lo in range(0, len(rows), e):
      part = rows[lo:lo + e]
      ok = np.arange(e) < len(part)
      prow = np.concatenate([part, np.full(e - len(part), part[-1])]).astype(np.int32)
      yield (self.store.take(state, prow), jnp.arange(e, dtype=jnp.int32), ok,
             np.where(ok, cohort.client_ids[prow], self.num_clients).astype(np.int32))

  # --------------------------------------------------------------- init
  def init(self, root: Array, shared_key: Array | None = None) -> tuple[ModelState, ...]:
    """Initial states, one per cohort.

    Args:
      root: the run's root key; client ``k`` initialises from ``(root, 0, k, 'init')``
        (independent inits that depend on the client id only).
      shared_key: instead, one key for every client: all clients of one model spec start
        from the same weights (and from the weights of any other model built from it).
    """
    states = []
    for cohort in self.cohorts:
      ids = self.global_ids[cohort.client_ids]

      def keys(rows, ids=ids):
        if shared_key is None:
          return rng.client_keys(root, 0, ids[rows], 'init')
        return jnp.broadcast_to(shared_key, (len(rows),) + shared_key.shape)

      make = lambda rows, keys=keys, k=cohort.kernels: k.init(
          keys(rows), self.data.input_shape, self.data.model_input_dtype)
      if self.store is None:
        states.append(make(np.arange(cohort.size)))
      else:   # built chunk by chunk straight into host memory (or disk)
        states.append(self.store.init_rows(cohort.size, make))
    return tuple(states)

  # ---------------------------------------------------------------- run
  def run(self, program: Program, states: Sequence[ModelState], root: Array, t: int,
          phase: str, *, data: Rows | None = None, row: Any = None, shared: Any = None,
          active=None, epochs=None, fill: Any = None) -> Ran:
    """Runs a client program for the active clients of every cohort: the engine's one entry
    for per-client work (:mod:`fedjax_kd.core.program`).

    Each cohort's active clients run at once in one compiled program (in chunks of
    ``client_chunk``, sharded over the mesh), with keys from ``(root, t, client, phase)``.

    Args:
      program: the client program.
      states: one ModelState per cohort (donated when the program writes).
      root, t, phase: key derivation.
      data: the rows its batches are drawn from (:class:`~fedjax_kd.core.program.Rows`):
        ``idx`` ``[K, n_max]`` per client or ``[n_max]`` shared, ``n`` ``[K]``.
      row: pytree of per-client inputs, leading axis ``K`` (gathered per cohort).
      shared: pytree every client sees.
      active: ``[K]`` bool mask (default all).
      epochs: ``[K]`` epoch budgets (stragglers; default all of the program's epochs).
      fill: pytree of ``[K, ...]`` outputs for the clients that do not run (default zeros).

    Returns:
      A :class:`~fedjax_kd.core.program.Ran`: the new states, the outputs ``[K, ...]`` and
      each client's mean step metrics ``[K]`` (NaN where it did not run): device arrays,
      nothing is read to the host here (a round reads its metrics once, at its end).
    """
    self.check_rows('row', row)
    self.check_rows('fill', fill)
    if epochs is not None:
      epochs = jnp.asarray(epochs, jnp.int32)
      self.check_rows('epochs', epochs)
    if program.writes:
      _device_only(states, type(program).__name__)
    out, metrics, states = fill, None, list(states)
    for c, kernels, state, slots, valid, gids, rows in self._each_cohort(
        states, active, read_only=not program.writes):
      keys = rng.client_keys(root, t, self._key_ids(gids), phase)
      cdata = None
      if data is not None:
        idx = jnp.asarray(data.idx)
        cdata = Rows(data.arrays, idx if idx.ndim == 1 else rows(idx),
                     rows(jnp.asarray(data.n, jnp.int32)))
      new, o, m = kernels.run(program, state, slots, jnp.asarray(valid), keys, cdata,
                              jax.tree.map(rows, row), shared,
                              None if epochs is None else rows(epochs),
                              client_chunk=self._chunk(slots))
      if program.writes:
        states[c] = new
      if o is not None:
        if out is None:
          out = jax.tree.map(lambda a: jnp.zeros((self.num_clients,) + a.shape[1:], a.dtype), o)
        out = self._put(out, valid, gids, o)
      if m is not None:
        if metrics is None:
          metrics = jax.tree.map(lambda a: jnp.full((self.num_clients,), jnp.nan, a.dtype), m)
        metrics = self._put(metrics, valid, gids, m)
    return Ran(tuple(states), out, metrics)

  # ------------------------------------------------------------ predict
  def predict(self, states, x: Array, active=None, *, chunk: int = 512,
              log: bool = False, augment: Callable | None = None, root: Array | None = None,
              t: int = 0) -> Array:
    """``[K, m, C]`` client probabilities on ``x``; zero rows for inactive clients.

    ``augment`` transforms each client's copy of ``x`` with its own key from
    ``(root, t, client, 'predict')``.
    """
    full = jnp.zeros((self.num_clients, x.shape[0], self.data.num_classes), jnp.float32)
    for _, kernels, st, slots, valid, gids, _ in self._each_cohort(states, active, True):
      keys = None
      if augment is not None:
        keys = rng.client_keys(root, t, self._key_ids(gids), 'predict')
      probs = kernels.predict(st, slots, x, chunk=chunk, log=log, keys=keys, augment=augment,
                              client_chunk=self._chunk(slots))
      full = self._put(full, valid, gids, probs)
    return full

  def class_mean_probs(self, states, active=None, *, chunk: int = 512):
    """Per-label mean probabilities on each client's private data (FD eq. 4).

    Returns:
      ``means [K, C, C]`` (row n: mean prediction over the client's samples of
      class n; zero if it has none) and ``counts [K, C]``; zeros for inactive.
    """
    d = self.data
    c = d.num_classes
    sums = jnp.zeros((self.num_clients, c, c), jnp.float32)
    counts = jnp.zeros((self.num_clients, c), jnp.float32)
    n_all = jnp.asarray(d.client_n)
    for _, kernels, st, slots, valid, gids, rows in self._each_cohort(states, active, True):
      s, n = kernels.class_prob_sums(st, slots, d.x_private, d.y_private, rows(d.client_idx),
                                     rows(n_all), c, chunk=chunk,
                                     client_chunk=self._chunk(slots))
      sums, counts = self._put((sums, counts), valid, gids, (s, n))
    means = sums / jnp.maximum(counts, 1.0)[:, :, None]
    return means, counts

  # ----------------------------------------------------------- evaluate
  def evaluate(self, states, *, per_client_test: bool = False, active=None,
               chunk: int = 512, split: str = 'test', read: bool = True,
               models: Sequence[ModelState] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and loss of every client model ``[K]`` (NaN if inactive).

    ``split='test'``: ``per_client_test`` uses each client's own test split
    (``data.test_idx``); otherwise every client is scored on the full server
    test set. ``split='val'``: each client's validation rows of the private
    data (``data.val_idx``, from ``data.val_fraction``). ``split='train'``: each
    client's own training rows (Power-of-Choice's local loss). ``read=False`` leaves
    both on the device (the caller reads them with others). ``models``: one model per
    cohort (a ModelState with a leading axis of 1, of the cohort's spec) that each of its
    clients scores on its rows instead of its own (a global model on every client's data).
    """
    d = self.data
    if split == 'train':
      rows = (d.x_private, d.y_private, d.client_idx, d.client_n)
    elif split == 'val':
      if d.val_idx is None:
        raise ValueError("split='val' needs per-client validation rows (data.val_fraction > 0)")
      rows = (d.x_private, d.y_private, d.val_idx, d.val_n)
    elif split != 'test':
      raise ValueError(f"split={split!r}: expected 'test', 'val' or 'train'")
    elif per_client_test:
      rows = (d.x_test, d.y_test, d.test_idx, d.test_n)
    else:
      rows = (d.x_test, d.y_test, None, None)
    acc, nll = self._evaluate(states, *rows, active, chunk, models)
    if not read:
      return acc, nll
    acc, nll = jax.device_get((acc, nll))   # one read for both
    return np.asarray(acc), np.asarray(nll)

  def evaluate_shared(self, states, x: Array, y: Array, *, active=None,
                      chunk: int = 512, read: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and loss ``[K]`` of every client model on one labelled set ``(x, y)``
    (``read=False``: left on the device)."""
    acc, nll = self._evaluate(states, x, y, None, None, active, chunk)
    if not read:
      return acc, nll
    acc, nll = jax.device_get((acc, nll))
    return np.asarray(acc), np.asarray(nll)

  def _evaluate(self, states, x, y, idx, n, active, chunk, models=None):
    acc = jnp.full((self.num_clients,), jnp.nan, jnp.float32)
    nll = jnp.full((self.num_clients,), jnp.nan, jnp.float32)
    for c, kernels, st, slots, valid, gids, rows in self._each_cohort(states, active, True):
      if models is not None:   # every slot reads the cohort's one model
        st, slots = models[c], jnp.zeros_like(slots)
      if idx is not None:
        a, l, _ = kernels.evaluate(st, slots, x, y, rows(idx), rows(jnp.asarray(n)),
                                   chunk=chunk, client_chunk=self._chunk(slots))
      else:
        a, l, _ = kernels.evaluate(st, slots, x, y, chunk=chunk,
                                   client_chunk=self._chunk(slots))
      acc, nll = self._put((acc, nll), valid, gids, (a, l))
    return acc, nll


class SingleModel:
  """A lone model (e.g. DS-FL's server model w_g) run with the same kernels."""

  def __init__(self, module, optimizers: dict[str, optax.GradientTransformation],
               input_shape: tuple[int, ...], compute_dtype: str = 'float32',
               normalize: Normalize | None = None, input_dtype: str = 'float32'):
    self.kernels = CohortKernels(module, optimizers, mesh=None, compute_dtype=compute_dtype,
                                 normalize=normalize)
    self.input_shape = tuple(input_shape)
    self.input_dtype = input_dtype
    self._slots = jnp.zeros((1,), jnp.int32)
    self._valid = jnp.ones((1,), bool)

  def init(self, key: Array) -> ModelState:
    return self.kernels.init(key[None], self.input_shape, self.input_dtype)

  def run(self, program: Program, state: ModelState, key: Array, *, data: Rows | None = None,
          row: Any = None, shared: Any = None) -> Ran:
    """Runs a client program on the lone model (the engine's kernel with one slot).

    ``data.idx`` is ``[n_max]`` (the rows it trains on) and ``data.n`` its real count (host
    or device); ``row`` holds one model's inputs (no leading axis).

    Returns:
      A :class:`~fedjax_kd.core.program.Ran` whose ``states`` is the new model state and
      whose outputs and metrics are the model's own (no leading axis).
    """
    if data is not None:
      data = Rows(data.arrays, data.idx, jnp.reshape(jnp.asarray(data.n, jnp.int32), (1,)))
    one = lambda tree: jax.tree.map(lambda a: jnp.asarray(a)[None], tree)
    new, out, metrics = self.kernels.run(program, state, self._slots, self._valid, key[None],
                                         data, one(row), shared)
    first = lambda tree: jax.tree.map(lambda a: a[0], tree)
    return Ran(new, first(out), first(metrics))

  def evaluate(self, state, x, y, chunk: int = 512,
               read: bool = True) -> tuple[float, float, float]:
    """Top-1 accuracy, mean cross-entropy and top-5 accuracy on ``(x, y)``: Python floats,
    read in one transfer, or (``read=False``) float32 device scalars."""
    a, l, a5 = self.kernels.evaluate(state, self._slots, x, y, chunk=chunk)
    if not read:
      return a[0], l[0], a5[0]
    a, l, a5 = jax.device_get((a[0], l[0], a5[0]))
    return float(a), float(l), float(a5)

  def predict(self, state, x, chunk: int = 512) -> Array:
    return self.kernels.predict(state, self._slots, x, chunk=chunk)[0]
