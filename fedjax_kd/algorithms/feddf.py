"""FedDF: ensemble distillation for model fusion, one global model per architecture.

T. Lin, L. Kong, S. U. Stich, M. Jaggi, "Ensemble Distillation for Robust Model Fusion in
Federated Learning", NeurIPS 2020 (Algorithm 1 and its heterogeneous-model variant); a
baseline of ACE-pFL (He et al., IEEE/ACM ToN 2025). Clients are grouped by model spec
(the federation's cohorts: FedDF's "prototypes"); group ``g`` has a global model ``x_g``
(``state.extra.models[g]``). Round ``r``:

1. each active client of group ``g`` receives ``x_g`` and trains ``train.epochs`` epochs on
   its private data (CE, ``train.*``);
2. the server averages each group's received models, ``x_g <- sum_{k in S_g} (n_k / n_S_g)
   x_k`` (FedAvg inside the group; parameters and BatchNorm statistics);
3. and distils every fused ``x_g`` on unlabelled data ``d`` (the round's
   ``distill.public_per_round`` public samples, held by the server) towards the ensemble of
   *all* participating clients, whatever their group: the teacher is the mean of their
   logits ``(1 / |S|) sum_{k in S} f(x_k, d)`` and the loss
   ``T^2 KL(softmax(teacher / T) || softmax(f(x_g, d) / T))``
   (:mod:`fedjax_kd.ops.fusion`).

Choices where the paper leaves room, or that this engine fixes:

* distillation runs a *fixed* number of Adam steps (the ``distill`` optimizer slot, so
  ``distill.optimizer = 'adam'`` and ``distill.learning_rate = 1e-3`` give the paper's
  optimizer): ``distill.epochs`` passes over the round's public sample in minibatches of
  ``distill.batch_size``, with a fresh optimizer state every round; the paper's early
  stopping on a held-out validation set (up to 1e4 steps, patience 1e3) is not done;
* ``feddf.temperature`` (default 1) is the softmax temperature of teacher and student;
* the teacher averages the clients' log-probabilities, which differ from their logits by
  a per-sample constant: the softmax of the mean is the paper's;
* a group with no participant in a round keeps its model (nothing to fuse, no distillation);
* the server holds the unlabelled set: clients never download it, so the setup costs no
  bytes.

Evaluation: every client holds its group's global model after the round, so ``test_acc``
is UA, the mean over clients of their group model's accuracy on the client's own test split
(``data.per_client_test``; the server test set otherwise); ``global_acc_<g>`` is group
``g``'s model on the server test set (groups in order of first appearance in
``clients.models``) and ``global_acc`` their mean. Bytes per round (``comm.model_exchange``
per group): each active client downloads and uploads one model of its own architecture
(its parameters and BatchNorm statistics, float32).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import fields
from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import broadcast
from fedjax_kd.core import rng
from fedjax_kd.core.federation import SingleModel
from fedjax_kd.core.state import num_elements
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm
from fedjax_kd.ops import fusion


@dataclasses.dataclass(frozen=True)
class FedDFOptions:
  """``feddf.*``."""
  group: ClassVar[str] = 'feddf'
  temperature: float = options.option(1.0, 'softmax temperature of the ensemble distillation',
                                      ge=fields.MIN_TEMPERATURE)


@flax.struct.dataclass
class FedDFServer:
  """One global model per architecture group (ModelStates with a leading axis of 1)."""
  models: tuple


class FedDF(base.Algorithm):
  """FedDF; see the module docstring."""
  name = 'feddf'
  options_class = FedDFOptions
  paper_rules = 'acepfl'
  uses_public = True
  samples_public = True
  has_server_model = False

  def __init__(self, ctx: base.Context):
    super().__init__(ctx)
    d = ctx.data
    if int(d.x_public.shape[0]) == 0:
      raise ConfigError('data.num_public', 0, 'an integer >= 1 (FedDF distils on unlabelled '
                        'public data)')
    self.specs = tuple(c.spec for c in ctx.fed.cohorts)
    self.group_of = {s: g for g, s in enumerate(self.specs)}
    self.group_models = tuple(
        SingleModel(ctx.modules[s], ctx.optimizers, d.input_shape,
                    ctx.spec.train.compute_dtype, normalize=d.normalize,
                    input_dtype=d.model_input_dtype) for s in self.specs)

  @functools.cached_property
  def model_elements(self) -> tuple[int, ...]:
    """Floats in one model of each group (parameters and BatchNorm statistics)."""
    out = []
    for sm in self.group_models:
      shape = jax.eval_shape(sm.init, self.ctx.root)
      out.append(num_elements(shape.params) + num_elements(shape.batch_stats))
    return tuple(out)

  def init(self) -> base.AlgState:
    state = super().init()
    key = rng.server_key(self.ctx.root, 0, 'init')
    return state.replace(extra=FedDFServer(models=tuple(sm.init(key)
                                                        for sm in self.group_models)))

  def setup_payloads(self) -> list[comm.Payload]:
    return []   # the server holds the unlabelled set; clients never need it

  def fusion_program(self):
    """The fused model's distillation towards the ensemble's logits (``batch['t']``), from
    a fresh optimizer state."""
    return dataclasses.replace(self.distill_program(fusion.TemperedKD(
        float(self.options.temperature))), fresh=True)

  def programs(self, shapes):
    del shapes
    d = self.ctx.data
    m = min(int(d.x_public.shape[0]), self.spec.distill.public_per_round)
    x = jax.ShapeDtypeStruct((m,) + tuple(d.x_public.shape[1:]), d.x_public.dtype)
    t = jax.ShapeDtypeStruct((m, int(d.num_classes)), jnp.float32)
    return (self.planned_training(),
            base.planned(self.fusion_program(), base.public_rows(x, 1, t=t), None, None,
                         server=True))

  def _distill(self, g: int, model, t: int, x, teacher):
    """Group ``g``'s fused model distils towards the ensemble ``teacher`` logits on ``x``."""
    key = jax.random.fold_in(rng.server_key(self.ctx.root, t, 'distill'), g)
    ran = self.group_models[g].run(self.fusion_program(), model, key,
                                   data=base.public_rows(x, 1, t=teacher))
    return ran.states, ran.metrics

  def round(self, state, r):
    fed = r.fed
    models = list(state.extra.models)
    clients = list(state.clients)
    payloads: list[comm.Payload] = []
    groups = []
    for c, cohort in enumerate(fed.cohorts):   # a view may hold only some groups
      g = self.group_of[cohort.spec]
      act_c = np.asarray(r.active)[cohort.client_ids]
      if act_c.any():
        clients[c] = broadcast(clients[c], models[g], jnp.asarray(act_c))
        payloads += comm.model_exchange(int(act_c.sum()), self.model_elements[g])
        groups.append((c, g, cohort, act_c))
    state = state.replace(clients=tuple(clients))
    # 1. Local training.
    state, train_loss = self.train_clients(state, r)
    # 3a. The ensemble of every participant on the round's unlabelled sample.
    _, x = self.sample_public(r.t)
    logp = fed.predict(state.clients, x, r.active, chunk=self.spec.eval.chunk, log=True)
    teacher = fusion.ensemble_logits(logp, jnp.asarray(r.active))
    n = np.asarray(fed.data.client_n)
    losses = []
    for c, g, cohort, act_c in groups:
      # 2. FedAvg inside the group, 3b. distillation of the fused model.
      w = jnp.asarray(n[cohort.client_ids] * act_c, jnp.float32)
      trained = state.clients[c]
      fused = models[g].replace(params=fusion.group_average(trained.params, w),
                                batch_stats=fusion.group_average(trained.batch_stats, w))
      models[g], loss = self._distill(g, fused, r.t, x, teacher)
      losses.append(loss)
    state = state.replace(extra=FedDFServer(models=tuple(models)))
    metrics: dict[str, Any] = {'train_loss': train_loss,
                               'distill_loss': base.nanmean(jnp.stack(losses))}
    return state, base.RoundOutput(metrics, payloads)

  def evaluate(self, state) -> dict[str, Any]:
    fed = self.ctx.fed
    d = fed.data
    chunk = self.spec.eval.chunk
    k = self.num_clients
    per_client = self.spec.data.per_client_test and d.test_idx is not None
    # Per group: its model's (acc, loss) on the test set (device scalars).
    groups = [sm.evaluate(model, d.x_test, d.y_test, chunk=chunk, read=False)[:2]
              for sm, model in zip(self.group_models, state.extra.models)]
    members = None
    if per_client:   # each client scored by its group's model on its own split
      members = fed.evaluate(state.clients, per_client_test=True, chunk=chunk, read=False,
                             models=state.extra.models)
    scores = (groups, members)

    def clients(host):
      """``[K]`` accuracies and losses: each client scored by its group's model."""
      groups, members = host
      if members is not None:
        return np.asarray(members[0], np.float64), np.asarray(members[1], np.float64)
      acc, nll = np.full(k, np.nan), np.full(k, np.nan)
      for cohort, (ga, gl) in zip(fed.cohorts, groups):
        acc[cohort.client_ids], nll[cohort.client_ids] = ga, gl
      return acc, nll

    def later(fn):
      return base.Later(scores, lambda host: fn(*clients(host)))

    out: dict[str, Any] = {f'global_acc_{g}': s[0] for g, s in enumerate(groups)}
    out.update({'test_acc': later(lambda acc, nll: np.nanmean(acc)),
                'test_loss': later(lambda acc, nll: np.nanmean(nll)),
                'client_acc_min': later(lambda acc, nll: np.nanmin(acc)),
                'client_acc_max': later(lambda acc, nll: np.nanmax(acc)),
                'global_acc': base.Later([s[0] for s in groups],
                                         lambda gas: np.mean([float(x) for x in gas]))})
    if per_client:
      nk = np.asarray(d.test_n, np.float64)
      out['test_acc_weighted'] = later(lambda acc, nll: base.weighted_mean(acc, nk))
    return out
