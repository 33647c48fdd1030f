"""Compiled per-cohort kernels: vmap over clients, lax.scan over steps.

A cohort is a set of clients with the same model spec. Its state is one
:class:`~fedjax_kd.core.state.ModelState` whose leaves carry a leading client
axis. Every kernel works on *slots*: a fixed-size vector of cohort rows (padded
with an out-of-range id and a ``valid`` flag), so a round on any subset of
clients reuses the same compiled function. Kernels are jitted once per
(cohort, slot count, data shapes, static options) and the slot axis is sharded
over all local devices when there are several.

Every per-client loop is :meth:`CohortKernels.run` of a client program
(:mod:`fedjax_kd.core.program`): the program's ``init``, its minibatch loop (a
``lax.scan`` over the steps the engine draws: Keras' ``fit`` semantics by
default, as DS-FL's authors used Keras: reshuffle every epoch, keep the partial
last batch) and its ``final``, vmapped over the slots, in chunks of clients and
sharded over the mesh. Clients of unequal size are padded to the largest; padded
positions are masked out of the loss and of BatchNorm statistics, and a step
with no real sample leaves the carry untouched. Prediction, evaluation and the
class sums are the engine's own inference kernels.

Mixed precision (``compute_dtype='bfloat16'``, config ``train.compute_dtype``)
follows the usual recipe (Micikevicius et al., "Mixed Precision Training",
ICLR 2018; JAX/Flax's bf16 practice): master parameters, optimizer state and
BatchNorm statistics stay float32; every forward pass casts the parameters and
inputs to bfloat16 and the logits back to float32 before the loss or softmax,
so gradients, updates and the predictions handed to aggregation are float32.

Inputs arrive in their stored dtype (uint8 pixels for image sources, float32
otherwise) and become model inputs where a kernel gathers them: the training
batch, each predict chunk, each evaluation chunk (``normalize``, a
:class:`fedjax_kd.data.inputs.Normalize`; float arrays pass unchanged). Only
the gathered rows are ever float32, never the pooled arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Iterator, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_kd.core import program as program_lib
from fedjax_kd.core.state import ModelState, put_clients, take_clients
from fedjax_kd.data.inputs import Normalize
from fedjax_kd.models.registry import init_compiler_options

Array = jax.Array
_DROP = jnp.iinfo(jnp.int32).max   # a row index that put_clients drops


def client_mesh() -> Mesh | None:
  """A 1-D mesh over all local devices, or ``None`` on a single device."""
  devices = jax.devices()
  if len(devices) <= 1:
    return None
  return Mesh(np.asarray(devices), ('clients',))


def _constrain(tree: Any, mesh: Mesh | None) -> Any:
  if mesh is None:
    return tree
  sharding = NamedSharding(mesh, PartitionSpec('clients'))
  return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, sharding), tree)


def over_slots(fn: Callable, mesh: Mesh | None, in_axes: tuple, *args: Any,
               chunk: int | None = None) -> Any:
  """``jax.vmap(fn, in_axes)(*args)``, each device running only its own slots.

  With a mesh, the vmapped function runs under ``jax.shard_map``: arguments with
  ``in_axes`` 0 are split over the slot axis, the others (shared data) are
  replicated, and the outputs stay split. Every device then trains and predicts
  its own clients with no collective inside the step loop. Left to itself, XLA's
  sharding propagation does not see through the loops of a training step (the
  scan over steps, the im2col chunk loop of a convolution): it all-gathered
  activations and weights over the client axis at every step, which over gloo
  made a two-process CPU run several times slower than one process with two
  devices.
  A slot count the mesh does not divide falls back to a sharding constraint.

  Args:
    fn: the per-slot function.
    mesh: the slot mesh (``None``: one device, a plain vmap).
    in_axes: ``0`` (per slot) or ``None`` (shared) for each argument.
    *args: the arguments.
    chunk: run each device's slots ``chunk`` at a time (:func:`in_chunks`); None: all at once.

  Returns:
    ``fn``'s outputs with a leading slot axis.
  """
  return shard_slots(jax.vmap(fn, in_axes=in_axes), mesh, in_axes, *args, chunk=chunk)


def shard_slots(mapped: Callable, mesh: Mesh | None, in_axes: tuple, *args: Any,
                chunk: int | None = None) -> Any:
  """:func:`over_slots` for a function that already maps over the leading slot axis."""
  mapped = in_chunks(mapped, chunk, in_axes)
  if mesh is None:
    return mapped(*args)
  per_slot = [a for a, ax in zip(args, in_axes) if ax == 0]
  s = jax.tree.leaves(per_slot)[0].shape[0]
  if s % mesh.size:
    args = [_constrain(a, mesh) if ax == 0 else a for a, ax in zip(args, in_axes)]
    return mapped(*args)
  specs = tuple(PartitionSpec('clients') if ax == 0 else PartitionSpec() for ax in in_axes)
  return jax.shard_map(mapped, mesh=mesh, in_specs=specs, out_specs=PartitionSpec('clients'),
                       check_vma=False)(*args)


def in_chunks(mapped: Callable, chunk: int | None, in_axes: tuple) -> Callable:
  """``mapped`` (a function mapped over the leading slot axis of its ``in_axes`` 0
  arguments) run ``chunk`` slots at a time, in a ``lax.map`` inside the same program.

  A step then holds one chunk's activations instead of every slot's: memory for time
  (``clients.chunk``). Each slot's arithmetic is the same as in one batch of all slots.
  A slot count ``chunk`` does not divide is padded with copies of the last slot, whose
  outputs are dropped.

  Args:
    mapped: ``mapped(*args)`` with a leading slot axis on the arguments whose axis is 0.
    chunk: slots at a time; None (or at least the slot count): ``mapped`` itself.
    in_axes: ``0`` (per slot) or ``None`` (shared) for each argument.

  Returns:
    A function of the same arguments and outputs.
  """
  if chunk is None:
    return mapped

  def run(*args):
    s = jax.tree.leaves([a for a, ax in zip(args, in_axes) if ax == 0])[0].shape[0]
    if chunk >= s:
      return mapped(*args)
    n = -(-s // chunk)

    def split(a):
      a = jnp.concatenate([a, jnp.repeat(a[-1:], n * chunk - s, axis=0)]) if n * chunk > s else a
      return a.reshape((n, chunk) + a.shape[1:])

    per = [jax.tree.map(split, a) if ax == 0 else None for a, ax in zip(args, in_axes)]

    def one(part):
      return mapped(*[p if ax == 0 else a for a, p, ax in zip(args, part, in_axes)])

    out = jax.lax.map(one, per)
    return jax.tree.map(lambda o: o.reshape((n * chunk,) + o.shape[2:])[:s], out)

  return run


COMPUTE_DTYPES: tuple[str, ...] = ('float32', 'bfloat16')


@dataclasses.dataclass
class Programs:
  """What :func:`recording` keeps: each kernel program run, by phase, with XLA's own
  ``compiled.memory_analysis()``.

  Attributes:
    dry: the programs are compiled, not run: each call returns zeros of its outputs' shapes
      (a round's programs and their memory without its compute, for a planner's check).
    seen: ``(phase, stats)`` for every call, in order (``stats`` a ``CompiledMemoryStats``).
  """
  dry: bool = False
  seen: list = dataclasses.field(default_factory=list)


_RECORDING: list[Programs] = []


@contextlib.contextmanager
def recording(dry: bool = False) -> Iterator[Programs]:
  """Keeps ``compiled.memory_analysis()`` of every kernel program called inside (each is
  lowered and compiled first, which the call then reuses); ``dry`` compiles without running."""
  programs = Programs(dry=dry)
  _RECORDING.append(programs)
  try:
    yield programs
  finally:
    _RECORDING.remove(programs)


_RAN: list[list] = []


@contextlib.contextmanager
def programs_run() -> Iterator[list]:
  """The client programs :meth:`CohortKernels.run` runs inside, in order (nothing compiled
  besides the run's own): what a test holds against an algorithm's declared programs."""
  seen: list = []
  _RAN.append(seen)
  try:
    yield seen
  finally:
    _RAN.remove(seen)


def _call(phase: str, jitted: Callable, *args: Any, **kwargs: Any) -> Any:
  """``jitted(*args, **kwargs)``, seen by an active :func:`recording`."""
  if not _RECORDING:
    return jitted(*args, **kwargs)
  programs = _RECORDING[-1]
  compiled = jitted.lower(*args, **kwargs).compile()
  programs.seen.append((phase, compiled.memory_analysis()))
  if programs.dry:
    return jax.tree.map(lambda o: jnp.zeros(o.shape, o.dtype), compiled.out_info)
  return jitted(*args, **kwargs)


def _cast_floats(tree: Any, dtype: Any) -> Any:
  """Casts the floating-point leaves of ``tree`` to ``dtype`` (others unchanged)."""
  return jax.tree.map(
      lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _variables(params, batch_stats):
  v = {'params': params}
  if batch_stats:
    v['batch_stats'] = batch_stats
  return v


class Planned(NamedTuple):
  """A client program a round runs, described for the memory planner
  (:meth:`fedjax_kd.algorithms.base.Algorithm.programs`): the program, and its inputs as
  pytrees of ``jax.ShapeDtypeStruct`` as :meth:`CohortKernels.run` takes them: the batches'
  ``data`` (a :class:`~fedjax_kd.core.program.Rows` whose ``idx`` has one client's shape:
  ``[n_max]``, shared by every client when ``shared_rows``), one client's ``row`` and the
  ``shared`` inputs. ``server``: the server model runs it (one slot), not the clients."""
  program: Any
  data: Any = None
  row: Any = None
  shared: Any = None
  shared_rows: bool = False
  server: bool = False


class CohortKernels:
  """Jitted train/distill/predict/evaluate functions for one model spec.

  Args:
    module: the Flax module of the cohort.
    optimizers: optimizer slot name -> optax transformation.
    mesh: device mesh for the slot axis (``None``: one device).
    compute_dtype: ``'float32'`` or ``'bfloat16'``: the dtype of the forward pass of
      fit/predict/evaluate/class sums (mixed precision: params, optimizer state,
      BatchNorm statistics, losses and outputs stay float32). A program that needs float32
      whatever this says uses ``apply`` (float32).
    normalize: the map from stored inputs to model inputs (default: uint8 pixels / 255,
      float inputs unchanged); the engine applies it to every batch it gathers, a program
      to the rows it gathers itself with :meth:`inputs`.
  """

  def __init__(self, module: nn.Module, optimizers: dict[str, optax.GradientTransformation],
               mesh: Mesh | None = None, compute_dtype: str = 'float32',
               normalize: Normalize | None = None):
    if compute_dtype not in COMPUTE_DTYPES:
      raise ValueError(f'compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}')
    self.module = module
    self.optimizers = dict(optimizers)
    self.mesh = mesh
    self.compute_dtype = compute_dtype
    self.normalize = normalize or Normalize()
    self._dtype = jnp.dtype(compute_dtype)
    run_static = ('program', 'idx_shared', 'client_chunk')
    # A program that writes the clients' models back donates the cohort's state (one copy of
    # it a round, not two); one that only reads leaves it to the caller.
    self._runs = {True: jax.jit(self._run_impl, donate_argnums=(0,), static_argnames=run_static),
                  False: jax.jit(self._run_impl, static_argnames=run_static)}
    self._predict = jax.jit(self._predict_impl, static_argnames=('chunk', 'log', 'augment',
                                                                  'client_chunk'))
    self._evaluate = jax.jit(self._evaluate_impl, static_argnames=('chunk', 'idx_shared',
                                                                    'client_chunk'))
    # One jit per answer of `init_compiler_options` (lighter on its own, plain when traced).
    self._inits = {traced: jax.jit(self._init_impl, static_argnames=('input_shape', 'input_dtype'),
                                   compiler_options=None if traced else init_compiler_options())
                   for traced in (False, True)}
    self._class_sums = jax.jit(self._class_sums_impl, static_argnames=('num_classes', 'chunk',
                                                                        'client_chunk'))

  # ------------------------------------------------------------ forward
  def inputs(self, x: Array) -> Array:
    """Float32 model inputs of gathered stored inputs ``x`` (inside a compiled step)."""
    return self.normalize(x)

  def apply_model(self, params: Any, batch_stats: Any, x: Array, **kwargs) -> Any:
    """``module.apply`` in the compute dtype; float32 logits (and batch stats).

    With float32 this is exactly ``module.apply(variables, x, **kwargs)``. With
    ``mutable=['batch_stats']`` it returns ``(logits, updates)`` like Flax, the
    updated statistics cast back to their float32 dtype.
    """
    if self._dtype == jnp.float32:
      return self.module.apply(_variables(params, batch_stats), x, **kwargs)
    out = self.module.apply(_variables(_cast_floats(params, self._dtype), batch_stats),
                            _cast_floats(x, self._dtype), **kwargs)
    if kwargs.get('mutable'):
      logits, upd = out
      upd = {**upd, 'batch_stats': jax.tree.map(lambda new, old: new.astype(old.dtype),
                                                upd['batch_stats'], batch_stats)}
      return logits.astype(jnp.float32), upd
    return out.astype(jnp.float32)

  # ------------------------------------------------------------------ init
  def _init_impl(self, keys: Array, input_shape: tuple[int, ...],
                 input_dtype: str = 'float32') -> ModelState:
    dummy = jnp.zeros((1,) + tuple(input_shape), input_dtype)

    def one(key):
      variables = self.module.init({'params': key, 'dropout': key}, dummy, train=False)
      params = variables['params']
      stats = variables.get('batch_stats', {})
      opt = {name: tx.init(params) for name, tx in self.optimizers.items()}
      return ModelState(params=params, batch_stats=stats, opt_state=opt)

    return jax.vmap(one)(keys)

  def init_shapes(self, clients: int, input_shape: tuple[int, ...],
                  input_dtype: str = 'float32') -> ModelState:
    """The shapes of ``clients`` initial states (``jax.ShapeDtypeStruct`` leaves; nothing
    is allocated or compiled)."""
    keys = jax.random.split(jax.random.PRNGKey(0), clients)
    return jax.eval_shape(lambda: self._init_impl(keys, tuple(input_shape), str(input_dtype)))

  def init(self, keys: Array, input_shape: tuple[int, ...],
           input_dtype: str = 'float32') -> ModelState:
    """Initial stacked state, one model per key, from a dummy batch of ``input_dtype`` model
    inputs (``'int32'`` for token ids, see `FederatedData.model_input_dtype`)."""
    init = self._inits[init_compiler_options(keys) is None]
    return _call('init', init, keys, tuple(input_shape), str(input_dtype))

  # ------------------------------------------------------------------- run
  def _loop(self, program, c, carry, key, idx, n, arrays, epochs_k, row, shared):
    """The program's minibatch loop for one client: ``(carry, mean step metrics)``."""
    b = program.batches
    n_max = idx.shape[0]

    def step(carry, d):
      rows = idx[jnp.minimum(d.pos, n_max - 1)]
      data = {name: a[rows] for name, a in arrays.items()}
      if 'x' in data:
        data['x'] = self.inputs(data['x'])
        if b.augment is not None:
          data['x'] = b.augment(d.aug_key, data['x'])
      data['_pos'] = d.pos
      new, metrics = program.step(c, carry, program_lib.Batch(data, d.valid, d.drop_key, d.pos),
                                  row, shared)
      used = jnp.any(d.valid)   # a step without a real row changes nothing
      new = jax.tree.map(lambda a, o: jnp.where(used, a, o), new, carry)
      return new, (metrics, used)

    key = program.batch_key(key)
    if b.until:   # epochs until the program stops them (at least one, at most b.epochs)
      epoch_draw = program_lib.window_sampler(b, key, n_max, n)

      def more(s):
        e, _, go, _, _ = s
        return (e == 0) | (go & (e < b.epochs))

      def epoch(s):
        e, carry, _, total, count = s
        carry, (metrics, used) = jax.lax.scan(step, carry, epoch_draw(e))
        carry, go = program.more(c, carry, row, shared)
        usedf = used.astype(jnp.float32)
        total = jax.tree.map(lambda t, v: t + jnp.sum(v * usedf), total, metrics)
        return e + 1, carry, go, total, count + jnp.sum(usedf)

      shapes = jax.eval_shape(lambda: step(carry, jax.tree.map(lambda a: a[0], epoch_draw(
          jnp.int32(0))))[1][0])
      zero = jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), shapes)
      _, carry, _, total, count = jax.lax.while_loop(
          more, epoch, (jnp.int32(0), carry, jnp.bool_(True), zero, jnp.float32(0.0)))
      metrics = jax.tree.map(lambda t: jnp.where(count > 0, t / jnp.maximum(count, 1.0),
                                                 jnp.nan), total)
      return carry, metrics
    draw = program_lib.draw(b, key, n_max, n, epochs_k)
    carry, (metrics, used) = jax.lax.scan(step, carry, draw)
    usedf = used.astype(jnp.float32)
    metrics = jax.tree.map(
        lambda v: jnp.where(jnp.any(used), jnp.sum(v * usedf.astype(v.dtype))
                            / jnp.maximum(jnp.sum(usedf.astype(v.dtype)), 1.0), jnp.nan),
        metrics)
    return carry, metrics

  def _run_one(self, state, key, idx, n, arrays, epochs_k, row, shared, *, program):
    """One client's program: ``(its new model or None, its outputs, its step metrics)``."""
    c = program_lib.Client(self, state, key, idx, n)
    carry = program.init(c, row, shared)
    metrics = None
    if program.batches is not None:
      carry, metrics = self._loop(program, c, carry, key, idx, n, arrays, epochs_k, row, shared)
    model, out = program.final(c, carry, row, shared)
    return model, out, metrics

  def _run_impl(self, state, slots, valid, keys, idx, n, arrays, epochs_k, row, shared, *,
                program, idx_shared, client_chunk):
    sub = take_clients(state, slots)
    n = jnp.where(valid, n, 0)
    in_axes = (0, 0, None if idx_shared else 0, 0, None, 0, 0, None)
    one = jax.vmap(functools.partial(self._run_one, program=program), in_axes=in_axes)

    def mapped(*args):
      model, out, metrics = one(*args)
      return model, program.finish(out, args[-1]), metrics

    model, out, metrics = shard_slots(mapped, self.mesh, in_axes, sub, keys, idx, n, arrays,
                                      epochs_k, row, shared, chunk=client_chunk)
    if program.writes:
      state = put_clients(state, jnp.where(valid, slots, _DROP), model)
      return state, out, metrics
    return out, metrics

  def run(self, program: program_lib.Program, state: ModelState, slots: Array, valid: Array,
          keys: Array, data: program_lib.Rows | None = None, row: Any = None,
          shared: Any = None, epochs_k: Array | None = None,
          client_chunk: int | None = None) -> tuple[ModelState, Any, Any]:
    """Runs ``program`` for the slotted clients, vmapped over the slots (the engine's one
    per-client kernel; :mod:`fedjax_kd.core.program`).

    Args:
      program: the client program (static: equal programs share a compilation).
      state: cohort state (donated when the program writes: do not reuse the argument).
      slots: ``[S]`` int32 cohort rows.
      valid: ``[S]`` bool, False for padding slots (their rows are not written).
      keys: ``[S]`` PRNG keys.
      data: the rows the batches are drawn from, ``idx``/``n`` per slot (``idx`` ``[n_max]``
        shared by every slot); None for a program without batches.
      row: pytree of per-slot inputs (leading axis ``S``).
      shared: pytree every slot sees.
      epochs_k: ``[S]`` epoch budgets (None: all of ``program.batches.epochs``).
      client_chunk: run the slots this many at a time (:func:`in_chunks`); None: all.

    Returns:
      ``(state, outputs [S, ...], step metrics [S])``: the cohort's new state (the same
      state for a program that only reads), the programs' outputs and their step metrics
      (None without batches).
    """
    s = slots.shape[0]
    b = program.batches
    if data is None:
      data = program_lib.Rows({}, jnp.zeros((1,), jnp.int32), jnp.zeros((s,), jnp.int32))
    if epochs_k is None:
      epochs_k = jnp.full((s,), b.epochs if b is not None else 0, jnp.int32)
    idx = jnp.asarray(data.idx, jnp.int32)
    args = (state, slots, valid, keys, idx, jnp.asarray(data.n, jnp.int32), dict(data.arrays),
            jnp.asarray(epochs_k, jnp.int32), row, shared)
    kw = dict(program=program, idx_shared=idx.ndim == 1, client_chunk=client_chunk)
    for seen in _RAN:
      seen.append(program)
    phase = f'run:{type(program).__name__}'
    if program.writes:
      return _call(phase, self._runs[True], *args, **kw)
    out, metrics = _call(phase, self._runs[False], *args, **kw)
    return state, out, metrics

  def run_program(self, program: program_lib.Program, shared_rows: bool = False,
                  client_chunk: int | None = None) -> Callable[..., Any]:
    """The kernel program of ``program``, not jitted: ``(state, slots, valid, keys, idx, n,
    arrays, epochs_k, row, shared)`` to what :meth:`run` returns (the memory planner traces
    or compiles it)."""
    return functools.partial(self._run_impl, program=program, idx_shared=shared_rows,
                             client_chunk=client_chunk)

  # --------------------------------------------------------------- predict
  def _logits_chunks(self, sub: ModelState, x: Array, chunk: int, keys: Array | None = None,
                     augment: Callable | None = None) -> Array:
    """``[S, m, C]`` inference-mode logits of every slot on shared inputs ``x``.

    With ``augment``, slot s sees ``augment(fold_in(keys[s], chunk_index), x_chunk)``.
    """
    m = x.shape[0]
    pad = (-m) % chunk
    xp = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    xs = xp.reshape((-1, chunk) + x.shape[1:])

    def one_chunk(inputs):
      xc, i = inputs

      xf = self.inputs(xc)

      def one_slot(st, key):
        xin = xf if augment is None else augment(jax.random.fold_in(key, i), xf)
        return self.apply_model(st.params, st.batch_stats, xin, train=False)

      slot_keys = keys if keys is not None else jnp.zeros((sub_size(sub), 2), jnp.uint32)
      return jax.vmap(one_slot)(sub, slot_keys)

    out = jax.lax.map(one_chunk, (xs, jnp.arange(xs.shape[0], dtype=jnp.uint32)))
    out = jnp.moveaxis(out, 1, 0).reshape(sub_size(sub), -1, out.shape[-1])
    return out[:, :m]

  def _predict_impl(self, state, slots, x, keys, *, chunk, log, augment, client_chunk):
    logits = shard_slots(
        lambda sub, k, x: self._logits_chunks(sub, x, chunk, k, augment), self.mesh,
        (0, 0, None), take_clients(state, slots), keys, x, chunk=client_chunk)
    return jax.nn.log_softmax(logits, -1) if log else jax.nn.softmax(logits, -1)

  def predict(self, state: ModelState, slots: Array, x: Array, *, chunk: int = 512,
              log: bool = False, keys: Array | None = None,
              augment: Callable | None = None, client_chunk: int | None = None) -> Array:
    """Softmax outputs ``[S, m, C]`` (inference-mode BN) on shared inputs ``x``.

    ``augment`` (with per-slot ``keys``) transforms the inputs of each slot
    independently, as a client's data loader would (SCARLET's code augments
    the public images it predicts on). ``client_chunk`` runs the slots that many at a time.
    """
    chunk = max(1, min(chunk, x.shape[0]))
    if augment is None:
      keys = None
    return _call('predict', self._predict, state, slots, x, keys, chunk=chunk, log=log, augment=augment,
                         client_chunk=client_chunk)

  def predict_program(self, chunk: int, client_chunk: int | None = None) -> Callable[..., Array]:
    """The prediction program's function, not jitted: ``(state, slots, x, None)`` to every
    slot's probabilities on ``x`` in chunks of ``chunk`` (the memory planner traces or
    compiles it, :mod:`fedjax_kd.running.memory`)."""
    return functools.partial(self._predict_impl, chunk=chunk, log=False, augment=None,
                             client_chunk=client_chunk)

  def evaluate_program(self, chunk: int, shared_rows: bool,
                       client_chunk: int | None = None) -> Callable[..., Any]:
    """The evaluation program's function, not jitted: ``(state, slots, x, y, idx, n)`` to
    every slot's scores (``idx`` ``[m]`` shared by every slot where ``shared_rows``)."""
    return functools.partial(self._evaluate_impl, chunk=chunk, idx_shared=shared_rows,
                             client_chunk=client_chunk)

  def init_program(self, input_shape: tuple[int, ...],
                   input_dtype: str = 'float32') -> Callable[..., ModelState]:
    """The initialisation program's function, not jitted: ``keys`` to their states."""
    return functools.partial(self._init_impl, input_shape=tuple(input_shape),
                             input_dtype=str(input_dtype))

  # -------------------------------------------------------------- evaluate
  def _evaluate_impl(self, state, slots, x, y, idx, n, *, chunk, idx_shared, client_chunk):
    m = idx.shape[-1]
    pad = (-m) % chunk
    pad_cfg = [(0, pad)] if idx_shared else [(0, 0), (0, pad)]
    idxp = jnp.pad(idx, pad_cfg)
    pos = jnp.arange(m + pad).reshape(-1, chunk)

    def one_client(st, cidx, cn, x, y):
      def body(carry, p):
        rows = cidx[p]
        logits = self.apply_model(st.params, st.batch_stats, self.inputs(x[rows]), train=False)
        ok = (p < cn).astype(jnp.float32)
        correct = jnp.sum((jnp.argmax(logits, -1) == y[rows]) * ok)
        _, top = jax.lax.top_k(logits, min(5, logits.shape[-1]))
        correct5 = jnp.sum(jnp.any(top == y[rows][:, None], -1) * ok)
        logp = jax.nn.log_softmax(logits, -1)
        nll = -jnp.sum(jnp.take_along_axis(logp, y[rows][:, None], -1)[:, 0] * ok)
        return (carry[0] + correct, carry[1] + nll, carry[2] + correct5), None

      (correct, nll, correct5), _ = jax.lax.scan(body, (0.0, 0.0, 0.0), pos)
      denom = jnp.maximum(cn.astype(jnp.float32), 1.0)
      return correct / denom, nll / denom, correct5 / denom

    return over_slots(one_client, self.mesh, (0, None if idx_shared else 0, 0, None, None),
                      take_clients(state, slots), idxp, n, x, y, chunk=client_chunk)

  def evaluate(self, state: ModelState, slots: Array, x: Array, y: Array,
               idx: Array | None = None, n: Array | None = None, *,
               chunk: int = 512, client_chunk: int | None = None) -> tuple[Array, Array, Array]:
    """Top-1 accuracy, mean cross-entropy and top-5 accuracy ``[S]`` on ``x[idx]``, ``y[idx]``.

    ``idx=None`` evaluates every slot on all of ``x``; ``idx`` ``[S, m]`` with
    counts ``n`` ``[S]`` gives per-client test sets. ``client_chunk``: slots at a time.
    """
    s = slots.shape[0]
    if idx is None:
      idx = jnp.arange(x.shape[0], dtype=jnp.int32)
      n = jnp.full((s,), x.shape[0], jnp.int32)
    chunk = max(1, min(chunk, idx.shape[-1]))
    return _call('evaluate', self._evaluate, state, slots, x, y, idx, n, chunk=chunk,
                          idx_shared=(idx.ndim == 1), client_chunk=client_chunk)

  # ----------------------------------------------------------- class sums
  def _class_sums_impl(self, state, slots, x, y, idx, n, *, num_classes, chunk, client_chunk):
    m = idx.shape[-1]
    pad = (-m) % chunk
    idxp = jnp.pad(idx, [(0, 0), (0, pad)])
    pos = jnp.arange(m + pad).reshape(-1, chunk)

    def one_client(st, cidx, cn, x, y):
      def body(carry, p):
        rows = cidx[p]
        probs = jax.nn.softmax(self.apply_model(st.params, st.batch_stats, self.inputs(x[rows]),
                                           train=False), -1)
        onehot = jax.nn.one_hot(y[rows], num_classes) * (p < cn)[:, None]
        return (carry[0] + onehot.T @ probs, carry[1] + onehot.sum(0)), None

      init = (jnp.zeros((num_classes, num_classes)), jnp.zeros((num_classes,)))
      (sums, counts), _ = jax.lax.scan(body, init, pos)
      return sums, counts

    return over_slots(one_client, self.mesh, (0, 0, 0, None, None), take_clients(state, slots),
                      idxp, n, x, y, chunk=client_chunk)

  def class_prob_sums(self, state: ModelState, slots: Array, x: Array, y: Array,
                      idx: Array, n: Array, num_classes: int,
                      chunk: int = 512, client_chunk: int | None = None) -> tuple[Array, Array]:
    """Per-client sums of predicted probabilities grouped by true label.

    Returns ``sums [S, C, C]`` (row = true label) and ``counts [S, C]`` over each
    slot's rows ``x[idx[s, :n[s]]]`` in inference mode (FD, Jeong et al. eq. 4).
    """
    chunk = max(1, min(chunk, idx.shape[-1]))
    return _call('class_sums', self._class_sums, state, slots, x, y, idx, n, num_classes=num_classes, chunk=chunk,
                            client_chunk=client_chunk)

  def apply(self, params: Any, batch_stats: Any, x: Array, **kwargs) -> Any:
    """``module.apply`` in float32 with the variables of one model."""
    return self.module.apply(_variables(params, batch_stats), x, **kwargs)


def sub_size(tree: Any) -> int:
  return jax.tree.leaves(tree)[0].shape[0]
