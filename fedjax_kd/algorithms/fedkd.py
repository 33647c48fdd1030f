"""FedKD: private mentors, a shared mentee, adaptive mutual distillation and SVD-compressed updates.

C. Wu, F. Wu, L. Lyu, Y. Huang, X. Xie, "Communication-efficient federated learning via
knowledge distillation", Nature Communications 13, 2032 (2022); authors' code
github.com/wuch15/FedKD (``run.py``, ``model_bert.py``). A baseline of FedCache 2.0
(arXiv 2405.13378; Table III: Adam, lr 0.01, batch 64, 1 local epoch, 100 rounds,
``tmax`` 0.98, ``tmin`` 0.95; a ResNet-T mentee in every image experiment, App. D: "parameters
of the student model are transmitted in each round") and of ACE-pFL.

Every client k holds a private **mentor** (its own model, its cohort's architecture: the
clients' models may differ) and a copy of one small **mentee** (one architecture for all,
``fedkd.mentee``). A round, for the active clients in parallel:

1. **Local training** (eqs. 1-6, :func:`fedjax_kd.ops.lowrank.mutual_distillation_loss`):
   for every minibatch of the client's private data (drawn as the engine draws them,
   :func:`fedjax_kd.core.kernels.epoch_positions`, ``train.epochs`` epochs) both models take
   one optimizer step on ``L_t + L_s`` with ``L_x = CE_x + w KL(p_other || p_x) + w L^h``,
   ``w = 1 / (CE_t + CE_s)`` (the adaptive weight: the models lean on each other more where
   both are right), each model learning only from its own terms.
2. **Upload** (eq. 7 onwards, "dynamic gradient approximation"): the mentee's update
   ``Delta_k = w_k' - w`` is sent as the rank-``k`` SVD factors of every weight matrix
   holding an energy share ``T(t) = tmin + (t / rounds)(tmax - tmin)`` (eq. 10;
   :func:`~fedjax_kd.ops.lowrank.compress_tree`); vectors (biases, BatchNorm) go whole.
3. **Server**: the weighted mean of the rebuilt updates, compressed again at ``T(t)``
   (:func:`~fedjax_kd.ops.lowrank.server_downlink`), is sent to the active clients, which
   add it to their mentee (the code: ``latest_local + aggregated``).

What the paper leaves open, and what we do (also ``docs/papers.md``):

* **Hidden loss.** The paper's ``L^h`` is the MSE of the Transformers' hidden states (through
  a learned projection) and attention matrices. For our (non-Transformer) models the
  analogue is the MSE of the two models' batch cosine-similarity matrices of penultimate
  features (``module.apply(..., embed=True)``): width-agnostic, no extra parameters
  (``fedkd.hidden``, on by default; it costs a second forward pass of each model).
* **Gradients.** Each model learns from its own loss terms only (the other's prediction and
  ``w`` are constants); the code backpropagates the sum through everything. KLs are
  per-sample sums over classes (the code's ``KLDivLoss`` 'mean' also divides by C), no
  temperature (the paper has none).
* **Optimizers.** ``train.*`` for both models (Table III: Adam 0.01). Each client keeps a
  mentor optimizer state (its model row) and a mentee optimizer state (the client table)
  across rounds, as the code keeps one Adam per client; ``train.fresh_optimizer`` resets both.
* **Kept rank.** The smallest ``k`` in ``1..n`` with ``sum_{i<=k} s_i^2 >= T sum s_i^2``
  (the code searches ``0..n-1``, ``>`` on the client; see :mod:`fedjax_kd.ops.lowrank`);
  kernels of more axes as ``[prod(shape[:-1]), shape[-1]]`` matrices. The code leaves
  embedding matrices out of the exchange; here every parameter is exchanged.
* **Aggregation weights.** ``fedkd.weighting='samples'``: ``n_k``-weighted as FedAvg;
  ``'uniform'``: the code's plain mean.
* **Partial participation and the clients' mentee copies.** A client that applied the last
  downlink holds exactly the global mentee (``w + D`` on both sides), so the server's global
  mentee (``AlgState.server``) is every up-to-date client's copy, and a client's table row
  keeps only its mentee optimizer state and the last round it synchronised. A client that
  missed a downlink (absent in an earlier round) receives the current global mentee whole
  before training (``mentee_sync``, counted per such client); the code has full
  participation and no such case.

Bytes (``paper_rules='acepfl'``: float32, every receiver's copy counted, as FedKD reports
per-client traffic): setup, the initial mentee to all K clients (a multicast). Per round,
each active client uploads its factors (``sum_l k_l (m_l + n_l + 1)`` + vector sizes) and
downloads the server's factors (the same for all: a multicast, counted once under
``multicast_once`` rule sets), plus the whole mentee for each out-of-date client.

Evaluation: UA (``test_acc``) = the mentors, as FedCache 2.0 and ACE-pFL report (base
:meth:`~fedjax_kd.algorithms.base.Algorithm.client_metrics`; with ``data.per_client_test`` each
on its own split); the global mentee is logged as ``mentee_acc`` / ``mentee_loss`` (server
test set) and ``mentee_ua`` (clients' splits).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.core import rng
from fedjax_kd.core.kernels import CohortKernels, batch_rows, budget_positions, shard_slots
from fedjax_kd.core.local import LocalRule
from fedjax_kd.core.state import ModelState, num_elements, put_clients, take_clients
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm
from fedjax_kd.ops import lowrank

WEIGHTING = ('samples', 'uniform')
_DROP = jnp.iinfo(jnp.int32).max


@dataclasses.dataclass(frozen=True)
class FedKDOptions:
  """``fedkd.*`` (defaults: FedCache 2.0 Table III and the paper)."""
  group: ClassVar[str] = 'fedkd'
  tmin: float = options.option(0.95, 'energy threshold T of round 0 (Table III)', gt=0, le=1)
  tmax: float = options.option(0.98, 'energy threshold T of the last round (Table III)', gt=0,
                               le=1)
  mentee: str = options.option('', "the shared mentee's model spec: one of clients.models or "
                               "server.model ('': server.model)")
  hidden: bool = options.option(True, 'the hidden loss (batch similarity matrices of '
                                'penultimate features); False: task + KL only')
  weighting: str = options.option('samples', "the server's mean of updates: 'samples' (n_k) "
                                  "or 'uniform' (the code)", choices=WEIGHTING)

  def validate(self, spec, algorithm) -> None:
    del algorithm
    if self.tmin > self.tmax:
      raise ConfigError('fedkd.tmin', self.tmin, f'a number <= fedkd.tmax = {self.tmax}')
    specs = tuple(dict.fromkeys(tuple(spec.clients.models) + (spec.server.model,)))
    if self.mentee and self.mentee not in specs:
      raise ConfigError('fedkd.mentee', self.mentee, f"'' or one of {list(specs)} (the "
                        'model specs of clients.models and server.model)')


@flax.struct.dataclass
class MenteeRows:
  """FedKD's client table (rows K).

  Attributes:
    opt_state: each client's optimizer state of its mentee copy.
    synced: ``[K]`` int32, the last round whose downlink the client applied (0: the setup
      broadcast); its copy is the global mentee when this is the previous round.
  """
  opt_state: Any
  synced: Any


@dataclasses.dataclass(frozen=True)
class JointRule:
  """The static part of the joint step (hashable: a jit static argument)."""
  rule: LocalRule
  hidden: bool


def _forward(kernels: CohortKernels, params, stats, x, valid, key, embed: bool = False):
  """Train-mode outputs and the new BatchNorm statistics (unchanged without BatchNorm)."""
  kw = dict(train=True, mask=valid, rngs={'dropout': key})
  if embed:
    kw['embed'] = True
  if stats:
    out, upd = kernels.apply_model(params, stats, x, mutable=['batch_stats'], **kw)
    return out, upd['batch_stats']
  return kernels.apply_model(params, stats, x, **kw), stats


class FedKD(base.Algorithm):
  name = 'fedkd'
  options_class = FedKDOptions
  paper_rules = 'acepfl'
  uses_public = False
  has_server_model = True

  def __init__(self, ctx: base.Context):
    # The server model is the mentee (default: server.model's spec).
    mentee = ctx.spec.options.mentee or ctx.spec.server.model
    ctx = dataclasses.replace(ctx, spec=dataclasses.replace(
        ctx.spec, server=dataclasses.replace(ctx.spec.server, model=mentee)))
    super().__init__(ctx)
    self.mentee = self.server_model.kernels
    self.tx = ctx.optimizers['train']
    self._joint = jax.jit(self._joint_impl, static_argnames=('mentor', 'joint'),
                          donate_argnums=(0, 1))
    self._downlink = jax.jit(self._downlink_impl)

  @functools.cached_property
  def mentee_shapes(self) -> ModelState:
    """The global mentee's shapes (``jax.eval_shape``: nothing is computed)."""
    return jax.eval_shape(self.server_model.init, self.ctx.root)

  @functools.cached_property
  def mentee_elements(self) -> int:
    """Floats of one mentee: its parameters and BatchNorm statistics."""
    s = self.mentee_shapes
    return num_elements(s.params) + num_elements(s.batch_stats)

  def energy(self, t: int) -> float:
    """``T(t)`` of round ``t`` (host value, for the log)."""
    o = self.options
    return o.tmin + (t / self.spec.rounds) * (o.tmax - o.tmin)

  # ------------------------------------------------------------ lifecycle
  def setup_payloads(self):
    return [comm.Payload('mentee', comm.DOWN, 'float', self.mentee_elements, self.num_clients,
                         multicast=True)]

  def init(self) -> base.AlgState:
    state = super().init()
    k = self.num_clients
    opt = jax.tree.map(lambda a: jnp.repeat(a, k, axis=0), state.server.opt_state['train'])
    return state.replace(table=MenteeRows(opt_state=opt, synced=jnp.zeros((k,), jnp.int32)))

  # ----------------------------------------------------- the joint local step
  def _joint_one(self, st: ModelState, opt_s: Any, key, idx, n, epochs_k, start: dict,
                 x_all, y_all, lr_scale, *, mentor: CohortKernels, joint: JointRule):
    """One client: mentor ``st`` and the mentee (from ``start``) trained jointly. Returns the
    new mentor, the mentee's optimizer state, the mentee's update (compressed by the caller:
    :func:`~fedjax_kd.ops.lowrank.compress_each`, not under this function's vmap) and the
    mean losses."""
    rule, tx = joint.rule, self.tx
    positions, step_keys = budget_positions(key, idx.shape[0], n, rule.epochs,
                                            rule.batch_size, epochs_k)
    slot = rule.opt_slot
    if rule.fresh_opt:
      st = st.replace(opt_state={**st.opt_state, slot: tx.init(st.params)})
      opt_s = tx.init(start['params'])
    ms = ModelState(params=start['params'], batch_stats=start['batch_stats'], opt_state=opt_s)

    def step(carry, inputs):
      t_st, s_st = carry
      pos, k = inputs
      rows, valid = batch_rows(idx, pos, n)
      x = mentor.inputs(x_all[rows])
      y = y_all[rows]
      k_aug, k_drop = jax.random.split(k)
      if rule.augment is not None:
        x = rule.augment(k_aug, x)
      k_t, k_s = jax.random.split(k_drop)

      def loss(pt, ps):
        lt, bt = _forward(mentor, pt, t_st.batch_stats, x, valid, k_t)
        ls, bs = _forward(self.mentee, ps, s_st.batch_stats, x, valid, k_s)
        ht = hs = None
        if joint.hidden:   # same dropout keys: the features of the same forward pass
          ht, _ = _forward(mentor, pt, t_st.batch_stats, x, valid, k_t, embed=True)
          hs, _ = _forward(self.mentee, ps, s_st.batch_stats, x, valid, k_s, embed=True)
          ht, hs = ht.reshape(ht.shape[0], -1), hs.reshape(hs.shape[0], -1)
        total, parts = lowrank.mutual_distillation_loss(lt, ls, y, valid, ht, hs)
        return total, (bt, bs, parts)

      (value, (bt, bs, parts)), (gt, gs) = jax.value_and_grad(
          loss, argnums=(0, 1), has_aux=True)(t_st.params, s_st.params)
      scale = lambda u: u * lr_scale.astype(u.dtype)
      ut, ot = tx.update(gt, t_st.opt_state[slot], t_st.params)
      us, os_ = tx.update(gs, s_st.opt_state, s_st.params)
      new_t = ModelState(params=optax.apply_updates(t_st.params, jax.tree.map(scale, ut)),
                         batch_stats=bt, opt_state={**t_st.opt_state, slot: ot})
      new_s = ModelState(params=optax.apply_updates(s_st.params, jax.tree.map(scale, us)),
                         batch_stats=bs, opt_state=os_)
      any_valid = jnp.any(valid)
      new = jax.tree.map(lambda a, b: jnp.where(any_valid, a, b), (new_t, new_s), (t_st, s_st))
      return new, (value, parts['ce_t'], parts['ce_s'], any_valid)

    (st, ms), (vals, ce_t, ce_s, used) = jax.lax.scan(step, (st, ms), (positions, step_keys))
    used = used.astype(jnp.float32)
    mean = lambda v: jnp.sum(v * used) / jnp.maximum(jnp.sum(used), 1.0)
    delta = jax.tree.map(lambda new, old: new - old,
                         {'params': ms.params, 'batch_stats': ms.batch_stats}, start)
    return st, ms.opt_state, delta, {'loss': mean(vals), 'ce_mentor': mean(ce_t),
                                     'ce_mentee': mean(ce_s)}

  def _joint_impl(self, cohort, table_opt, slots, valid, gids, keys, idx, n, epochs_k, weights,
                  start, x_all, y_all, lr_scale, energy, *, mentor, joint):
    """A cohort's active clients: joint training, then their weighted sum of rebuilt updates.

    Returns the cohort with the mentors written back, the client table's mentee optimizer
    states with the slots' rows written back, ``sum_s w_s rec_s``, ``sum_s w_s``, the uploaded
    floats, per-matrix kept ranks summed over the slots and the summed per-slot losses.
    """
    sub = take_clients(cohort, slots)
    opt_rows = take_clients(table_opt, gids)
    n = jnp.where(valid, n, 0)
    fn = functools.partial(self._joint_one, mentor=mentor, joint=joint)
    in_axes = (0, 0, 0, 0, 0, 0, None, None, None, None, None)

    def mapped(*args):
      # Training vmapped over the slots; the SVDs one slot after another (a vmapped SVD
      # can deadlock XLA:CPU's thread pool: lowrank's docstring).
      new_t, new_opt, delta, losses = jax.vmap(fn, in_axes=in_axes[:-1])(*args[:-1])
      rec, up, ranks = lowrank.compress_each(delta, args[-1])
      return new_t, new_opt, rec, up, ranks, losses

    new_t, new_opt, rec, up, ranks, losses = shard_slots(
        mapped, mentor.mesh, in_axes, sub, opt_rows, keys, idx, n, epochs_k, start, x_all,
        y_all, lr_scale, energy)
    cohort = put_clients(cohort, jnp.where(valid, slots, _DROP), new_t)
    table_opt = put_clients(table_opt, jnp.where(valid, gids, _DROP), new_opt)
    w = jnp.where(valid, weights, 0.0)
    on = lambda v: jnp.sum(jnp.where(valid.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0), axis=0)
    return (cohort, table_opt, lowrank.weighted_sum(rec, w), jnp.sum(w), on(up), on(ranks),
            jax.tree.map(on, losses))

  def _downlink_impl(self, server: ModelState, total: dict, weight, energy):
    """The server's step: the mean update compressed at ``energy`` and added to the mentee."""
    down, n_down, ranks = lowrank.server_downlink(total, weight, energy)
    add = lambda g, d: g + d[None].astype(g.dtype)
    return server.replace(params=jax.tree.map(add, server.params, down['params']),
                          batch_stats=jax.tree.map(add, server.batch_stats,
                                                   down['batch_stats'])), n_down, ranks

  # ---------------------------------------------------------------- round
  def round(self, state, r):
    fed, d, o = r.fed, r.fed.data, self.options
    g = state.server
    start = {'params': jax.tree.map(lambda a: a[0], g.params),
             'batch_stats': jax.tree.map(lambda a: a[0], g.batch_stats)}
    energy = jnp.float32(self.energy(r.t))
    rule = self.train_rule()
    joint = JointRule(rule=rule, hidden=bool(o.hidden))
    local = self.local_inputs(r)
    lr_scale = jnp.float32(local.lr_scale)
    epochs_k = np.full(r.num_clients, rule.epochs, np.int32) if r.epochs_k is None else r.epochs_k
    epochs_k = jnp.asarray(epochs_k, jnp.int32)
    n_all = np.asarray(d.client_n)
    weights_all = jnp.asarray(n_all if o.weighting == 'samples' else np.ones_like(n_all),
                              jnp.float32)
    n_dev = jnp.asarray(n_all, jnp.int32)
    table = state.table
    active = jnp.asarray(r.active)
    stale = jnp.sum(active & (table.synced < r.t - 1)).astype(jnp.int32)
    clients, opt = list(state.clients), table.opt_state
    total = jax.tree.map(jnp.zeros_like, start)
    weight = jnp.zeros((), jnp.float32)
    up = jnp.zeros((), jnp.int32)
    up_ranks = jnp.zeros((len(matrix_leaves(start)),), jnp.int32)
    sums = {k: jnp.zeros((), jnp.float32) for k in ('loss', 'ce_mentor', 'ce_mentee')}
    for c, cohort in enumerate(fed.cohorts):
      slots, valid, gids = fed.plan(cohort, r.active)
      if not valid.any():
        continue
      keys = rng.client_keys(self.ctx.root, r.t,
                             fed.global_ids[np.minimum(gids, fed.num_clients - 1)], 'train')
      gi = jnp.asarray(gids)
      rows = lambda a, gi=gi: jnp.take(a, gi, axis=0, mode='clip')
      clients[c], opt, tot_c, w_c, up_c, ranks_c, loss_c = self._joint(
          clients[c], opt, jnp.asarray(slots), jnp.asarray(valid), gi, keys, rows(d.client_idx),
          rows(n_dev), rows(epochs_k), rows(weights_all), start, d.x_private, d.y_private,
          lr_scale, energy, mentor=cohort.kernels, joint=joint)
      total = jax.tree.map(jnp.add, total, tot_c)
      weight, up, up_ranks = weight + w_c, up + up_c, up_ranks + ranks_c
      sums = {k: sums[k] + loss_c[k] for k in sums}
    server, n_down, down_ranks = self._downlink(g, total, weight, energy)
    synced = jnp.where(active, r.t, table.synced).astype(jnp.int32)
    state = state.replace(clients=tuple(clients), server=server,
                          table=MenteeRows(opt_state=opt, synced=synced))
    n_act = int(np.sum(r.active))
    metrics = {k: v / n_act for k, v in {'train_loss': sums['loss'],
                                          'mentor_ce': sums['ce_mentor'],
                                          'mentee_ce': sums['ce_mentee']}.items()}
    metrics.update({'energy': self.energy(r.t), 'up_floats': up, 'down_floats': n_down,
                    'up_ranks': up_ranks, 'down_ranks': down_ranks, 'mentee_sync': stale,
                    'compression': up / (n_act * self.mentee_elements)})
    return state, base.RoundOutput(metrics, self.payloads(up, n_down, n_act, stale))

  def payloads(self, up, n_down, n_active, stale) -> list[comm.Payload]:
    """A round's traffic: ``up`` factor floats of all active clients, ``n_down`` floats of the
    server's factors to each of ``n_active`` clients, the whole mentee to ``stale`` clients."""
    return [comm.Payload('mentee_factors', comm.UP, 'float', up, 1),
            comm.Payload('mentee_factors', comm.DOWN, 'float', n_down, n_active, multicast=True),
            comm.Payload('mentee_sync', comm.DOWN, 'float', self.mentee_elements, stale)]

  # ----------------------------------------------------------- evaluation
  def evaluate(self, state):
    out = self.client_metrics(state, prefix='')   # UA: the mentors
    m = self.server_metrics(state)
    out.update({'mentee_acc': m['test_acc'], 'mentee_loss': m['test_loss']})
    split = self.server_split_metrics(state)
    if 'server_ua' in split:
      out['mentee_ua'] = split['server_ua']
    return out


def matrix_leaves(tree: Any) -> list:
  """The leaves of ``tree`` that are compressed (two or more axes), in flatten order."""
  return [leaf for leaf in jax.tree.leaves(tree) if leaf.ndim >= 2]


def factor_floats(shapes: list[tuple[int, ...]], ranks) -> int:
  """``sum_l k_l (m_l + n_l + 1)`` for matrices of ``shapes`` kept at ``ranks`` (host ints)."""
  return int(sum(int(k) * (math.prod(s[:-1]) + s[-1] + 1) for s, k in zip(shapes, ranks)))
