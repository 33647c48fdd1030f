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
   Keras-style, ``train.epochs`` epochs: the client program :class:`MutualDistillation`) both
   models take
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
from fedjax_kd.core.kernels import CohortKernels
from fedjax_kd.core.program import Batches, Program, forward
from fedjax_kd.core.state import ModelState, num_elements
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm
from fedjax_kd.ops import lowrank

WEIGHTING = ('samples', 'uniform')


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
class MutualDistillation(Program):
  """One client's round: its mentor (its own model) and the mentee (from the global one,
  ``shared['start']``, with its optimizer state ``row['opt']``) trained jointly, Keras-style
  epochs of ``batch_size``, both with ``train``'s optimizer and the round's learning-rate
  factor ``shared['lr_scale']`` (``fresh``: new optimizer states). The mentor is written
  back; the outputs are the mentee's optimizer state, its update rebuilt from its SVD factors
  at ``shared['energy']`` (compressed slot by slot outside the vmap: :meth:`finish`), the
  floats uploaded and the ranks kept. Step metrics: the loss and both task losses."""
  mentee: CohortKernels
  epochs: int
  batch_size: int
  augment: Any = None
  fresh: bool = False
  hidden: bool = True

  @property
  def batches(self):
    return Batches(self.epochs, self.batch_size, augment=self.augment)

  def init(self, c, row, shared):
    tx = c.kernels.optimizers['train']
    st, opt_s, start = c.model, row['opt'], shared['start']
    if self.fresh:
      st = st.replace(opt_state={**st.opt_state, 'train': tx.init(st.params)})
      opt_s = tx.init(start['params'])
    return st, ModelState(params=start['params'], batch_stats=start['batch_stats'],
                          opt_state=opt_s)

  def step(self, c, carry, batch, row, shared):
    t_st, s_st = carry
    tx = c.kernels.optimizers['train']
    x, y, valid = batch.data['x'], batch.data['y'], batch.valid
    k_t, k_s = jax.random.split(batch.key)

    def loss(pt, ps):
      lt, bt = forward(c.kernels, pt, t_st.batch_stats, x, valid, k_t)
      ls, bs = forward(self.mentee, ps, s_st.batch_stats, x, valid, k_s)
      ht = hs = None
      if self.hidden:   # same dropout keys: the features of the same forward pass
        ht, _ = forward(c.kernels, pt, t_st.batch_stats, x, valid, k_t, embed=True)
        hs, _ = forward(self.mentee, ps, s_st.batch_stats, x, valid, k_s, embed=True)
        ht, hs = ht.reshape(ht.shape[0], -1), hs.reshape(hs.shape[0], -1)
      total, parts = lowrank.mutual_distillation_loss(lt, ls, y, valid, ht, hs)
      return total, (bt, bs, parts)

    (value, (bt, bs, parts)), (gt, gs) = jax.value_and_grad(
        loss, argnums=(0, 1), has_aux=True)(t_st.params, s_st.params)
    scale = lambda u: u * shared['lr_scale'].astype(u.dtype)
    ut, ot = tx.update(gt, t_st.opt_state['train'], t_st.params)
    us, os_ = tx.update(gs, s_st.opt_state, s_st.params)
    new_t = ModelState(params=optax.apply_updates(t_st.params, jax.tree.map(scale, ut)),
                       batch_stats=bt, opt_state={**t_st.opt_state, 'train': ot})
    new_s = ModelState(params=optax.apply_updates(s_st.params, jax.tree.map(scale, us)),
                       batch_stats=bs, opt_state=os_)
    return (new_t, new_s), {'loss': value, 'ce_mentor': parts['ce_t'],
                            'ce_mentee': parts['ce_s']}

  def final(self, c, carry, row, shared):
    st, ms = carry
    delta = jax.tree.map(lambda new, old: new - old,
                         {'params': ms.params, 'batch_stats': ms.batch_stats}, shared['start'])
    return st, {'opt': ms.opt_state, 'delta': delta}

  def finish(self, outputs, shared):
    rec, up, ranks = lowrank.compress_each(outputs['delta'], shared['energy'])
    return {'opt': outputs['opt'], 'rec': rec, 'up': up, 'ranks': ranks}


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
    self._downlink = jax.jit(self._downlink_impl)

  def local(self) -> MutualDistillation:
    tr = self.spec.train
    return MutualDistillation(self.mentee, tr.epochs, tr.batch_size, self.augment,
                              tr.fresh_optimizer, bool(self.options.hidden))

  def _shared(self, server, t: int) -> dict:
    """The program's shared inputs: the global mentee, the round's energy and lr factor."""
    return self.training_shared(t, {
        'start': {'params': jax.tree.map(lambda a: a[0], server.params),
                  'batch_stats': jax.tree.map(lambda a: a[0], server.batch_stats)},
        'energy': jnp.float32(self.energy(t))})

  def programs(self, shapes):
    return (base.planned(self.local(), self.private_rows(), {'opt': shapes.table.opt_state},
                         jax.eval_shape(lambda s: self._shared(s, 1), shapes.server)),)

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

  def _downlink_impl(self, server: ModelState, total: dict, weight, energy):
    """The server's step: the mean update compressed at ``energy`` and added to the mentee."""
    down, n_down, ranks = lowrank.server_downlink(total, weight, energy)
    add = lambda g, d: g + d[None].astype(g.dtype)
    return server.replace(params=jax.tree.map(add, server.params, down['params']),
                          batch_stats=jax.tree.map(add, server.batch_stats,
                                                   down['batch_stats'])), n_down, ranks

  # ---------------------------------------------------------------- round
  def round(self, state, r):
    d, o = r.fed.data, self.options
    energy = jnp.float32(self.energy(r.t))
    n_all = np.asarray(d.client_n)
    active = jnp.asarray(r.active)
    weights = jnp.asarray(r.active * (n_all if o.weighting == 'samples' else 1), jnp.float32)
    table = state.table
    stale = jnp.sum(active & (table.synced < r.t - 1)).astype(jnp.int32)
    ran = r.fed.run(self.local(), state.clients, self.ctx.root, r.t, 'train',
                    data=self.private_rows(r.fed), row={'opt': table.opt_state},
                    shared=self._shared(state.server, r.t), active=r.active,
                    epochs=r.epochs_k)
    out = ran.out
    total = lowrank.weighted_sum(out['rec'], weights)   # the inactive rows weigh 0
    server, n_down, down_ranks = self._downlink(state.server, total, jnp.sum(weights), energy)
    opt = jax.tree.map(lambda new, old: base.rows_where(active, new, old), out['opt'],
                       table.opt_state)
    synced = jnp.where(active, r.t, table.synced).astype(jnp.int32)
    state = state.replace(clients=ran.states, server=server,
                          table=MenteeRows(opt_state=opt, synced=synced))
    n_act = int(np.sum(r.active))
    up = jnp.sum(out['up'])
    metrics = {k: jnp.nansum(ran.metrics[part]) / n_act
               for k, part in (('train_loss', 'loss'), ('mentor_ce', 'ce_mentor'),
                               ('mentee_ce', 'ce_mentee'))}
    metrics.update({'energy': self.energy(r.t), 'up_floats': up, 'down_floats': n_down,
                    'up_ranks': jnp.sum(out['ranks'], axis=0), 'down_ranks': down_ranks,
                    'mentee_sync': stale, 'compression': up / (n_act * self.mentee_elements)})
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
