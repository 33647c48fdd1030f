"""FedAvg: federated learning with parameter exchange.

H. B. McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017; the "Benchmark 1: FL" of DS-FL (Itahara et
al., IEEE TMC 2021, §2.1, eqs. 1-3):
each round the active clients start from the global model ``w_0``, train
``train.epochs`` epochs, and the server sets
``w_0 = sum_k (I_k / I) w_k`` over them. Parameters *and* BatchNorm statistics
are averaged and counted as sent; each client keeps its own optimizer
state (as Keras would) unless ``train.fresh_optimizer`` (NIID-Bench, FedEntOpt).
Requires every client to use the same model spec.

This class is also the shared machinery of the other parameter-exchange
baselines FedEntOpt combines with client selection (FedProx, SCAFFOLD,
FedNova): broadcast, local training with :meth:`FedAvg.local_training`'s extra
options, :meth:`FedAvg.aggregate`, and the model-exchange payloads.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd.algorithms import base
from fedjax_kd.core.program import Program
from fedjax_kd.core.state import num_elements
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm
from fedjax_kd.ops import param_aggregate


def epoch_budgets(r: base.Round, epochs: int) -> np.ndarray:
  """``[S]`` epoch budgets of the round's clients on the host (stragglers' or all ``epochs``)."""
  return np.full(r.num_clients, epochs) if r.epochs_k is None else np.asarray(r.epochs_k)


def round_epochs(r: base.Round, epochs: int) -> jax.Array:
  """``[S]`` int32 epoch budgets of the round's clients, on the device."""
  return jnp.asarray(epoch_budgets(r, epochs), jnp.int32)


def client_weights(r: base.Round, weighted: bool) -> jax.Array:
  """``[S]`` aggregation weights: ``active`` (plain mean) or ``n_k * active``."""
  w = r.active * (np.asarray(r.fed.data.client_n) if weighted else 1.0)
  return jnp.asarray(w, jnp.float32)


@jax.jit
def broadcast(cohort, server, mask):
  """Sets params and batch stats of rows with ``mask`` to the server's model."""
  def put(c, s):
    m = mask.reshape((-1,) + (1,) * (c.ndim - 1))
    return jnp.where(m, jnp.broadcast_to(s, c.shape), c)
  return cohort.replace(params=jax.tree.map(put, cohort.params, server.params),
                        batch_stats=jax.tree.map(put, cohort.batch_stats, server.batch_stats))


class FedAvg(base.Algorithm):
  name = 'fedavg'
  uses_public = False
  has_server_model = True
  one_architecture = True
  # Why the server update needs plain SGD with momentum < 1 ('' = any optimizer).
  sgd_only: ClassVar[str] = ''

  @classmethod
  def options_from_config(cls, config, spec):
    if cls.sgd_only and spec.train.optimizer != 'sgd':
      raise ConfigError('train.optimizer', spec.train.optimizer, f"'sgd' ({cls.sgd_only})")
    if cls.sgd_only and spec.train.momentum >= 1.0:
      raise ConfigError('train.momentum', spec.train.momentum,
                        f'a number in [0, 1) ({cls.sgd_only})')
    return super().options_from_config(config, spec)

  def __init__(self, ctx):
    # The global model has the clients' architecture whatever server.model says.
    ctx = dataclasses.replace(ctx, spec=dataclasses.replace(
        ctx.spec, server=dataclasses.replace(ctx.spec.server, model=ctx.spec.clients.models[0])))
    super().__init__(ctx)

  @functools.cached_property
  def model_elements(self) -> int:
    """Floats in one copy of the global model: its parameters and BatchNorm statistics.

    From the model's shapes alone (``jax.eval_shape`` of its initialisation: nothing is
    computed), so it needs no :meth:`init` and no state.
    """
    server = jax.eval_shape(self.server_model.init, self.ctx.root)
    return num_elements(server.params) + num_elements(server.batch_stats)

  def setup_payloads(self):
    # The initial global model is broadcast once (DS-FL counts 1 + r(K+1) models).
    return [comm.Payload('params', comm.DOWN, 'float', self.model_elements, self.num_clients,
                         multicast=True)]

  # ------------------------------------------------------------ hooks
  def local_training(self, state, r: base.Round) -> tuple[Program, Any, dict | None]:
    """``(program, row, shared)`` of the clients' local training (:meth:`train_clients`'s
    arguments): FedProx and SCAFFOLD chain their transforms onto :meth:`train_program` and
    give their data; FedRS and FedLC train on a loss of their own."""
    del state, r
    return self.train_program(), None, None

  def programs(self, shapes):
    return (self.planned_training(*self.local_training(shapes, self.planning_round())),)

  def local_steps(self, r: base.Round) -> np.ndarray:
    """``[S]`` local SGD steps each client of the round runs (0 if inactive).

    ``epochs_k * ceil(n_k / batch)``: the engine keeps the partial last batch
    and skips steps without a real sample, so this is the executed count.
    """
    tr = self.spec.train
    epochs = epoch_budgets(r, tr.epochs)   # the budgets the engine ran
    n = np.asarray(r.fed.data.client_n)
    return np.where(r.active, epochs * -(-n // tr.batch_size), 0).astype(np.float32)

  def aggregate(self, state, start, r: base.Round):
    """The new global model from the trained cohort (FedAvg: ``n_k``-weighted mean)."""
    del start
    cohort = state.clients[0]
    weights = client_weights(r, weighted=True)
    return state.server.replace(
        params=param_aggregate.weighted_average(cohort.params, weights),
        batch_stats=param_aggregate.weighted_average(cohort.batch_stats, weights))

  def after_round(self, state, start, r: base.Round):
    """State updates after aggregation (SCAFFOLD's control variates)."""
    del start, r
    return state

  def payloads(self, active: np.ndarray) -> list[comm.Payload]:
    return comm.model_exchange(int(np.sum(active)), self.model_elements)

  def selection_losses(self, state, candidates: np.ndarray) -> np.ndarray:
    """Power-of-Choice: the *global* model's loss on each candidate's data (NaN for the
    others), without copying it into the cohort."""
    _, nll = self.ctx.fed.evaluate(state.clients, active=candidates, split='train',
                                   chunk=self.spec.eval.chunk, models=(state.server,))
    return nll

  # ------------------------------------------------------------ round
  def round(self, state, r):
    (cohort,) = state.clients
    mask = jnp.asarray(r.active)
    start = state.server
    cohort = broadcast(cohort, state.server, mask)
    state = state.replace(clients=(cohort,))
    state, loss = self.train_clients(state, r, *self.local_training(state, r))
    state = state.replace(server=self.aggregate(state, start, r))
    state = self.after_round(state, start, r)
    # ``loss`` is a device scalar; ``play_round`` reads it with the round's other outputs.
    return state, base.RoundOutput({'train_loss': loss}, self.payloads(r.active))

  def evaluate(self, state):
    out = self.server_metrics(state)
    out.update(self.server_split_metrics(state))
    out.update(self.client_metrics(state))
    return out
