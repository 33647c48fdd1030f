"""SCDPFL: spectral co-distillation of a generic and a personalised model.

Z. Chen, H. H. Yang, T. Q. S. Quek, K. F. E. Chong, "Spectral Co-Distillation for
Personalized Federated Learning", NeurIPS 2023; a baseline of FedCache 2.0 (Table III:
Adam, lr 0.01, batch 64, 2 local epochs, ``lambda_l = 0.4``, ``lambda_g = 0.3``).

Every client keeps a personalised model (PM, the client rows ``state.clients``); the server
keeps one generic model (GM, ``state.server``) trained FedAvg-style. In round ``r`` each
active client ``i``:

1. GM training: from the received ``w_G^r``, ``train.epochs`` epochs on its data of
   ``CE + lambda_g * KL(S_trunc(w_i^P) || S_trunc(w))``: the truncated spectrum of its
   PM distils into the generic copy ``w``;
2. PM training: ``CE + lambda_l * KL(S(w_G^r) || S(w_i^P))``: the full spectrum of the
   received GM distils into the PM;
3. uploads its GM copy; the server averages them weighted by ``n_i`` (FedAvg).

``S(w)`` is the normalised magnitude of the Fourier spectrum of the model's weight
tensors, ``S_trunc`` its truncated version (:mod:`fedjax_kd.ops.spectral`, which states the
exact construction). Choices where the paper or its code leave room:

* the spectrum and the truncation follow the authors' public code (PyTorch-layout weight
  matrices, 2-D DFT magnitudes, normalised by their sum, ``ratio = 0.4`` kept), except that
  the truncation keeps the first ``ratio`` of *each* weight's spectrum (the code keeps the
  first ``ratio`` of the concatenation over layers) and the truncated vector is renormalised;
* the distance is ``KL(teacher || student)`` summed over the entries and *differentiated*:
  the authors' code computes the spectra in NumPy, outside autograd, so its spectral terms
  add a constant to the loss; it also applies a log-softmax to the already normalised
  student spectrum and averages over entries (we do neither: a plain KL);
* both teachers are the round's start models (the PM before step 2 teaches step 1, the
  received GM teaches step 2), so the two trainings are independent, as the paper's
  wait-free protocol allows (PM training runs while the client waits for the aggregate);
  the code's PM teacher is the received GM too;
* the code's optional proximal term ``beta ||w_G - w_P||`` (off in FedCache 2.0's
  setting) is left out;
* the GM copy starts each round from a fresh optimizer state (the code builds a new
  optimizer every call); the PM keeps its own unless ``train.fresh_optimizer``;
* BatchNorm statistics of the GM are averaged and counted as sent, as in FedAvg.

Evaluation: ``test_acc`` is UA, the mean over clients of each PM's accuracy on the
client's own test split (``data.per_client_test``; the server test set otherwise);
``global_acc`` / ``global_loss`` are the GM's on the server test set and ``server_ua`` the
GM's UA. Bytes (FedCache 2.0, App. D): the GM down and up per active client per round
(``comm.model_exchange``) and the initial GM broadcast once, as FedAvg. One architecture for
every client (the GM is averaged).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg, broadcast, client_weights
from fedjax_kd.core.program import Transform, ce_loss
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops import spectral


@dataclasses.dataclass(frozen=True)
class SCDPFLOptions:
  """``scdpfl.*`` (FedCache 2.0 Table III; ``ratio`` from the authors' code)."""
  group: ClassVar[str] = 'scdpfl'
  lambda_g: float = options.option(0.3, "weight of the GM's spectral term (PM teaches GM)",
                                   ge=0)
  lambda_l: float = options.option(0.4, "weight of the PM's spectral term (GM teaches PM)",
                                   ge=0)
  ratio: float = options.option(0.4, "fraction of each weight's spectrum kept in the GM's "
                                'term', gt=0, le=1)


def spectral_objective(logits, y, params, q, lam: float, ratio: float):
  """One minibatch's SCDPFL objective: ``mean CE(logits, y) + lam * KL(q || S_ratio(params))``
  (what local training with :class:`SpectralTerm` minimises; for tests and reading)."""
  ce = jnp.mean(ce_loss(logits, {'y': y}, {}))
  return ce + lam * spectral.spectral_kl(q, params, ratio)


@dataclasses.dataclass(frozen=True)
class SpectralTerm(Transform):
  """``lam * KL(q || S_ratio(w))`` added to the local loss, whose teacher spectrum ``q`` is
  the client's own (``row['q']``, the GM step) or everybody's (``shared['q']``, the PM
  step). Hashable: equal options, one compile."""
  lam: float
  ratio: float
  per_client: bool

  def penalty(self, params, start, row, shared):
    del start
    q = row['q'] if self.per_client else shared['q']
    return self.lam * spectral.spectral_kl(q, params, self.ratio)


class SCDPFL(FedAvg):
  """SCDPFL; see the module docstring."""
  name = 'scdpfl'
  options_class = SCDPFLOptions
  paper_rules = 'fedcache2'

  def _program(self, teacher: str):
    """The training program of the GM (``teacher='pm'``: from the global model, a fresh
    optimizer, the PM's truncated spectrum per client) or of the PM (``'gm'``)."""
    o = self.options
    gm = teacher == 'pm'
    lam, ratio = (o.lambda_g, o.ratio) if gm else (o.lambda_l, 1.0)
    program = self.train_program(*([SpectralTerm(float(lam), float(ratio), gm)] if lam else []))
    return dataclasses.replace(program, fresh=True) if gm else program

  def _train(self, cohort, r: base.Round, phase: str, teacher: str, q):
    """Trains the active rows of ``cohort`` with the spectral penalty; ``(cohort, loss)``."""
    per_client = teacher == 'pm'
    ran = r.fed.run(self._program(teacher), (cohort,), self.ctx.root, r.t, phase,
                    data=self.private_rows(r.fed), row={'q': q} if per_client else None,
                    shared=self.training_shared(r.t, None if per_client else {'q': q}),
                    active=r.active, epochs=r.epochs_k)
    return ran.states[0], base.nanmean(ran.metrics)

  def programs(self, shapes):
    o = self.options
    q_pm = jax.eval_shape(lambda p: spectral.stacked_distributions(p, o.ratio),
                          shapes.clients[0].params)
    q_gm = jax.eval_shape(lambda p: spectral.stacked_distributions(p, 1.0)[0],
                          shapes.server.params)
    return (self.planned_training(self._program('pm'), {'q': q_pm}),
            self.planned_training(self._program('gm'), shared={'q': q_gm}))

  def round(self, state, r):
    o = self.options
    (pm,) = state.clients
    act = jnp.asarray(r.active)
    # Teachers: the round's start models (module docstring).
    q_pm = spectral.stacked_distributions(pm.params, o.ratio)            # [S, M_trunc]
    q_gm = spectral.stacked_distributions(state.server.params, 1.0)[0]   # [M]
    # 1. GM training from w_G^r (fresh optimizer), the PM's truncated spectrum as teacher.
    gm = broadcast(pm, state.server, jnp.ones_like(act))
    gm, gm_loss = self._train(gm, r, 'train', 'pm', q_pm)
    # 2. PM training, the GM's full spectrum as teacher.
    pm, pm_loss = self._train(pm, r, 'custom', 'gm', q_gm)
    # 3. FedAvg of the GM copies.
    weights = client_weights(r, weighted=True)
    server = state.server.replace(
        params=param_aggregate.weighted_average(gm.params, weights),
        batch_stats=param_aggregate.weighted_average(gm.batch_stats, weights))
    state = state.replace(clients=(pm,), server=server)
    return state, base.RoundOutput({'train_loss': gm_loss, 'pm_train_loss': pm_loss},
                                   self.payloads(r.active))

  def evaluate(self, state):
    out = self.client_metrics(state, prefix='')   # test_acc: UA of the PMs
    g = self.server_metrics(state)
    out.update({'global_acc': g['test_acc'], 'global_loss': g['test_loss']})
    out.update(self.server_split_metrics(state))  # server_ua: the GM's UA
    return out
