"""Compiled per-cohort kernels: vmap over clients, lax.scan over steps.

A cohort is a set of clients with the same model spec. Its state is one
:class:`~fedjax_kd.core.state.ModelState` whose leaves carry a leading client
axis. Every kernel works on *slots*: a fixed-size vector of cohort rows (padded
with an out-of-range id and a ``valid`` flag), so a round on any subset of
clients reuses the same compiled function. Kernels are jitted once per
(cohort, slot count, data shapes, static options) and the slot axis is sharded
over all local devices when there are several.

Local optimisation follows Keras' ``fit`` semantics, as DS-FL's authors used Keras:
reshuffle every epoch, keep the partial last batch, mean loss over the real
samples of a batch. Clients of unequal size are padded to the largest; padded
positions are masked out of the loss and of BatchNorm statistics, and a step
with no real sample leaves the state untouched.

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

from fedjax_kd.core.local import Local, LocalRule
from fedjax_kd.core.state import ModelState, put_clients, take_clients
from fedjax_kd.data.inputs import Normalize
from fedjax_kd.models.registry import init_compiler_options
from fedjax_kd.ops.losses import masked_mean

Array = jax.Array
# loss_fn(logits [B, C], batch: dict of gathered arrays, aux: per-client dict) -> [B]
LossFn = Callable[[Array, dict, dict], Array]


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


def batch_rows(idx: Array, pos: Array, n: Array) -> tuple[Array, Array]:
  """``(rows, valid)``: the data rows of minibatch positions ``pos`` of a client that owns
  ``idx[:n]``; a padding position (``>= n``) reads the last row and is not valid."""
  return idx[jnp.minimum(pos, idx.shape[0] - 1)], pos < n


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


class MapStep(NamedTuple):
  """A per-client map a round runs (:meth:`CohortKernels.map_clients`), described for the
  memory planner: its function, one client's ``row`` and the ``shared`` inputs (pytrees of
  ``jax.ShapeDtypeStruct``), and its static ``options``."""
  fn: Callable
  row: Any
  shared: Any
  options: Any = ()


class CohortKernels:
  """Jitted train/distill/predict/evaluate functions for one model spec.

  Args:
    module: the Flax module of the cohort.
    optimizers: optimizer slot name -> optax transformation.
    mesh: device mesh for the slot axis (``None``: one device).
    compute_dtype: ``'float32'`` or ``'bfloat16'``: the dtype of the forward pass of
      fit/predict/evaluate/class sums (mixed precision: params, optimizer state,
      BatchNorm statistics, losses and outputs stay float32). ``map_clients`` functions
      choose their own precision (``apply`` is float32).
    normalize: the map from stored inputs to model inputs (default: uint8 pixels / 255,
      float inputs unchanged); ``map_clients`` functions apply it with :meth:`inputs`.
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
    self._fit = jax.jit(self._fit_impl, donate_argnums=(0,),
                        static_argnames=('loss_fn', 'rule', 'idx_shared', 'client_chunk'))
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
    self._map = jax.jit(self._map_impl, static_argnames=('fn', 'options', 'client_chunk'))

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

  # ------------------------------------------------------------------- fit
  def _fit_one(self, state: ModelState, key: Array, idx: Array, n: Array, shared: dict,
               aux: dict, epochs_k: Array, client: Any, lr_scale: Array, hook_shared: Any, *,
               loss_fn: LossFn, rule: LocalRule):
    tx = self.optimizers[rule.opt_slot]
    positions, step_keys = budget_positions(key, idx.shape[0], n, rule.epochs,
                                            rule.batch_size, epochs_k)
    start = state.params   # w^r, the hooks' reference point (FedProx's anchor)
    if rule.fresh_opt:   # a new optimizer state every call (NIID-Bench; FedEntOpt's configs)
      state = state.replace(opt_state={**state.opt_state, rule.opt_slot: tx.init(state.params)})

    def step(st: ModelState, inputs):
      pos, k = inputs
      rows, valid = batch_rows(idx, pos, n)
      batch = {name: arr[rows] for name, arr in shared.items()}
      batch['x'] = self.inputs(batch['x'])
      batch['_pos'] = pos
      k_aug, k_drop = jax.random.split(k)
      if rule.augment is not None:
        batch['x'] = rule.augment(k_aug, batch['x'])

      def loss(params):
        if st.batch_stats:
          logits, upd = self.apply_model(params, st.batch_stats, batch['x'], train=True, mask=valid,
                                    mutable=['batch_stats'], rngs={'dropout': k_drop})
          stats = upd['batch_stats']
        else:
          logits = self.apply_model(params, st.batch_stats, batch['x'], train=True, mask=valid,
                               rngs={'dropout': k_drop})
          stats = st.batch_stats
        value = masked_mean(loss_fn(logits, batch, aux), valid)
        if rule.penalty is not None:
          value = value + rule.penalty(params, start, client, hook_shared)
        return value, stats

      (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(st.params)
      updates, opt = tx.update(grads, st.opt_state[rule.opt_slot], st.params)
      updates = jax.tree.map(lambda u: u * lr_scale.astype(u.dtype), updates)
      params = optax.apply_updates(st.params, updates)
      if rule.correction is not None:
        params = rule.correction(params, client, hook_shared)
      new = ModelState(params=params, batch_stats=stats,
                       opt_state={**st.opt_state, rule.opt_slot: opt})
      any_valid = jnp.any(valid)
      new = jax.tree.map(lambda a, b: jnp.where(any_valid, a, b), new, st)
      return new, (value, any_valid)

    state, (losses, used) = jax.lax.scan(step, state, (positions, step_keys))
    used = used.astype(losses.dtype)
    return state, jnp.sum(losses * used) / jnp.maximum(jnp.sum(used), 1.0)

  def _fit_impl(self, state, slots, valid, keys, idx, n, shared, aux, local, *, loss_fn, rule,
                idx_shared, client_chunk):
    sub = take_clients(state, slots)
    n = jnp.where(valid, n, 0)
    fit = functools.partial(self._fit_one, loss_fn=loss_fn, rule=rule)
    new, loss = over_slots(
        fit, self.mesh, (0, 0, None if idx_shared else 0, 0, None, 0, 0, 0, None, None),
        sub, keys, idx, n, shared, aux, local.epochs_k, local.client, local.lr_scale,
        local.shared, chunk=client_chunk)
    write = jnp.where(valid, slots, jnp.iinfo(jnp.int32).max)
    return put_clients(state, write, new), loss

  def fit(self, state: ModelState, slots: Array, valid: Array, keys: Array,
          idx: Array, n: Array, shared: dict, aux: dict, rule: LocalRule,
          local: Local | None = None, *, loss_fn: LossFn,
          client_chunk: int | None = None) -> tuple[ModelState, Array]:
    """Runs ``rule.epochs`` epochs of minibatch training on the slotted clients.

    Args:
      state: cohort state (donated: do not reuse the argument).
      slots: ``[S]`` int32 cohort rows to train.
      valid: ``[S]`` bool, False for padding slots (their rows are not written).
      keys: ``[S]`` PRNG keys.
      idx: ``[S, n_max]`` rows of the ``shared`` arrays that each client owns,
        or ``[n_max]`` when every client trains on the same rows.
      n: ``[S]`` number of real rows of each client.
      shared: dict of arrays with a leading sample axis, same for every client
        (must include ``'x'``); gathered per batch and passed to ``loss_fn``.
      aux: dict of per-slot arrays (leading axis ``S``) passed whole to
        ``loss_fn`` (e.g. per-client targets indexed by ``batch['_pos']``).
      rule: the static training options and hooks (:class:`LocalRule`).
      local: this call's epoch budgets, learning-rate factor and hook data, with
        per-client leaves for the ``S`` slots (:class:`Local`).
      loss_fn: per-sample loss; a module-level function (it is a static arg).
      client_chunk: train the slots this many at a time (:func:`in_chunks`); None: all.

    Returns:
      The new cohort state and the mean training loss of each slot ``[S]``.
    """
    local = local or Local()
    s = slots.shape[0]
    epochs_k = local.epochs_k
    if epochs_k is None:
      epochs_k = jnp.full((s,), rule.epochs, jnp.int32)
    local = local.replace(epochs_k=jnp.asarray(epochs_k, jnp.int32),
                          lr_scale=jnp.asarray(local.lr_scale, jnp.float32))
    return _call('fit', self._fit, state, slots, valid, keys, idx, n, shared, aux, local, loss_fn=loss_fn,
                     rule=rule, idx_shared=(idx.ndim == 1), client_chunk=client_chunk)

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

  def predict_program(self, chunk: int) -> Callable[..., Array]:
    """The prediction program's function, not jitted: ``(state, slots, x, None)`` to every
    slot's probabilities on ``x`` in chunks of ``chunk`` (the memory planner traces or
    compiles it, :mod:`fedjax_kd.memory`)."""
    return functools.partial(self._predict_impl, chunk=chunk, log=False, augment=None,
                             client_chunk=None)

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

  # ------------------------------------------------------- any per-client map
  def _map_impl(self, state, slots, keys, per_client, shared, *, fn, options, client_chunk):
    one = lambda st, key, row, shared: fn(self, st, key, row, shared, options=options)
    return over_slots(one, self.mesh, (0, 0, 0, None), take_clients(state, slots), keys,
                      per_client, shared, chunk=client_chunk)

  def map_program(self, step: MapStep) -> Callable[..., Any]:
    """The map's program function, not jitted: ``(state, slots, keys, per_client, shared)``
    to every slot's outputs (the memory planner traces or compiles it)."""
    return functools.partial(self._map_impl, fn=step.fn, options=step.options,
                             client_chunk=None)

  def map_clients(self, fn: Callable, state: ModelState, slots: Array, keys: Array,
                  per_client: Any, shared: Any, options: Any = (),
                  client_chunk: int | None = None) -> Any:
    """``fn`` of each slotted client's model, vmapped over the slots (the state is read only).

    Args:
      fn: ``fn(kernels, model_state, key, row, shared, options=options) -> outputs``
        for one client; a module-level function (it is a static argument). It may
        use ``kernels.module`` and ``kernels.apply``, and maps the stored inputs it
        gathers with ``kernels.inputs``.
      state: cohort state.
      slots: ``[S]`` cohort rows.
      keys: ``[S]`` PRNG keys.
      per_client: pytree with a leading axis ``S`` (each slot's ``row``).
      shared: pytree every slot sees.
      options: hashable static options of ``fn``.
      client_chunk: run the slots this many at a time; None: all at once.

    Returns:
      ``fn``'s outputs stacked over the slots.
    """
    return _call('map_clients', self._map, state, slots, keys, per_client, shared, fn=fn, options=options,
                     client_chunk=client_chunk)

  def apply(self, params: Any, batch_stats: Any, x: Array, **kwargs) -> Any:
    """``module.apply`` in float32 with the variables of one model."""
    return self.module.apply(_variables(params, batch_stats), x, **kwargs)


def sub_size(tree: Any) -> int:
  return jax.tree.leaves(tree)[0].shape[0]
