"""FedALA: adaptive local aggregation of the global model into each client's local model.

J. Zhang, Y. Hua, H. Wang, T. Song, Z. Xue, R. Ma, H. Guan, "FedALA: Adaptive Local
Aggregation for Personalized Federated Learning", AAAI 2023 (Algorithm 1, Eqs. 3-5; the
authors' code, github.com/TsingZ0/FedALA, ``system/utils/ALA.py``), a personalised-FL
baseline of ACE-pFL (He et al., IEEE/ACM ToN 2025, Tables I-III).

Every client keeps its own local model ``theta_k`` (its row of ``state.clients``). In a round
each participating client

1. initialises its model by ALA (:mod:`fedjax_kd.ops.ala`): the lower layers take the global
   model ``theta_g``; the top ``fedala.layers`` layers take
   ``theta_k + (theta_g - theta_k) * W_k`` with element-wise weights ``W_k`` in [0, 1] (one
   per parameter of those layers, kept in the client table, initialised to 1). ``W_k`` is
   first learned by ``W <- clip(W - eta * dL/dtheta_hat * (theta_g - theta_k), 0, 1)``
   after every minibatch of a random ``fedala.percent`` % of the client's data (CE, the
   local objective);
2. trains locally (``train.*``, CE), as FedAvg;
3. uploads its model; the server averages the uploads weighted by ``n_k`` (FedAvg).

What the paper leaves open, and what we do (the authors' code where it says):

* **the sample** (``s`` %): a contiguous slice of ``floor(s n_k / 100)`` (at least 1) of the
  client's rows from a uniform random start, drawn afresh each round, visited in order in
  minibatches of ``train.batch_size`` with the partial last batch kept (``ALA.py``:
  ``train_data[rand_idx:rand_idx + rand_num]``, ``drop_last=False``);
* **how long W learns**: the client's first ALA call trains W for epochs over the sample
  until the population std of the last ``fedala.window`` (10) recorded losses falls below
  ``fedala.threshold`` (0.1), with more than ``window`` recorded, where one loss is recorded
  per epoch (the last minibatch's, as the code does); later calls run one epoch.
  ``fedala.max_start_epochs`` (the code has none) bounds the first call, since all the
  round's clients are batched and the loop runs until the slowest stops;
* **the first round**: ALA is off for a client that has no trained local model yet (the
  code switches it off when the received and local models coincide, i.e. round 1 with a
  shared initialisation): it takes the global model, and its first ALA call (trained to
  convergence) comes at its second participation;
* **which clients run ALA**: the participants only (the code initialises every client each
  round, participants or not; with full participation the two agree);
* **layers** (``p``): the last ``p`` modules with parameters in the forward pass's call order
  (a Dense or a Conv with its bias, a BatchNorm's scale and bias); the code counts parameter
  tensors, and its default ``-p 2`` (weight and bias of the head) is ``layers = 1``;
* **forward mode of W learning**: training mode (dropout on, BatchNorm on batch statistics;
  the copy in the code inherits train mode), with the client's own running statistics left
  untouched;
* **BatchNorm statistics**: ALA touches parameters only, so a client keeps its own running
  statistics (the code's buffers); a client without a local model takes the global ones.
  The server averages them with the parameters and they are counted as sent, as FedAvg here;
* **what is evaluated**: the client models after local training, each on its own test split
  with ``data.per_client_test`` (ACE-pFL's protocol; ``test_acc`` is their unweighted mean).
  The code evaluates at the start of a round, after ALA and before training. The global model
  is reported as ``global_test_acc`` (and ``server_ua``).

Defaults: ``eta = 1.0``, ``s = 80``, ``p = 1`` layer, threshold 0.1, window 10 (the code's
``run_me.sh`` and ``ALA.py``; the paper's hyper-parameter section states ``s = 80``,
``p = 1``). Bytes: FedAvg's model exchange (the ALA weights never leave the client).
Requires one architecture for all clients.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import flax
import jax
import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.core.program import Batches, Program
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import ala
from fedjax_kd.ops import losses


@dataclasses.dataclass(frozen=True)
class FedALAOptions:
  """``fedala.*`` (the authors' code's defaults)."""
  group: ClassVar[str] = 'fedala'
  eta: float = options.option(1.0, 'learning rate of the ALA weights W', gt=0)
  percent: int = options.option(80, "s: the % of a client's rows W learns on", ge=1, le=100)
  layers: int = options.option(1, 'p: the top layers ALA mixes (lower ones take the global '
                               'model)', ge=1)
  threshold: float = options.option(0.1, "the first ALA call's stop rule: std of the last "
                                    '`window` losses below this', gt=0)
  window: int = options.option(10, 'losses (one per epoch) the stop rule looks at', ge=1)
  max_start_epochs: int = options.option(100, "bound on the first ALA call's epochs (the "
                                         'code has none)', ge=1)


@flax.struct.dataclass
class FedALATable:
  """Per client (rows: clients).

  Attributes:
    w: the ALA weights, one ``[K, *leaf]`` array per parameter leaf of the top layers.
    trained: ``[K]`` bool, the client has a local model of its own (it has trained).
    started: ``[K]`` bool, its W has been learned at least once (later calls: one epoch).
  """
  w: Any
  trained: Any
  started: Any


class ALACarry(NamedTuple):
  """The ALA loop's carry: the weights, the ring buffer of each epoch's last loss, how many
  epochs ran and the last real minibatch's loss."""
  w: tuple
  hist: jax.Array
  count: jax.Array
  last: jax.Array


@dataclasses.dataclass(frozen=True)
class ALA(Program):
  """One client's ALA (Eq. 4-5): learns the weights ``W`` of its top layers ``top`` (leaf
  indices) on one random window of ``percent`` % of its private rows, in batches of
  ``batch_size``: one epoch, or (``row['converge']``, its first call) epochs until the
  population std of the last ``window`` epochs' losses is below ``threshold``, at most
  ``max_epochs``. The lower layers are the global model's (``shared['global']``).

  Inputs ``row = {'w': the client's W, 'converge'}``. Outputs ``(the mixed top leaves, W,
  epochs run, the last recorded loss)``; the stored model is read only.
  """
  top: tuple
  batch_size: int
  percent: int
  window: int
  max_epochs: int
  eta: float
  threshold: float
  writes = False

  @property
  def batches(self):
    return Batches(self.max_epochs, self.batch_size, order='window', percent=self.percent,
                   until=True)

  def init(self, c, row, shared):
    return ALACarry(tuple(row['w']), jnp.zeros((self.window,), jnp.float32), jnp.int32(0),
                    jnp.float32(jnp.nan))

  def step(self, c, carry, batch, row, shared):
    st, k, global_ = c.model, c.kernels, shared['global']

    def loss(theta_top):
      params = ala.put_leaves(global_, self.top, theta_top)   # lower layers: the global model
      kwargs = dict(train=True, mask=batch.valid, rngs={'dropout': batch.key})
      if st.batch_stats:
        logits, _ = k.apply(params, st.batch_stats, batch.data['x'], mutable=['batch_stats'],
                            **kwargs)
      else:
        logits = k.apply(params, st.batch_stats, batch.data['x'], **kwargs)
      return losses.masked_mean(losses.cross_entropy(logits, batch.data['y']), batch.valid)

    w, value = ala.step(loss, carry.w, ala.take_leaves(st.params, self.top),
                        ala.take_leaves(global_, self.top), self.eta)
    return carry._replace(w=w, last=value), value

  def more(self, c, carry, row, shared):
    hist = carry.hist.at[carry.count % self.window].set(carry.last)
    count = carry.count + 1
    go = row['converge'] & ~ala.converged(hist, count, self.window, self.threshold)
    return carry._replace(hist=hist, count=count), go

  def final(self, c, carry, row, shared):
    local_top = ala.take_leaves(c.model.params, self.top)
    mixed = ala.mix(local_top, ala.take_leaves(shared['global'], self.top), carry.w)
    return None, (mixed, carry.w, carry.count, carry.last)


@functools.partial(jax.jit, static_argnames=('top',))
def _initialise(cohort, server, use_ala, fresh, top_vals, *, top):
  """The round's starting models: ALA-mixed top layers and global lower layers for the
  ``use_ala`` rows, the global model for the ``fresh`` rows, the rest unchanged."""
  def rows(mask, a, b):
    return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

  take = use_ala | fresh
  params = jax.tree.map(lambda c, s: rows(take, jnp.broadcast_to(s, c.shape), c),
                        cohort.params, server.params)
  mixed = tuple(rows(use_ala, v, p) for v, p in zip(top_vals, ala.take_leaves(params, top)))
  params = ala.put_leaves(params, top, mixed)
  stats = jax.tree.map(lambda c, s: rows(fresh, jnp.broadcast_to(s, c.shape), c),
                       cohort.batch_stats, server.batch_stats)
  return cohort.replace(params=params, batch_stats=stats)


class FedALA(FedAvg):
  """FedALA; see the module docstring."""
  name = 'fedala'
  options_class = FedALAOptions
  paper_rules = 'acepfl'

  def __init__(self, ctx):
    super().__init__(ctx)
    o = self.options
    d = self.ctx.data
    shapes = jax.eval_shape(self.server_model.init, self.ctx.root)
    x = jnp.zeros((1,) + tuple(d.input_shape), d.model_input_dtype)
    module = self.server_model.kernels.module
    n_layers = len(ala.layer_order(module, x))
    if o.layers > n_layers:
      raise ConfigError('fedala.layers', o.layers,
                        f'an integer in [1, {n_layers}] (the layers with parameters of '
                        f'{self.spec.clients.models[0]})')
    self.top = ala.top_layers(module, x, shapes.params, o.layers)
    self.ala = ALA(tuple(self.top), self.spec.train.batch_size, o.percent, o.window,
                   o.max_start_epochs, o.eta, o.threshold)

  def programs(self, shapes):
    k = self.num_clients
    row = {'w': shapes.table.w, 'converge': jax.ShapeDtypeStruct((k,), jnp.bool_)}
    shared = {'global': jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                                     shapes.server.params)}
    return (base.planned(self.ala, self.private_rows(), row, shared),
            *super().programs(shapes))

  def init(self):
    state = super().init()
    k = self.num_clients
    w = tuple(jnp.ones_like(a) for a in ala.take_leaves(state.clients[0].params, self.top))
    return state.replace(table=FedALATable(w=w, trained=jnp.zeros((k,), bool),
                                           started=jnp.zeros((k,), bool)))

  def round(self, state, r):
    (cohort,) = state.clients
    tab = state.table
    act = jnp.asarray(r.active)
    use_ala = act & tab.trained
    fresh = act & ~tab.trained
    s = r.num_clients
    fill = (ala.take_leaves(cohort.params, self.top), tab.w, jnp.zeros((s,), jnp.int32),
            jnp.full((s,), jnp.nan, jnp.float32))
    top_vals, w, epochs, last = r.fed.run(
        self.ala, state.clients, self.ctx.root, r.t, 'custom', data=self.private_rows(r.fed),
        row={'w': tab.w, 'converge': use_ala & ~tab.started},
        shared={'global': jax.tree.map(lambda a: a[0], state.server.params)},
        fill=fill, active=r.active).out
    cohort = _initialise(cohort, state.server, use_ala, fresh, top_vals, top=self.top)
    table = FedALATable(w=tuple(base.rows_where(use_ala, a, b) for a, b in zip(w, tab.w)),
                        trained=tab.trained | act, started=tab.started | use_ala)
    start = state.server
    state = state.replace(clients=(cohort,), table=table)
    state, loss = self.train_clients(state, r, *self.local_training(state, r))
    state = state.replace(server=self.aggregate(state, start, r))
    n_ala = jnp.sum(use_ala)
    metrics = {'train_loss': loss, 'ala_clients': n_ala,
               'ala_epochs': jnp.sum(jnp.where(use_ala, epochs, 0)) / jnp.maximum(n_ala, 1),
               'ala_loss': jnp.sum(jnp.where(use_ala, last, 0.0)) / jnp.maximum(n_ala, 1)}
    return state, base.RoundOutput(metrics, self.payloads(r.active))

  def evaluate(self, state):
    out = self.client_metrics(state, prefix='')
    out.update({f'global_{k}': v for k, v in self.server_metrics(state).items()})
    out.update(self.server_split_metrics(state))
    return out
