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
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg
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


def _ala_client(kernels, st, key, row, shared, *, options):
  """One client's ALA: learns W on its sample, returns the mixed top leaves, W, the epochs
  run and the last recorded loss (a ``map_clients`` function)."""
  top, batch, percent, window, max_epochs, eta, threshold = options
  idx, n = row['idx'], row['n']
  n_max = idx.shape[0]
  num = jnp.maximum(n * percent // 100, 1)
  steps = max(1, -(-max(n_max * percent // 100, 1) // batch))
  k_start, k_drop = jax.random.split(key)
  start = jax.random.randint(k_start, (), 0, jnp.maximum(n - num + 1, 1))
  offsets = jnp.arange(steps * batch, dtype=jnp.int32).reshape(steps, batch)
  valid = offsets < num
  rows = idx[jnp.clip(start + offsets, 0, n_max - 1)]
  global_ = shared['global']
  base_params = global_    # lower layers: the global model
  local_top = ala.take_leaves(st.params, top)
  global_top = ala.take_leaves(global_, top)

  def batch_loss(theta_top, b, k):
    params = ala.put_leaves(base_params, top, theta_top)
    x = kernels.inputs(shared['x'][rows[b]])
    kwargs = dict(train=True, mask=valid[b], rngs={'dropout': k})
    if st.batch_stats:
      logits, _ = kernels.apply(params, st.batch_stats, x, mutable=['batch_stats'], **kwargs)
    else:
      logits = kernels.apply(params, st.batch_stats, x, **kwargs)
    return losses.masked_mean(losses.cross_entropy(logits, shared['y'][rows[b]]), valid[b])

  def epoch(w, e):
    def one(w, b):
      k = jax.random.fold_in(k_drop, e * 1_000_003 + b)
      new, value = ala.step(lambda th: batch_loss(th, b, k), w, local_top, global_top, eta)
      ok = jnp.any(valid[b])
      return tuple(jnp.where(ok, a, o) for a, o in zip(new, w)), (value, ok)

    w, (values, ok) = jax.lax.scan(one, w, jnp.arange(steps, dtype=jnp.uint32))
    last = values[jnp.maximum(jnp.sum(ok) - 1, 0)]    # the epoch's last real minibatch
    return w, last

  def cond(carry):
    _, e, hist, count, _ = carry
    more = row['converge'] & (e < max_epochs) & ~ala.converged(hist, count, window, threshold)
    return (e < 1) | more

  def body(carry):
    w, e, hist, count, _ = carry
    w, last = epoch(w, e.astype(jnp.uint32))
    return w, e + 1, hist.at[count % window].set(last), count + 1, last

  init = (tuple(row['w']), jnp.int32(0), jnp.zeros((window,), jnp.float32), jnp.int32(0),
          jnp.float32(jnp.nan))
  w, e, _, _, last = jax.lax.while_loop(cond, body, init)
  return ala.mix(local_top, global_top, w), w, e, last


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

  def init(self):
    state = super().init()
    k = self.num_clients
    w = tuple(jnp.ones_like(a) for a in ala.take_leaves(state.clients[0].params, self.top))
    return state.replace(table=FedALATable(w=w, trained=jnp.zeros((k,), bool),
                                           started=jnp.zeros((k,), bool)))

  def round(self, state, r):
    o = self.options
    (cohort,) = state.clients
    tab = state.table
    d = r.fed.data
    act = jnp.asarray(r.active)
    use_ala = act & tab.trained
    fresh = act & ~tab.trained
    s = r.num_clients
    fill = (ala.take_leaves(cohort.params, self.top), tab.w, jnp.zeros((s,), jnp.int32),
            jnp.full((s,), jnp.nan, jnp.float32))
    static = (self.top, self.spec.train.batch_size, o.percent, o.window, o.max_start_epochs,
              o.eta, o.threshold)
    top_vals, w, epochs, last = r.fed.map_clients(
        state.clients, self.ctx.root, r.t, 'custom', _ala_client,
        per_client={'w': tab.w, 'idx': d.client_idx, 'n': jnp.asarray(d.client_n, jnp.int32),
                    'converge': use_ala & ~tab.started},
        shared={'global': jax.tree.map(lambda a: a[0], state.server.params),
                'x': d.x_private, 'y': d.y_private},
        fill=fill, options=static, active=r.active)
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
