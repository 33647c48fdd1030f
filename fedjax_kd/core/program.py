"""Client programs: what one client does in a phase, as a value the engine runs.

A program is google/fedjax's ``for_each_client(client_init, client_step, client_final)``
written as one hashable value (a frozen dataclass, so it is a static argument of the
compiled kernel: equal programs share a compilation). For every client of a round the engine
(:meth:`fedjax_kd.core.federation.Federation.run`) calls

* ``init(c, row, shared)``: the loop's carry, from the client's stored model ``c.model``, its
  per-client inputs ``row`` and the inputs every client sees ``shared``;
* ``step(c, carry, batch, row, shared)``: one minibatch, ``(carry, metrics)``; the engine
  draws the batches the program's :attr:`Program.batches` names (Keras-style epochs over
  the client's rows, one random window, fresh random batches), gathers their rows,
  normalises and augments the inputs, and keeps the carry unchanged on a step without a real
  sample;
* ``final(c, carry, row, shared)``: ``(model, outputs)``: the client's new stored model
  (written back in place; ``None`` for a program that only reads, :attr:`Program.writes`)
  and what it uploads or reports (rows of ``[K, ...]`` arrays for the algorithm).

The engine owns everything around those three calls, for every algorithm alike: the
cohorts of heterogeneous widths, the slots of a round's participants, ``clients.chunk``
(clients in chunks inside one program), the device mesh, the client store, the keys by
client id, the epoch budgets of stragglers, donation of the cohort's state, and the memory
plan (the planner compiles the same programs, :mod:`fedjax_kd.running.memory`). An algorithm module
writes its paper's math in a program and never walks clients, minibatches or slots.

Programs compose like optax transforms: :class:`SGD` is local training on a loss, and
:func:`chain` adds :class:`Transform` s to it: a term of the loss (FedProx's proximal term,
:class:`Penalty`), a change of the optimizer's updates (the round's learning-rate factor,
:class:`LRScale`), a step after the update (SCAFFOLD's control variates,
:class:`Correction`). A step that is not SGD on a loss (pFedMe's inner solve, Per-FedAvg's
meta step, FedKD's mentor and mentee, a KRR distillation of inputs) is a program of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_kd.core.state import ModelState
from fedjax_kd.ops import losses

Array = jax.Array
# loss_fn(logits [B, C], batch: dict of gathered arrays, row: the client's row) -> [B]
LossFn = Callable[[Array, dict, Any], Array]

ORDERS = ('shuffle', 'window', 'random')


# ------------------------------------------------------------------ batches
@dataclasses.dataclass(frozen=True)
class Batches:
  """The minibatches a program's step iterates (hashable: part of the program).

  Attributes:
    epochs: passes over the client's rows (the compiled maximum; a client's epoch budget,
      a straggler's, cuts it).
    batch_size: rows a batch.
    order: ``'shuffle'``: Keras' ``fit`` (reshuffled every epoch, the partial last batch
      kept); ``'window'``: one contiguous window of ``percent`` % of the rows at a random
      offset, in order, the same every epoch (FedALA); ``'random'``: every step a fresh
      batch of distinct rows drawn uniformly, ``steps`` steps (Per-FedAvg's adaptation).
    steps: only the first ``steps`` steps (None: all of the epochs').
    percent: the window's share of the rows (``'window'``).
    augment: ``augment(key, x) -> x`` of every batch's inputs (None: none).
    until: the program decides after every epoch whether another one runs
      (:meth:`Program.more`); ``epochs`` bounds them.
  """
  epochs: int = 1
  batch_size: int = 1
  order: str = 'shuffle'
  steps: int | None = None
  percent: int = 100
  augment: Callable | None = None
  until: bool = False

  def __post_init__(self):
    if self.order not in ORDERS:
      raise ValueError(f'order={self.order!r}: expected one of {ORDERS}')
    if self.order == 'random' and self.steps is None:
      raise ValueError("order='random' draws `steps` batches: give steps")
    if self.until != (self.order == 'window'):
      raise ValueError("until (epochs the program stops) goes with order='window', and only")


class Rows(NamedTuple):
  """The rows a program's batches are drawn from.

  Attributes:
    arrays: name -> array with a leading sample axis, the same for every client (``'x'``
      holds stored inputs, mapped to model inputs where a batch is gathered).
    idx: ``[K, n_max]`` each client's rows of ``arrays`` (padded), or ``[n_max]`` rows
      every client shares.
    n: ``[K]`` real rows per client (host or device ints).
  """
  arrays: dict
  idx: Any
  n: Any


class Batch(NamedTuple):
  """One minibatch as a program's step sees it.

  Attributes:
    data: the batch's rows of :attr:`Rows.arrays` (``'x'`` as model inputs, augmented),
      and ``'_pos'``: the rows' positions in the client's table.
    valid: ``[B]`` bool, the real rows (padding and the tail of a last batch are not).
    key: the step's key for the model's own randomness (dropout).
    pos: ``[B]`` positions in the client's rows (``>= n`` for padding).
  """
  data: dict
  valid: Array
  key: Array
  pos: Array


class Client(NamedTuple):
  """What a program knows of the client it runs for.

  Attributes:
    kernels: the cohort's :class:`~fedjax_kd.core.kernels.CohortKernels`: its module,
      ``apply_model`` (the compute dtype), ``apply`` (float32), ``inputs``, optimizers.
    model: the client's stored :class:`~fedjax_kd.core.state.ModelState` (one row).
    key: the client's key of this phase (by its id: :mod:`fedjax_kd.core.rng`).
    idx: ``[n_max]`` the client's rows of the call's :class:`Rows` (``[1]`` without).
    n: how many of them are real.
  """
  kernels: Any
  model: ModelState
  key: Array
  idx: Array
  n: Array

  def forward(self, params: Any, batch_stats: Any, x: Array, valid: Array, key: Array,
              **kwargs) -> tuple[Array, Any]:
    """:func:`forward` of the client's model."""
    return forward(self.kernels, params, batch_stats, x, valid, key, **kwargs)


def forward(kernels: Any, params: Any, batch_stats: Any, x: Array, valid: Array, key: Array,
            **kwargs) -> tuple[Array, Any]:
  """Training-mode outputs of ``params`` on ``x`` (``kernels.apply_model``: the compute
  dtype) and the BatchNorm statistics the pass updates over the ``valid`` rows
  (``batch_stats`` unchanged for a model without them); dropout from ``key``."""
  kw = dict(train=True, mask=valid, rngs={'dropout': key}, **kwargs)
  if batch_stats:
    out, upd = kernels.apply_model(params, batch_stats, x, mutable=['batch_stats'], **kw)
    return out, upd['batch_stats']
  return kernels.apply_model(params, batch_stats, x, **kw), batch_stats


def grad_fn(c: Client, x: Array, y: Array, mask: Array, key: Array) -> Callable:
  """``grad_fn(params, aux) -> (grads, aux)`` of the mean cross-entropy over ``mask``'s rows
  of one batch ``(x, y)``, in training mode (dropout from ``key``; ``aux['stats']`` are the
  BatchNorm statistics it updates, ``aux['loss']`` becomes this evaluation's loss): the
  gradient oracle of the personalised rules (:mod:`fedjax_kd.ops.personal`)."""
  def fn(params, aux):
    def loss(p):
      logits, stats = c.forward(p, aux['stats'], x, mask, key)
      return losses.masked_mean(losses.cross_entropy(logits, y), mask), stats

    (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return grads, {'stats': stats, 'loss': value.astype(jnp.float32)}
  return fn


def part_grad_fns(c: Client, batch: Batch, parts: int) -> tuple[Callable, ...]:
  """One :func:`grad_fn` per part of ``batch`` (positions ``i`` with ``i % parts == j`` form
  part ``j``; a part with no real row uses the whole batch), dropout keyed by the part: the
  batches ``D, D' (, D'')`` of Per-FedAvg's meta step (one part: the batch)."""
  part_of = jnp.arange(batch.valid.shape[0]) % parts
  fns = []
  for j in range(parts):
    m = batch.valid & (part_of == j)
    m = jnp.where(jnp.any(m), m, batch.valid)
    fns.append(grad_fn(c, batch.data['x'], batch.data['y'], m, jax.random.fold_in(batch.key, j)))
  return tuple(fns)


# ------------------------------------------------------------------ programs
@dataclasses.dataclass(frozen=True)
class Program:
  """The base of every client program (see the module docstring).

  Subclasses are frozen dataclasses of static options; their ``batches`` (a field or a
  property) names the minibatches ``step`` runs on (None: no loop, ``init`` then ``final``).
  ``writes`` says whether ``final`` returns the client's new model (False: it returns None,
  the clients' states are read only and not donated).
  """
  writes = True

  @property
  def batches(self) -> Batches | None:
    return None

  def batch_key(self, key: Array) -> Array:
    """The key the engine draws the batches with (default the client's key)."""
    return key

  def init(self, c: Client, row: Any, shared: Any) -> Any:
    """The loop's carry (default: the client's model)."""
    del row, shared
    return c.model

  def step(self, c: Client, carry: Any, batch: Batch, row: Any,
           shared: Any) -> tuple[Any, Any]:
    """One minibatch: ``(carry, metrics)`` (a scalar or a pytree of scalars)."""
    raise NotImplementedError(f'{type(self).__name__} has batches but no step')

  def more(self, c: Client, carry: Any, row: Any, shared: Any) -> tuple[Any, Array]:
    """After an epoch of ``Batches(until=True)``: ``(carry, whether another epoch runs)``."""
    del c, row, shared
    return carry, jnp.bool_(False)

  def final(self, c: Client, carry: Any, row: Any, shared: Any) -> tuple[Any, Any]:
    """``(the client's new model or None, its outputs)`` (default: the carry, no outputs)."""
    del c, row, shared
    return carry, None

  def finish(self, outputs: Any, shared: Any) -> Any:
    """The stacked outputs of the clients run at once, slot by slot, outside the vmap (an op
    that must not be batched: an SVD on XLA:CPU, :mod:`fedjax_kd.ops.lowrank`). Row ``i`` of
    the result may depend on row ``i`` only, so chunks give the same numbers."""
    del shared
    return outputs


class Ran(NamedTuple):
  """What :meth:`~fedjax_kd.core.federation.Federation.run` returns.

  Attributes:
    states: the cohorts' states (the same objects for a program that only reads).
    out: the programs' outputs, ``[K, ...]`` rows in client order (``fill``'s rows, or
      zeros, for the clients that did not run); None for a program without outputs.
    metrics: each client's step metrics averaged over the steps it ran, ``[K]`` leaves
      (NaN for the clients that did not run or ran no step); None without batches.
  """
  states: tuple
  out: Any
  metrics: Any


# ------------------------------------------------------------ local training
@dataclasses.dataclass(frozen=True)
class Transform:
  """A change to :class:`SGD`'s step, chained onto it with :func:`chain` (each hook may be
  left as it is). ``row`` and ``shared`` are the program's inputs."""

  def penalty(self, params: Any, start: Any, row: Any, shared: Any) -> Array | None:
    """A term added to every step's mean loss (``start``: the parameters the call began
    with), or None."""
    del params, start, row, shared
    return None

  def updates(self, updates: Any, row: Any, shared: Any) -> Any:
    """The optimizer's updates before they are applied."""
    del row, shared
    return updates

  def correct(self, params: Any, row: Any, shared: Any) -> Any:
    """The parameters after every real step, outside the optimizer."""
    del row, shared
    return params


@dataclasses.dataclass(frozen=True)
class Penalty(Transform):
  """``fn(params, start, row, shared)`` added to the loss (a module-level function or a
  frozen dataclass: part of the program's hash)."""
  fn: Callable

  def penalty(self, params, start, row, shared):
    return self.fn(params, start, row, shared)


@dataclasses.dataclass(frozen=True)
class Correction(Transform):
  """``fn(params, row, shared) -> params`` after every real step."""
  fn: Callable

  def correct(self, params, row, shared):
    return self.fn(params, row, shared)


@dataclasses.dataclass(frozen=True)
class LRScale(Transform):
  """The updates times ``shared['lr_scale']``, the round's learning-rate factor (exact for
  SGD with or without momentum and coupled weight decay): a schedule over rounds."""

  def updates(self, updates, row, shared):
    scale = shared['lr_scale']
    return jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)


@dataclasses.dataclass(frozen=True)
class SGD(Program):
  """Local training: ``epochs`` Keras-style epochs of an optimizer's steps on the mean of
  ``loss`` over each batch's real rows (the engine's standard program).

  Attributes:
    loss: ``loss(logits, batch.data, row) -> [B]`` per-sample loss (a module-level function
      or a frozen dataclass).
    epochs, batch_size: the batches (:class:`Batches`, order ``'shuffle'``).
    slot: the optimizer (and optimizer state) it steps.
    augment: ``augment(key, x) -> x`` of every batch.
    fresh: start from a new optimizer state (default: continue the stored one).
    transforms: :class:`Transform` s, applied in order (:func:`chain`).
  """
  loss: LossFn
  epochs: int
  batch_size: int
  slot: str = 'train'
  augment: Callable | None = None
  fresh: bool = False
  transforms: tuple = ()

  @property
  def batches(self) -> Batches:
    return Batches(self.epochs, self.batch_size, augment=self.augment)

  def init(self, c, row, shared):
    st = c.model
    if self.fresh:   # a new optimizer state every call (NIID-Bench; FedEntOpt's configs)
      tx = c.kernels.optimizers[self.slot]
      st = st.replace(opt_state={**st.opt_state, self.slot: tx.init(st.params)})
    return st

  def step(self, c, st, batch, row, shared):
    tx = c.kernels.optimizers[self.slot]
    start = c.model.params   # w^r, the penalties' reference point (FedProx's anchor)

    def objective(params):
      logits, stats = c.forward(params, st.batch_stats, batch.data['x'], batch.valid,
                                batch.key)
      value = losses.masked_mean(self.loss(logits, batch.data, row), batch.valid)
      for t in self.transforms:
        term = t.penalty(params, start, row, shared)
        if term is not None:
          value = value + term
      return value, stats

    (value, stats), grads = jax.value_and_grad(objective, has_aux=True)(st.params)
    updates, opt = tx.update(grads, st.opt_state[self.slot], st.params)
    for t in self.transforms:
      updates = t.updates(updates, row, shared)
    params = optax.apply_updates(st.params, updates)
    for t in self.transforms:
      params = t.correct(params, row, shared)
    return ModelState(params=params, batch_stats=stats,
                      opt_state={**st.opt_state, self.slot: opt}), value


def chain(program: SGD, *transforms: Transform) -> SGD:
  """``program`` with ``transforms`` applied after its own (optax's ``chain``)."""
  return dataclasses.replace(program, transforms=tuple(program.transforms) + transforms)


# ---------------------------------------------------------------- losses
def ce_loss(logits: Array, batch: dict, row: Any) -> Array:
  """Cross-entropy on integer labels ``batch['y']`` (local update, DS-FL eq. 2)."""
  del row
  return losses.cross_entropy(logits, batch['y'])


def soft_ce_loss(logits: Array, batch: dict, row: Any) -> Array:
  """Cross-entropy on shared soft targets ``batch['t']`` (DS-FL eq. 10)."""
  del row
  return losses.soft_cross_entropy(logits, batch['t'])


def client_soft_ce_loss(logits: Array, batch: dict, row: Any) -> Array:
  """Cross-entropy on per-client soft targets ``row['t'][position]``."""
  return losses.soft_cross_entropy(logits, row['t'][batch['_pos']])


def weighted_client_soft_ce_loss(logits: Array, batch: dict, row: Any) -> Array:
  """``row['w']`` (one weight per client, e.g. COMET's lambda) times the above."""
  return row['w'] * client_soft_ce_loss(logits, batch, row)


def tree_sq_distance(a: Any, b: Any) -> Array:
  """``sum ||a - b||^2`` over the leaves of two pytrees of the same structure."""
  return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# --------------------------------------------------------- the engine's draws
def epoch_positions(key: Array, n_max: int, n: Array, epochs: int,
                    batch_size: int) -> tuple[Array, Array]:
  """Keras-style minibatch positions and per-step keys for one client.

  Every epoch reshuffles the ``n`` real positions of ``[0, n_max)`` (padding
  positions, and the tail of the last batch, get the out-of-range id
  ``n_max``). Keys go by identity (epoch, position, step), never by array
  shape, so a client's shuffles and dropout masks do not depend on how far it
  is padded.

  Returns:
    ``positions [epochs * steps_per_epoch, batch_size]`` int32 and one key per step.
  """
  steps_per_epoch = -(-n_max // batch_size)
  total = steps_per_epoch * batch_size
  perm_key, step_key = jax.random.split(key)
  position_ids = jnp.arange(n_max, dtype=jnp.uint32)

  def permutation(e):
    ek = jax.random.fold_in(perm_key, e)
    r = jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(ek, i)))(position_ids)
    r = jnp.where(jnp.arange(n_max) < n, r, 2.0)  # real positions first
    p = jnp.argsort(r).astype(jnp.int32)
    return jnp.concatenate([p, jnp.full((total - n_max,), n_max, jnp.int32)])

  positions = jax.vmap(permutation)(jnp.arange(epochs, dtype=jnp.uint32)).reshape(
      epochs * steps_per_epoch, batch_size)
  # Step s of epoch e keeps its key whatever steps_per_epoch is.
  step_ids = (jnp.arange(epochs, dtype=jnp.uint32)[:, None] * 1_000_003
              + jnp.arange(steps_per_epoch, dtype=jnp.uint32)[None, :]).reshape(-1)
  step_keys = jax.vmap(lambda i: jax.random.fold_in(step_key, i))(step_ids)
  return positions, step_keys


def budget_positions(key: Array, n_max: int, n: Array, epochs: int, batch_size: int,
                     epochs_k: Array) -> tuple[Array, Array]:
  """:func:`epoch_positions` for ``epochs`` epochs, with the steps past the client's own
  budget of ``epochs_k`` epochs (a straggler's) given no real sample (position ``n_max``)."""
  positions, step_keys = epoch_positions(key, n_max, n, epochs, batch_size)
  step_epoch = jnp.arange(positions.shape[0]) // -(-n_max // batch_size)
  return jnp.where((step_epoch < epochs_k)[:, None], positions, n_max), step_keys


def random_batch(key: Array, n_max: int, n: Array, batch_size: int) -> Array:
  """``[batch_size]`` positions of ``[0, n_max)``: ``min(n, batch_size)`` distinct real ones
  drawn uniformly, then the out-of-range ``n_max`` (padding)."""
  r = jax.random.uniform(key, (n_max,))
  r = jnp.where(jnp.arange(n_max) < n, r, 2.0)
  p = jnp.argsort(r).astype(jnp.int32)
  p = jnp.where(jnp.arange(n_max) < n, p, n_max)
  if n_max < batch_size:
    p = jnp.concatenate([p, jnp.full((batch_size - n_max,), n_max, jnp.int32)])
  return p[:batch_size]


class Draw(NamedTuple):
  """A client's batches: ``[T, B]`` positions and real rows, and each step's two keys."""
  pos: Array
  valid: Array
  aug_key: Array
  drop_key: Array


def _split_keys(step_keys: Array) -> tuple[Array, Array]:
  pair = jax.vmap(jax.random.split)(step_keys)
  return pair[:, 0], pair[:, 1]


def window_sampler(b: Batches, key: Array, n_max: int, n: Array) -> Callable[[Array], Draw]:
  """FedALA's batches: one window of ``percent`` % of the rows (at least one) at a random
  offset, cut into batches in order; the same every epoch, epoch ``e``'s step ``s`` keyed
  ``(e, s)``. Returns the draw of epoch ``e``."""
  num = jnp.maximum(n * b.percent // 100, 1)
  steps = max(1, -(-max(n_max * b.percent // 100, 1) // b.batch_size))
  k_start, k_drop = jax.random.split(key)
  start = jax.random.randint(k_start, (), 0, jnp.maximum(n - num + 1, 1))
  offsets = jnp.arange(steps * b.batch_size, dtype=jnp.int32).reshape(steps, b.batch_size)
  valid = offsets < num
  pos = jnp.clip(start + offsets, 0, n_max - 1)

  def epoch(e):
    ids = e.astype(jnp.uint32) * 1_000_003 + jnp.arange(steps, dtype=jnp.uint32)
    keys = jax.vmap(lambda i: jax.random.fold_in(k_drop, i))(ids)
    return Draw(pos, valid, keys, keys)

  return epoch


def draw(b: Batches, key: Array, n_max: int, n: Array, epochs_k: Array) -> Draw:
  """Every batch of a client's loop (orders ``'shuffle'`` and ``'random'``), ``steps`` cut."""
  if b.order == 'shuffle':
    pos, step_keys = budget_positions(key, n_max, n, b.epochs, b.batch_size, epochs_k)
    aug, drop = _split_keys(step_keys)
  else:   # 'random': step s draws its rows, augmentation and dropout from one key
    keys = jax.vmap(lambda s: jax.random.split(jax.random.fold_in(key, s), 3))(
        jnp.arange(b.steps, dtype=jnp.uint32))
    pos = jax.vmap(lambda k: random_batch(k, n_max, n, b.batch_size))(keys[:, 0])
    aug, drop = keys[:, 1], keys[:, 2]
  if b.steps is not None:
    pos, aug, drop = pos[:b.steps], aug[:b.steps], drop[:b.steps]
  return Draw(pos, pos < n, aug, drop)


# ------------------------------------------------------------- row passes
def over_rows(fn: Callable[[Array, Array], Any], idx: Array, chunk: int) -> Any:
  """``fn(rows, i)`` over ``idx`` ``chunk`` rows at a time (chunk ``i``; the last padded with
  row 0), the outputs' leading axes joined and cut to ``len(idx)``: an inference
  pass over a client's rows, or over a shared set's (``idx = arange(m)``), whose working set
  is one chunk's."""
  m = idx.shape[0]
  chunk = max(1, min(int(chunk), m))
  rows = jnp.pad(idx, (0, (-m) % chunk)).reshape(-1, chunk)
  out = jax.lax.map(lambda a: fn(a[1], a[0]),
                    (jnp.arange(rows.shape[0], dtype=jnp.uint32), rows))
  return jax.tree.map(lambda o: o.reshape((-1,) + o.shape[2:])[:m], out)
