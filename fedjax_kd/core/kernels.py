"""Compiled per-cohort kernels: vmap over clients, lax.scan over steps.

A cohort is a set of clients with the same model spec. Its state is one
:class:`~fedjax_kd.core.state.ModelState` whose leaves carry a leading client
axis. Every kernel works on *slots*: a fixed-size vector of cohort rows (padded
with an out-of-range id and a ``valid`` flag), so a round on any subset of
clients reuses the same compiled function. Kernels are jitted once per
(cohort, slot count, data shapes, static options) and the slot axis is sharded
over all local devices when there are several.

Local optimisation follows Keras' ``fit`` semantics used by DS-FL (A4, A5):
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
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_kd.core.state import ModelState, put_clients, take_clients
from fedjax_kd.ops import krr
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


COMPUTE_DTYPES: tuple[str, ...] = ('float32', 'bfloat16')


def _cast_floats(tree: Any, dtype: Any) -> Any:
  """Casts the floating-point leaves of ``tree`` to ``dtype`` (others unchanged)."""
  return jax.tree.map(
      lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def _variables(params, batch_stats):
  v = {'params': params}
  if batch_stats:
    v['batch_stats'] = batch_stats
  return v


class CohortKernels:
  """Jitted train/distill/predict/evaluate functions for one model spec.

  Args:
    module: the Flax module of the cohort.
    optimizers: optimizer slot name -> optax transformation.
    mesh: device mesh for the slot axis (``None``: one device).
    compute_dtype: ``'float32'`` or ``'bfloat16'``: the dtype of the forward pass of
      fit/predict/evaluate/class sums (mixed precision: params, optimizer state,
      BatchNorm statistics, losses and outputs stay float32). Dataset distillation
      (``distill_inputs``) always runs in float32 (its KRR solve needs the precision).
  """

  def __init__(self, module: nn.Module, optimizers: dict[str, optax.GradientTransformation],
               mesh: Mesh | None = None, compute_dtype: str = 'float32'):
    if compute_dtype not in COMPUTE_DTYPES:
      raise ValueError(f'compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}')
    self.module = module
    self.optimizers = dict(optimizers)
    self.mesh = mesh
    self.compute_dtype = compute_dtype
    self._dtype = jnp.dtype(compute_dtype)
    self._fit = jax.jit(self._fit_impl, donate_argnums=(0,),
                        static_argnames=('loss_fn', 'epochs', 'batch_size',
                                         'opt_slot', 'idx_shared', 'augment',
                                         'fresh_opt', 'prox_mu'))
    self._predict = jax.jit(self._predict_impl, static_argnames=('chunk', 'log', 'augment'))
    self._evaluate = jax.jit(self._evaluate_impl, static_argnames=('chunk', 'idx_shared'))
    self._init = jax.jit(self._init_impl, static_argnames=('input_shape',))
    self._class_sums = jax.jit(self._class_sums_impl, static_argnames=('num_classes', 'chunk'))
    self._distill_inputs = jax.jit(
        self._distill_inputs_impl,
        static_argnames=('epochs', 'batch_size', 'lr', 'reg', 'bn_mode', 'augment', 'chunk',
                         'value_range'))

  # ------------------------------------------------------------ forward
  def _apply(self, params: Any, batch_stats: Any, x: Array, **kwargs) -> Any:
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
  def _init_impl(self, keys: Array, input_shape: tuple[int, ...]) -> ModelState:
    dummy = jnp.zeros((1,) + tuple(input_shape), jnp.float32)

    def one(key):
      variables = self.module.init({'params': key, 'dropout': key}, dummy, train=False)
      params = variables['params']
      stats = variables.get('batch_stats', {})
      opt = {name: tx.init(params) for name, tx in self.optimizers.items()}
      return ModelState(params=params, batch_stats=stats, opt_state=opt)

    return jax.vmap(one)(keys)

  def init(self, keys: Array, input_shape: tuple[int, ...]) -> ModelState:
    """Initial stacked state, one model per key."""
    return self._init(keys, tuple(input_shape))

  # ------------------------------------------------------------------- fit
  def _fit_one(self, state: ModelState, key: Array, idx: Array, n: Array,
               shared: dict, aux: dict, epochs_k: Array, c_k: Any, control: Any,
               lr_scale: Array, *,
               loss_fn: LossFn, epochs: int, batch_size: int, opt_slot: str,
               augment: Callable | None, fresh_opt: bool, prox_mu: float):
    tx = self.optimizers[opt_slot]
    n_max = idx.shape[0]
    steps_per_epoch = -(-n_max // batch_size)
    positions, step_keys = epoch_positions(key, n_max, n, epochs, batch_size)
    # Steps past this client's own epoch budget (stragglers) see no real sample.
    step_epoch = jnp.arange(positions.shape[0]) // steps_per_epoch
    positions = jnp.where((step_epoch < epochs_k)[:, None], positions, n_max)
    anchor = state.params   # theta^r for FedProx's proximal term
    if fresh_opt:   # a new optimizer state every call (NIID-Bench; FedEntOpt A18)
      state = state.replace(opt_state={**state.opt_state, opt_slot: tx.init(state.params)})

    def step(st: ModelState, inputs):
      pos, k = inputs
      valid = pos < n
      rows = idx[jnp.minimum(pos, n_max - 1)]
      batch = {name: arr[rows] for name, arr in shared.items()}
      batch['_pos'] = pos
      k_aug, k_drop = jax.random.split(k)
      if augment is not None:
        batch['x'] = augment(k_aug, batch['x'])

      def loss(params):
        if st.batch_stats:
          logits, upd = self._apply(params, st.batch_stats, batch['x'], train=True, mask=valid,
                                    mutable=['batch_stats'], rngs={'dropout': k_drop})
          stats = upd['batch_stats']
        else:
          logits = self._apply(params, st.batch_stats, batch['x'], train=True, mask=valid,
                               rngs={'dropout': k_drop})
          stats = st.batch_stats
        value = masked_mean(loss_fn(logits, batch, aux), valid)
        if prox_mu:   # FedProx: (mu / 2) ||w - theta^r||^2
          sq = sum(jnp.sum(jnp.square(a - b)) for a, b in
                   zip(jax.tree.leaves(params), jax.tree.leaves(anchor)))
          value = value + 0.5 * prox_mu * sq
        return value, stats

      (value, stats), grads = jax.value_and_grad(loss, has_aux=True)(st.params)
      updates, opt = tx.update(grads, st.opt_state[opt_slot], st.params)
      updates = jax.tree.map(lambda u: u * lr_scale.astype(u.dtype), updates)
      params = optax.apply_updates(st.params, updates)
      if control is not None:   # SCAFFOLD: y <- y - lr (c - c_k), outside momentum
        c, lr = control
        params = jax.tree.map(lambda p, cs, ck: p - (lr * (cs[0] - ck)).astype(p.dtype),
                              params, c, c_k)
      new = ModelState(params=params, batch_stats=stats,
                       opt_state={**st.opt_state, opt_slot: opt})
      any_valid = jnp.any(valid)
      new = jax.tree.map(lambda a, b: jnp.where(any_valid, a, b), new, st)
      return new, (value, any_valid)

    state, (losses, used) = jax.lax.scan(step, state, (positions, step_keys))
    used = used.astype(losses.dtype)
    return state, jnp.sum(losses * used) / jnp.maximum(jnp.sum(used), 1.0)

  def _fit_impl(self, state, slots, valid, keys, idx, n, shared, aux, epochs_k, c_k, control,
                lr_scale, *, loss_fn, epochs, batch_size, opt_slot, idx_shared, augment,
                fresh_opt, prox_mu):
    sub = _constrain(take_clients(state, slots), self.mesh)
    n = jnp.where(valid, n, 0)
    fit = functools.partial(self._fit_one, loss_fn=loss_fn, epochs=epochs,
                            batch_size=batch_size, opt_slot=opt_slot, augment=augment,
                            fresh_opt=fresh_opt, prox_mu=prox_mu)
    new, loss = jax.vmap(fit, in_axes=(0, 0, None if idx_shared else 0, 0, None, 0, 0, 0,
                                       None, None))(
        sub, _constrain(keys, self.mesh), idx, n, shared, aux, epochs_k, c_k, control,
        lr_scale)
    write = jnp.where(valid, slots, jnp.iinfo(jnp.int32).max)
    return put_clients(state, write, new), loss

  def fit(self, state: ModelState, slots: Array, valid: Array, keys: Array,
          idx: Array, n: Array, shared: dict, aux: dict, *, loss_fn: LossFn,
          epochs: int, batch_size: int, opt_slot: str = 'train',
          augment: Callable | None = None, epochs_k: Array | None = None,
          control: Any = None, lr_scale: float | Array = 1.0, fresh_opt: bool = False,
          prox_mu: float = 0.0) -> tuple[ModelState, Array]:
    """Runs ``epochs`` epochs of minibatch training on the slotted clients.

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
      loss_fn: per-sample loss; a module-level function (it is a static arg).
      epochs: passes over each client's data.
      batch_size: minibatch size.
      opt_slot: which optimizer (and optimizer state) to use.
      augment: optional ``augment(key, x) -> x`` applied per batch.
      epochs_k: ``[S]`` int, epochs each slot actually runs (<= ``epochs``; stragglers);
        default ``epochs`` for all. Later steps are masked like padding steps.
      control: SCAFFOLD's ``(c, c_k, lr)``: the server variate (leaves ``[1, ...]``),
        the slots' variates (leaves ``[S, ...]``) and the round's learning rate;
        ``lr * (c - c_k)`` is subtracted from the params after every real step.
      lr_scale: scalar multiplying every optimizer update (a per-round learning-rate
        decay; exact for SGD with or without momentum and coupled weight decay).
      fresh_opt: start from a new optimizer state (default: continue the stored one).
      prox_mu: FedProx's ``mu``; adds ``mu / 2 ||w - w_start||^2`` to the loss.

    Returns:
      The new cohort state and the mean training loss of each slot ``[S]``.
    """
    s = slots.shape[0]
    if epochs_k is None:
      epochs_k = jnp.full((s,), epochs, jnp.int32)
    return self._fit(state, slots, valid, keys, idx, n, shared, aux,
                     jnp.asarray(epochs_k, jnp.int32),
                     None if control is None else control[1],
                     None if control is None else (control[0], jnp.float32(control[2])),
                     jnp.asarray(lr_scale, jnp.float32), loss_fn=loss_fn, epochs=epochs,
                     batch_size=batch_size, opt_slot=opt_slot, idx_shared=(idx.ndim == 1),
                     augment=augment, fresh_opt=bool(fresh_opt), prox_mu=float(prox_mu))

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

      def one_slot(st, key):
        xin = xc if augment is None else augment(jax.random.fold_in(key, i), xc)
        return self._apply(st.params, st.batch_stats, xin, train=False)

      slot_keys = keys if keys is not None else jnp.zeros((sub_size(sub), 2), jnp.uint32)
      return jax.vmap(one_slot)(sub, slot_keys)

    out = jax.lax.map(one_chunk, (xs, jnp.arange(xs.shape[0], dtype=jnp.uint32)))
    out = jnp.moveaxis(out, 1, 0).reshape(sub_size(sub), -1, out.shape[-1])
    return out[:, :m]

  def _predict_impl(self, state, slots, x, keys, *, chunk, log, augment):
    sub = _constrain(take_clients(state, slots), self.mesh)
    logits = self._logits_chunks(sub, x, chunk, keys, augment)
    return jax.nn.log_softmax(logits, -1) if log else jax.nn.softmax(logits, -1)

  def predict(self, state: ModelState, slots: Array, x: Array, *, chunk: int = 512,
              log: bool = False, keys: Array | None = None,
              augment: Callable | None = None) -> Array:
    """Softmax outputs ``[S, m, C]`` (inference-mode BN) on shared inputs ``x``.

    ``augment`` (with per-slot ``keys``) transforms the inputs of each slot
    independently, as a client's data loader would (SCARLET's code augments
    the public images it predicts on).
    """
    chunk = max(1, min(chunk, x.shape[0]))
    if augment is None:
      keys = None
    return self._predict(state, slots, x, keys, chunk=chunk, log=log, augment=augment)

  # -------------------------------------------------------------- evaluate
  def _evaluate_impl(self, state, slots, x, y, idx, n, *, chunk, idx_shared):
    sub = _constrain(take_clients(state, slots), self.mesh)
    m = idx.shape[-1]
    pad = (-m) % chunk
    pad_cfg = [(0, pad)] if idx_shared else [(0, 0), (0, pad)]
    idxp = jnp.pad(idx, pad_cfg)
    pos = jnp.arange(m + pad).reshape(-1, chunk)

    def one_client(st, cidx, cn):
      def body(carry, p):
        rows = cidx[p]
        logits = self._apply(st.params, st.batch_stats, x[rows], train=False)
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

    return jax.vmap(one_client, in_axes=(0, None if idx_shared else 0, 0))(sub, idxp, n)

  def evaluate(self, state: ModelState, slots: Array, x: Array, y: Array,
               idx: Array | None = None, n: Array | None = None, *,
               chunk: int = 512) -> tuple[Array, Array, Array]:
    """Top-1 accuracy, mean cross-entropy and top-5 accuracy ``[S]`` on ``x[idx]``, ``y[idx]``.

    ``idx=None`` evaluates every slot on all of ``x``; ``idx`` ``[S, m]`` with
    counts ``n`` ``[S]`` gives per-client test sets.
    """
    s = slots.shape[0]
    if idx is None:
      idx = jnp.arange(x.shape[0], dtype=jnp.int32)
      n = jnp.full((s,), x.shape[0], jnp.int32)
    chunk = max(1, min(chunk, idx.shape[-1]))
    return self._evaluate(state, slots, x, y, idx, n, chunk=chunk,
                          idx_shared=(idx.ndim == 1))

  # ----------------------------------------------------------- class sums
  def _class_sums_impl(self, state, slots, x, y, idx, n, *, num_classes, chunk):
    sub = _constrain(take_clients(state, slots), self.mesh)
    m = idx.shape[-1]
    pad = (-m) % chunk
    idxp = jnp.pad(idx, [(0, 0), (0, pad)])
    pos = jnp.arange(m + pad).reshape(-1, chunk)

    def one_client(st, cidx, cn):
      def body(carry, p):
        rows = cidx[p]
        probs = jax.nn.softmax(self._apply(st.params, st.batch_stats, x[rows], train=False),
                               -1)
        onehot = jax.nn.one_hot(y[rows], num_classes) * (p < cn)[:, None]
        return (carry[0] + onehot.T @ probs, carry[1] + onehot.sum(0)), None

      init = (jnp.zeros((num_classes, num_classes)), jnp.zeros((num_classes,)))
      (sums, counts), _ = jax.lax.scan(body, init, pos)
      return sums, counts

    return jax.vmap(one_client)(sub, idxp, n)

  def class_prob_sums(self, state: ModelState, slots: Array, x: Array, y: Array,
                      idx: Array, n: Array, num_classes: int,
                      chunk: int = 512) -> tuple[Array, Array]:
    """Per-client sums of predicted probabilities grouped by true label.

    Returns ``sums [S, C, C]`` (row = true label) and ``counts [S, C]`` over each
    slot's rows ``x[idx[s, :n[s]]]`` in inference mode (FD, Jeong et al. eq. 4).
    """
    chunk = max(1, min(chunk, idx.shape[-1]))
    return self._class_sums(state, slots, x, y, idx, n, num_classes=num_classes, chunk=chunk)

  # ------------------------------------------------- dataset distillation (KRR)
  def _distill_inputs_impl(self, state, slots, keys, x_b, valid_b, y_b, idx, n, x, y, *,
                           epochs, batch_size, lr, reg, bn_mode, augment, chunk, value_range):
    sub = _constrain(take_clients(state, slots), self.mesh)
    one = functools.partial(_distill_inputs_one, self.module, epochs=epochs,
                            batch_size=batch_size, lr=lr, reg=reg, bn_mode=bn_mode,
                            augment=augment, chunk=chunk, value_range=value_range)
    return jax.vmap(one, in_axes=(0, 0, 0, 0, None, 0, 0, None, None))(
        sub, _constrain(keys, self.mesh), x_b, valid_b, y_b, idx, n, x, y)

  def distill_inputs(self, state: ModelState, slots: Array, keys: Array, x_b: Array,
                     valid_b: Array, y_b: Array, idx: Array, n: Array, x: Array, y: Array, *,
                     epochs: int, batch_size: int, lr: float, reg: float = 1e-6,
                     bn_mode: str = 'eval', augment: Callable | None = None, chunk: int = 256,
                     value_range: tuple[float, float] = (0.0, 1.0)):
    """FedCache 2.0's on-device dataset distillation for the slotted clients.

    Each slot's synthetic inputs ``x_b`` are optimised with Adam(``lr``) to
    minimise the KRR loss (``fedjax_kd.ops.krr.krr_loss``) of predicting the
    client's real data ``(x[idx[:n]], y[idx[:n]])`` from the synthetic set, with a
    linear kernel on the client model's penultimate features; ``epochs`` passes
    over the targets in minibatches of ``batch_size``. The model is not changed.

    Args:
      state: cohort state (read only).
      slots: ``[S]`` cohort rows.
      keys: ``[S]`` PRNG keys.
      x_b: ``[S, P, ...]`` initial synthetic inputs.
      valid_b: ``[S, P]`` bool, real synthetic rows (a class the client lacks is masked).
      y_b: ``[P, C]`` one-hot labels of the synthetic rows (fixed, not learned).
      idx, n: ``[S, n_max]`` rows of ``x``/``y`` that each client owns, and their count.
      x, y: the pooled private data.
      bn_mode: ``'eval'`` (running statistics) or ``'train'`` (the synthetic batch's own
        statistics, as the authors' code; running stats are not updated).
      augment: optional augmentation of the target inputs (one pass).
      value_range: ``(lo, hi)`` the inputs are clipped to after every step.

    Returns:
      New ``x_b``, the mean KRR loss per slot (NaN if no step ran) and the number
      of steps skipped for a non-finite loss or gradient.
    """
    return self._distill_inputs(state, slots, keys, x_b, valid_b, y_b, idx, n, x, y,
                                epochs=epochs, batch_size=batch_size, lr=float(lr),
                                reg=float(reg), bn_mode=bn_mode, augment=augment,
                                chunk=max(1, min(chunk, idx.shape[-1])),
                                value_range=(float(value_range[0]), float(value_range[1])))


def sub_size(tree: Any) -> int:
  return jax.tree.leaves(tree)[0].shape[0]


# ------------------------------------------------- dataset distillation (KRR)
def _embed(module: nn.Module, st: ModelState, x: Array, train: bool = False,
           mask: Array | None = None) -> Array:
  """Penultimate features F_f(x) ``[B, d]`` (the input of the final Dense)."""
  variables = _variables(st.params, st.batch_stats)
  if train and st.batch_stats:
    out, _ = module.apply(variables, x, train=True, mask=mask, embed=True,
                          mutable=['batch_stats'])  # running stats are not written back
    return out
  return module.apply(variables, x, train=False, embed=True)


def _target_features(module: nn.Module, st: ModelState, x: Array, idx: Array, key: Array,
                     chunk: int, augment: Callable | None) -> Array:
  """Inference-mode features of ``x[idx]`` ``[n_max, d]``, computed ``chunk`` rows at a time."""
  m = idx.shape[0]
  pad = (-m) % chunk
  rows = jnp.pad(idx, (0, pad)).reshape(-1, chunk)

  def body(inputs):
    i, r = inputs
    xb = x[r]
    if augment is not None:
      xb = augment(jax.random.fold_in(key, i), xb)
    return _embed(module, st, xb)

  feats = jax.lax.map(body, (jnp.arange(rows.shape[0], dtype=jnp.uint32), rows))
  return feats.reshape(-1, feats.shape[-1])[:m]


def _distill_inputs_one(module, st, key, x_b, valid_b, y_b, idx, n, x, y, *, epochs,
                        batch_size, lr, reg, bn_mode, augment, chunk, value_range):
  """Optimises one client's synthetic inputs ``x_b`` by KRR on its own features."""
  n_max = idx.shape[0]
  k_feat, k_pos = jax.random.split(key)
  # Targets: the client's real data through its current (trained) extractor,
  # detached -- only the synthetic inputs are learned (FedCache 2.0 A3, A5).
  phi_all = jax.lax.stop_gradient(_target_features(module, st, x, idx, k_feat, chunk, augment))
  y_all = jax.nn.one_hot(y[idx], y_b.shape[-1], dtype=jnp.float32)
  positions, _ = epoch_positions(k_pos, n_max, n, epochs, batch_size)
  vb = valid_b.astype(jnp.float32)
  tx = optax.adam(lr)
  lo, hi = value_range

  def loss_fn(xb, pos):
    phi_b = _embed(module, st, xb, train=(bn_mode == 'train'), mask=valid_b)
    p = jnp.minimum(pos, n_max - 1)
    return krr.krr_loss(phi_all[p], y_all[p], phi_b, y_b, vb, pos < n, reg)

  def step(carry, pos):
    xb, opt = carry
    value, grads = jax.value_and_grad(loss_fn)(xb, pos)
    updates, new_opt = tx.update(grads, opt, xb)
    new_xb = jnp.clip(optax.apply_updates(xb, updates), lo, hi)
    used = jnp.any(pos < n) & jnp.any(valid_b)
    # A non-finite loss or gradient skips the step (counted), so NaNs never reach the cache.
    ok = used & jnp.isfinite(value) & jnp.all(jnp.isfinite(grads))
    xb = jnp.where(ok, new_xb, xb)
    opt = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new_opt, opt)
    return (xb, opt), (value, ok, used)

  (x_b, _), (values, ok, used) = jax.lax.scan(step, (x_b, tx.init(x_b)), positions)
  okf = ok.astype(jnp.float32)
  loss = jnp.sum(jnp.where(ok, values, 0.0)) / jnp.maximum(jnp.sum(okf), 1.0)
  loss = jnp.where(jnp.any(ok), loss, jnp.nan)
  return x_b, loss, jnp.sum(used & ~ok)
