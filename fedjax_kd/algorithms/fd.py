"""FD: federated distillation with per-label average outputs.

E. Jeong et al., "Communication-Efficient On-Device Machine Learning:
Federated Distillation and Augmentation under Non-IID Private Data", 2018; as
"Benchmark 2" of DS-FL (Itahara et al., IEEE TMC 2021, §2.2, eqs. 4-8).

Round (DS-FL's Benchmark 2, with our readings where it is silent):
  * local update on private data: round 1 only (the literal reading of "all
    procedures except Update are iterated"; later rounds keep training through
    the label term of the distillation loss), or every round with
    ``fd.update_every_round``;
  * each client uploads its per-label mean probabilities ``t_{k,n}`` over its
    private samples of class n (inference mode, after the round's training,
    eq. 4; zero if absent, still counted);
  * the server averages them over the clients holding class n (eq. 5);
  * each client distils on its private data with
    ``CE(y) + gamma * CE(teacher_k[y])`` where the teacher excludes its own
    contribution, ``(|K_n| t_{g,n} - t_{k,n}) / (|K_n| - 1)`` (eqs. 6-7); the
    term is dropped where ``|K_n| <= 1`` (eq. 6 would divide by zero);
    ``gamma`` defaults to 1 (the paper gives no value).
Evaluation: the mean test accuracy of the client models (FD has no server model).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.core.program import SGD
from fedjax_kd.ops import comm, losses


@dataclasses.dataclass(frozen=True)
class FDOptions:
  """``fd.*``."""
  group: ClassVar[str] = 'fd'
  gamma: float = options.option(1.0, 'weight of the distillation term of Eq. (7) (the paper '
                                'gives no value)', ge=0)
  update_every_round: bool = options.option(False, 'train on the private data every round, '
                                            'not only in round 1')


def fd_loss(logits, batch, row):
  """Eq. (7): CE on the label plus gamma x CE on the client's teacher for that label."""
  y = batch['y']
  teacher = row['teacher'][y]                     # [B, C]
  weight = row['weight'][y] * row['gamma']        # [B]
  return losses.cross_entropy(logits, y) + weight * losses.soft_cross_entropy(logits, teacher)


@jax.jit
def fd_teachers(means: jax.Array, counts: jax.Array, active: jax.Array):
  """Eqs. (5)-(6) for all clients at once.

  Args:
    means: ``[K, C, C]`` per-label mean probabilities of each client.
    counts: ``[K, C]`` per-label sample counts.
    active: ``[K]`` participation mask.

  Returns:
    ``(global [C, C], teacher [K, C, C], weight [K, C])``; ``weight`` is 0 where
    the teacher is undefined (``|K_n| <= 1``) or the client lacks class n.
  """
  has = (counts > 0) & active[:, None]                      # [K, C]
  kn = jnp.sum(has, axis=0).astype(means.dtype)             # |K_n|
  total = jnp.einsum('kn,knc->nc', has.astype(means.dtype), means)
  glob = total / jnp.maximum(kn, 1.0)[:, None]
  own = means * has[:, :, None]
  teacher = (kn[None, :, None] * glob[None] - own) / jnp.maximum(kn - 1.0, 1.0)[None, :, None]
  weight = (has & (kn[None, :] > 1)).astype(means.dtype)
  return glob, teacher, weight


class FD(base.Algorithm):
  name = 'fd'
  options_class = FDOptions
  uses_public = False

  def distillation(self) -> SGD:
    """Eq. (7)'s program: ``distill.epochs`` epochs of the private data in batches of
    ``train.batch_size``, on :func:`fd_loss`, with the distillation optimizer."""
    return SGD(fd_loss, self.spec.distill.epochs, self.spec.train.batch_size,
               slot=self.distill_slot)

  def teacher_rows(self, teacher, weight, k: int) -> dict:
    """The distillation's per-client inputs: its teachers, their weights and gamma."""
    return {'teacher': teacher, 'weight': weight,
            'gamma': jnp.full((k,), self.options.gamma, jnp.float32)}

  def programs(self, shapes):
    del shapes
    k, c = self.num_clients, self.ctx.data.num_classes
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return (self.planned_training(),
            base.planned(self.distillation(), self.private_rows(),
                         {'teacher': f32(k, c, c), 'weight': f32(k, c), 'gamma': f32(k)}, None))

  def round(self, state, r):
    t, active = r.t, r.active
    metrics = {}
    if t == 1 or self.options.update_every_round:
      state, metrics['train_loss'] = self.train_clients(state, r)
    means, counts = r.fed.class_mean_probs(state.clients, active, chunk=self.spec.eval.chunk)
    _, teacher, weight = fd_teachers(means, counts, jnp.asarray(active))
    d = r.fed.data
    ran = r.fed.run(self.distillation(), state.clients, self.ctx.root, t, 'distill',
                    data=self.private_rows(r.fed), active=active,
                    row=self.teacher_rows(teacher, weight, r.num_clients))
    clients = ran.states
    metrics['distill_loss'] = base.nanmean(ran.metrics)   # a device scalar, read with the round
    c, senders = d.num_classes, int(np.sum(active))   # a host mask: no device read
    payloads = [comm.Payload('per_label_probs', comm.UP, 'float', c * c, senders),
                comm.Payload('per_label_probs', comm.DOWN, 'float', c * c, senders,
                             multicast=True)]
    return state.replace(clients=clients), base.RoundOutput(metrics, payloads)
