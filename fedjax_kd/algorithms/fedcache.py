"""FedCache: personalised FL through a server-side cache of per-sample logits.

Z. Wu, S. Sun, Y. Wang, M. Liu, K. Xu, W. Wang, X. Jiang, B. Gao, J. Lu, "FedCache: A
Knowledge Cache-Driven Federated Learning Architecture for Personalized Edge Intelligence",
IEEE Transactions on Mobile Computing 2024 (arXiv 2308.07816); authors' code
github.com/wuzhiyuan2000/FedCache. A baseline of FedCache 2.0 (arXiv 2405.13378), whose
eqs. 2-3 quote its objective and whose Table III gives its hyper-parameters (beta 1.5,
R 16; Adam, lr 0.01, batch 64, 1 local epoch: set those in ``train.*``).

Setup (once). Each client encodes each private sample ``(k, i)`` to a hash vector with a
fixed encoder and uploads the hashes (with the labels: the code builds one index per
class). The server relates every sample to its ``R`` most similar samples
(:func:`fedjax_kd.ops.related_knowledge.related_samples`) and starts every cached logit
at zero.

A round, for every participating client k (all in parallel):

1. **Download**: for each private sample, the mean of the cached logits of its ``R``
   related samples (``z_i``, eq. 3).
2. **Train** ``train.epochs`` epochs on ``CE(F(x), y) + beta * T^2 *
   KL(softmax(z / T) || softmax(F(x) / T))`` per sample (eq. 2 with eq. 3's regulariser;
   :func:`fedjax_kd.ops.related_knowledge.cache_kd_loss`).
3. **Upload** its logits of each private sample (with the sample ids); the server
   overwrites those rows of the cache.

What the paper leaves open, and what we do (also ``docs/papers.md``):

* **Encoder.** The code hashes with an ImageNet-pretrained MobileNetV3-small (576 features
  of images resized to 224). Nothing pretrained is available offline here, so the
  stand-in is deterministic and documented: the flattened model inputs times a fixed
  Gaussian random projection to ``fedcache.hash_dim`` dimensions (576 by default, so the
  one-time hash upload has the size of the code's; the projection is drawn from the run's
  root key). Cosine similarities of the projections approximate those of the raw
  inputs (Johnson-Lindenstrauss), so the relation is a raw-pixel kNN;
  ``hash_dim = 0`` uses the raw inputs exactly. Token inputs are projected as numbers
  (crude; FedCache targets images).
* **Relation.** As the code: cosine similarity, only samples of the same class (one index
  per class), the sample itself excluded, own-client samples allowed
  (``fedcache.other_clients`` excludes them); exact search instead of the code's HNSW.
* **KL.** The code's ``KL_Loss``: temperature 3 (``fedcache.temperature``), teacher
  first, ``T^2`` scaling, batch mean. Its teacher's ``+1e-7`` is dropped.
* **Cold start.** The code starts the cache at zero logits, so until a related sample is
  uploaded its share of the teacher is uniform (``cold_start='zeros'``); ``'skip'`` averages
  only entries uploaded at least once and drops the KL when there is none.
* **When logits are uploaded.** The code writes each sample's logits from the training
  forward pass of its last epoch as it goes (clients in sequence, so a later client of the
  round reads an earlier one's fresh logits). Here the clients of a round train in
  parallel from the cache as the round began, then upload inference-mode logits of their
  trained model on every private sample (one extra forward pass).
* **Partial participation.** Only active clients download, train and upload; the other
  rows of the cache keep their last logits.

Bytes (``paper_rules='fedcache2'``, float32 values, int32 indices): setup, each client
uploads ``hash_dim`` floats and a label per private sample. Per round, each active client
downloads C floats per private sample (the R-mean, averaged by the server) and uploads C
floats plus one index per private sample.

The evaluated quantity is the client models' accuracy (UA with ``data.per_client_test``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.core import rng
from fedjax_kd.core.program import Program, Rows, over_rows
from fedjax_kd.ops import comm
from fedjax_kd.ops import related_knowledge as rk

COLD_START = ('zeros', 'skip')


@dataclasses.dataclass(frozen=True)
class FedCacheOptions:
  """``fedcache.*`` (defaults: FedCache 2.0 Table III and the authors' code)."""
  group: ClassVar[str] = 'fedcache'
  beta: float = options.option(1.5, 'weight of the KL to the related knowledge (Table III)',
                               ge=0)
  r: int = options.option(16, 'R: related samples per private sample (Table III)', ge=1)
  temperature: float = options.option(3.0, "the KL's temperature (the code's KL_Loss)", gt=0)
  hash_dim: int = options.option(576, 'hash width: a fixed random projection of the inputs '
                                 '(0: the raw inputs)', ge=0)
  other_clients: bool = options.option(False, "relate only other clients' samples (the "
                                       'code allows its own)')
  cold_start: str = options.option('zeros', "never-uploaded cache entries: 'zeros' (the "
                                   "code) or 'skip'", choices=COLD_START)


@flax.struct.dataclass
class LogitCache:
  """The server's knowledge cache (rows: private samples, no client axis).

  Attributes:
    logits: ``[N, C]`` the latest uploaded logits of every private sample (0 until then).
    seen: ``[N]`` bool, rows uploaded at least once.
    related: ``[N, R]`` int32 each sample's related samples (fixed after setup).
    related_valid: ``[N, R]`` bool, the real entries of ``related``.
  """
  logits: Any
  seen: Any
  related: Any
  related_valid: Any


@dataclasses.dataclass(frozen=True)
class CacheKD:
  """FedCache's per-sample loss, the training program's (hashable: part of the program).

  Reads the per-sample teacher logits ``batch['kd_t']`` and weights ``batch['kd_w']``,
  gathered by row like ``x`` and ``y``.
  """
  beta: float
  temperature: float

  def __call__(self, logits, batch, row):
    del row
    return rk.cache_kd_loss(logits, batch['y'], batch['kd_t'], batch['kd_w'], self.beta,
                            self.temperature)


@dataclasses.dataclass(frozen=True)
class PrivateLogits(Program):
  """The upload: inference-mode logits ``[n_max, C]`` of a client's model on its private rows
  (``row['idx']``) of ``shared['x']``, ``chunk`` rows at a time (float32 whatever the compute
  dtype)."""
  chunk: int
  writes = False

  def final(self, c, carry, row, shared):
    st, k = c.model, c.kernels

    def logits(rows, i):
      del i
      return k.apply(st.params, st.batch_stats, k.inputs(shared['x'][rows]), train=False)

    return None, over_rows(logits, row['idx'], self.chunk).astype(jnp.float32)


class FedCache(base.Algorithm):
  name = 'fedcache'
  options_class = FedCacheOptions
  paper_rules = 'fedcache2'
  uses_public = False

  def __init__(self, ctx: base.Context):
    super().__init__(ctx)
    d = ctx.data
    n_max = d.client_idx.shape[1]
    self.upload = PrivateLogits(chunk=max(1, min(self.spec.eval.chunk, 256, n_max)))
    self.num_classes = d.num_classes
    self.n_private = int(d.x_private.shape[0])
    self.input_dim = math.prod(d.input_shape)
    self.hash_dim = self.options.hash_dim or self.input_dim
    self.owner = rk.owners(np.asarray(d.client_idx), d.client_n, self.n_private)
    self.owned = jnp.asarray(self.owner >= 0, jnp.float32)
    self.n_owned = max(int(np.sum(self.owner >= 0)), 1)
    self.loss_fn = CacheKD(float(self.options.beta), float(self.options.temperature))

  # ------------------------------------------------------------ lifecycle
  def setup_payloads(self):
    owned = int(np.sum(self.owner >= 0))
    return [comm.Payload('hashes', comm.UP, 'float', owned * self.hash_dim, 1),
            comm.Payload('hash_labels', comm.UP, 'label', owned, 1, classes=self.num_classes)]

  def init(self) -> base.AlgState:
    state = super().init()
    return state.replace(extra=self.build_cache())

  def build_cache(self) -> LogitCache:
    """The cache before round 1: every sample's related samples, zero logits."""
    d, o = self.ctx.data, self.options
    proj = None
    if o.hash_dim:
      proj = rk.projection(rng.server_key(self.ctx.root, 0, 'custom'), self.input_dim,
                           o.hash_dim)
    feats = rk.hash_features(d.x_private, proj, d.normalize,
                             chunk=max(1, min(1024, self.n_private)))
    related, valid = rk.related_samples(
        feats, d.y_private, jnp.asarray(self.owner), o.r, same_class=True,
        other_clients=o.other_clients, chunk=max(1, min(256, self.n_private)))
    return LogitCache(logits=jnp.zeros((self.n_private, self.num_classes), jnp.float32),
                      seen=jnp.zeros((self.n_private,), bool), related=related,
                      related_valid=valid)

  def training_rows(self, fed, targets, weight) -> Rows:
    """The private rows with each one's related knowledge and its weight beside it."""
    d = fed.data
    return Rows({'x': d.x_private, 'y': d.y_private, 'kd_t': targets, 'kd_w': weight},
                d.client_idx, d.client_n)

  def programs(self, shapes):
    d = self.ctx.data
    n = int(d.x_private.shape[0])
    targets = jax.ShapeDtypeStruct((n, self.num_classes), jnp.float32)
    weight = jax.ShapeDtypeStruct((n,), jnp.float32)
    return (self.planned_training(self.train_program(loss=self.loss_fn),
                                  data=self.training_rows(self.ctx.fed, targets, weight)),
            base.planned(self.upload, None, {'idx': d.client_idx}, {'x': d.x_private}))

  # ---------------------------------------------------------------- round
  def round(self, state, r):
    cache = state.extra
    d = r.fed.data
    valid = cache.related_valid
    if self.options.cold_start == 'skip':
      valid = valid & jnp.take(cache.seen, cache.related, axis=0)
    # 1. The related knowledge of every sample (the server's R-mean, eq. 3).
    targets, weight = rk.related_targets(cache.logits, cache.related, valid)
    # 2. Local training with CE + beta * KD (eq. 2).
    state, loss = self.train_clients(state, r, self.train_program(loss=self.loss_fn),
                                      data=self.training_rows(r.fed, targets, weight))
    # 3. Upload: fresh logits of every private sample replace its cache row.
    n = jnp.asarray(np.where(r.active, d.client_n, 0), jnp.int32)
    n_max = d.client_idx.shape[1]
    fresh = r.fed.run(self.upload, state.clients, self.ctx.root, r.t, 'predict',
                      row={'idx': d.client_idx}, shared={'x': d.x_private},
                      active=r.active).out
    mask = jnp.arange(n_max)[None, :] < n[:, None]
    logits, seen = rk.write_logits(cache.logits, cache.seen, d.client_idx, fresh, mask)
    cache = cache.replace(logits=logits, seen=seen)
    samples = int(np.sum(np.asarray(d.client_n)[r.active]))   # host counts: no device read
    # Shares of the clients' samples that had a teacher this round / are in the cache.
    metrics = {'train_loss': loss,
               'kd_coverage': jnp.sum(weight * self.owned) / self.n_owned,
               'cache_seen': jnp.sum(seen * self.owned) / self.n_owned}
    return state.replace(extra=cache), base.RoundOutput(metrics, self.payloads(samples))

  def payloads(self, samples: int) -> list[comm.Payload]:
    """A round's traffic for ``samples`` private samples of the active clients."""
    c = self.num_classes
    return [comm.Payload('related_knowledge', comm.DOWN, 'float', samples * c, 1),
            comm.Payload('logits', comm.UP, 'float', samples * c, 1),
            comm.Payload('sample_ids', comm.UP, 'index', samples, 1)]
