"""FedCache 2.0: on-device dataset distillation and a knowledge cache of distilled samples.

Q. Pan, S. Sun, Z. Wu, Y. Wang, M. Liu, B. Gao, J. Wang, "FedCache 2.0: Federated Edge
Learning with Knowledge Caching and Dataset Distillation", arXiv 2405.13378 (Algorithm 1,
eqs. 5-17). Where the paper is silent or inconsistent, the choices below say what we do
and why (also in ``docs/papers.md``).

Personalised FL without parameter or logit exchange. A round, synchronous and in the
authors' code order (train before distilling, so distillation uses a trained feature
extractor), for every participating client k:

1. **Download** (eq. 17): for each class c the server draws a fraction
   ``q_c = tau + (1 - tau) p_c^k`` of the cached class-c samples
   (:func:`fedjax_kd.ops.knowledge_cache.sample`; ``fedcache2.sampling`` picks the
   fixed count ``q_c |S_c|``, a Bernoulli draw or the authors' max-normalised count).
   The cache is empty in round 1, so round 1 is local training only (eq. 15's g).
2. **Train** (eq. 14): cross-entropy on the private data with the downloaded
   synthetic samples appended and shuffled in (one data set, as the authors' code).
3. **Distil** (eqs. 8-12): ``fedcache2.ipc`` synthetic inputs per class, initialised
   from real local samples in round 1 and from the client's own previous synthetic
   set afterwards (``proto_init='own'``, the released code; ``'sigma'`` starts from
   another client's cached set, eq. 8), are optimised with Adam to minimise the
   KRR loss of predicting the client's real data from them, with a linear kernel
   on the client model's penultimate features (:mod:`fedjax_kd.ops.krr`; the
   paper's eq. 12 has y_b and y_i swapped; we use standard KRR). Labels stay one-hot.
   Classes the client lacks get no synthetic sample (as the code). All clients of a
   cohort distil at
   once (vmap), the model is not changed.
4. **Upload** (eq. 13): the synthetic set replaces the client's cache slot. Images
   travel as uint8 (the paper sends JPEGs), counted as raw bytes or as PNG/JPEG file sizes
   (``fedcache2.encoding``); non-image inputs travel as float32. Hard labels are
   counted too.

The evaluated quantity is UA: the mean over clients of each personalised model's
accuracy (on per-client test splits with ``data.per_client_test``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.core import rng
from fedjax_kd.core.federation import join_rows
from fedjax_kd.core.program import Batches, Program, Rows, over_rows
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import codec, comm
from fedjax_kd.ops import knowledge_cache as kc
from fedjax_kd.ops import krr

SAMPLING = ('count', 'bernoulli', 'repo')
# RoundOutput.carry's key: (the next round, the widest download any client would take in it).
WIDEST = 'fedcache2_widest'
ENCODINGS = ('raw', 'png', 'jpeg')
PROTO_INIT = ('own', 'sigma')
BN_MODES = ('eval', 'train')


@dataclasses.dataclass(frozen=True)
class FedCache2Options:
  """``fedcache2.*`` (what each choice follows: docs/papers.md)."""
  group: ClassVar[str] = 'fedcache2'
  tau: float = options.option(0.5, 'Eq. 17: class c is drawn with tau + (1 - tau) p_c^k',
                              ge=0, le=1)
  sampling: str = options.option('count', "'count' (q_c |S_c| samples), 'bernoulli' or "
                                 "'repo'", choices=SAMPLING)
  max_download: int = options.option(0, 'cap on the samples a client downloads; 0: none', ge=0)
  exclude_own: bool = options.option(False, "leave a client's own uploads out of its download")
  ipc: int = options.option(1, 'synthetic samples per class per client (App. D)', ge=1)
  proto_init: str = options.option('own', "'own' (the released code) or 'sigma' (Eq. 8's "
                                   'donor)', choices=PROTO_INIT)
  sigma_period: int = options.option(1, "rounds between new donor permutations ('sigma')",
                                     ge=1)
  dd_epochs: int = options.option(10, 'passes over the local targets a round', ge=0)
  dd_batch_size: int = options.option(64, 'the distillation batch', ge=1)
  dd_lr: float = options.option(1e-3, "the paper's distillation learning rate (code: 3e-4)",
                                gt=0)
  dd_reg: float = options.option(1e-6, 'KRR ridge = dd_reg * tr(K_bb) / n', gt=0)
  dd_bn_mode: str = options.option('eval', "BatchNorm while distilling: 'eval' (running "
                                   "statistics) or 'train' (the code)", choices=BN_MODES)
  encoding: str = options.option('raw', "bytes counted as 'raw' uint8, 'png' (the code) or "
                                 "'jpeg'", choices=ENCODINGS)
  jpeg_quality: int = options.option(75, "the JPEG quality of encoding='jpeg'", ge=1,
                                     le=95)


@functools.partial(jax.jit, static_argnames=('s_max',))
def _selected_rows(flat: jax.Array, s_max: int) -> jax.Array:
  """``[K, s_max]`` indices of the True entries of each row of ``flat``, in order."""
  return jnp.argsort(~flat, axis=1, stable=True)[:, :s_max].astype(jnp.int32)


@functools.partial(jax.jit, donate_argnums=(0,), static_argnames=('start',))
def _set_tail(pool: jax.Array, tail: jax.Array, start: int) -> jax.Array:
  return jax.lax.dynamic_update_slice_in_dim(pool, tail.astype(pool.dtype), start, axis=0)


@functools.partial(jax.jit, static_argnames=('normalize', 'tail_rows'))
def _new_pool(x_private: jax.Array, normalize: Any, tail_rows: int) -> jax.Array:
  """``normalize(x_private)`` followed by ``tail_rows`` zero rows, in one program: XLA writes
  the normalised rows straight into the pool (no float copy of the private set beside it)."""
  x = normalize(x_private).astype(jnp.float32)
  return jnp.concatenate([x, jnp.zeros((tail_rows,) + x.shape[1:], jnp.float32)])


@flax.struct.dataclass
class FedCache2Table:
  """Per client (rows: clients).

  Attributes:
    proto: ``[K, P, ...]`` the client's synthetic set D_b^k (its last distillation).
    proto_valid: ``[K, P]`` bool, its real slots (classes the client has).
    label_freq: ``[K, C]`` p^k, the client's label distribution (eq. 16; constant).
  """
  proto: Any
  proto_valid: Any
  label_freq: Any


class FedCache2(base.Algorithm):
  name = 'fedcache2'
  options_class = FedCache2Options
  paper_rules = 'fedcache2'
  uses_public = False
  synthesizes_inputs = True

  def __init__(self, ctx: base.Context):
    super().__init__(ctx)
    o = self.options
    d = self.ctx.data
    self.num_classes = d.num_classes
    self.slots = d.num_classes * o.ipc
    self.slot_class = kc.slot_classes(d.num_classes, o.ipc)
    self.y_b = jax.nn.one_hot(jnp.asarray(self.slot_class), d.num_classes, dtype=jnp.float32)
    self.image = codec.is_image_shape(d.input_shape)
    if not self.image and o.encoding != 'raw':
      raise ConfigError('fedcache2.encoding', o.encoding,
                        f"'raw' for inputs of shape {d.input_shape} ('png' and 'jpeg' need "
                        '(H, W, 1) or (H, W, 3) images; other inputs travel as float32)')
    # Quantisation and clipping range: that of the model inputs (pixels mapped, not copied).
    self.value_range = codec.value_range(d.normalize.extremes(d.x_private))
    item = math.prod(d.input_shape)
    self.raw_item_bytes = item if self.image else 4 * item
    self.n_private = int(d.x_private.shape[0])
    # The download pool's device buffer, reused (donated) from round to round: a scratch
    # allocation, not state (it is rebuilt from the cache every round).
    self._pool_x = None
    self._y_pool = jnp.concatenate([d.y_private,
                                    jnp.tile(jnp.asarray(self.slot_class), d.num_clients)])
    counts = d.client_labels().astype(np.float64)
    # p^k of every client (eq. 16), a constant the host knows: the table's rows, and the
    # widest download of the next round (:meth:`_widest_next`) for all K clients.
    self.label_freq = jnp.asarray(counts / np.maximum(counts.sum(1, keepdims=True), 1),
                                  jnp.float32)
    self.distillation = SyntheticDistillation(
        epochs=o.dd_epochs, batch_size=o.dd_batch_size, lr=float(o.dd_lr), reg=float(o.dd_reg),
        bn_mode=o.dd_bn_mode, augment=self.augment,
        chunk=max(1, min(self.spec.eval.chunk, 256, d.client_idx.shape[-1])),
        value_range=tuple(float(v) for v in self.value_range))

  # ------------------------------------------------------------ lifecycle
  def programs(self, shapes):
    d = self.ctx.fed.data
    k = d.num_clients
    # Training on the private rows and the widest download a round can take (the plan
    # holds for every round's width).
    width = self._width(min(self.options.max_download or k * self.slots, k * self.slots))
    pool = self.planned_buffers()[0]
    rows = Rows({'x': pool, 'y': self._y_pool},
                jax.ShapeDtypeStruct((k, d.client_idx.shape[1] + width), jnp.int32), None)
    return (self.planned_training(data=rows),
            base.planned(self.distillation, self.private_rows(),
                         {'x': shapes.table.proto, 'valid': shapes.table.proto_valid},
                         self._distillation_shared(d)))

  def _distillation_shared(self, d) -> dict:
    return {'y_b': self.y_b, 'x': d.x_private, 'y': d.y_private}

  def _width(self, most: int) -> int:
    """The training kernel's download width for a widest download of ``most`` samples: the
    next power of two (few shapes compile), at most every cache slot."""
    return min(1 << (most - 1).bit_length(), self.num_clients * self.slots) if most else 0

  def planned_buffers(self):
    # The download pool (_pool): the private rows as model inputs, then every cache slot;
    # held from the first round with downloads on. Its shape is _new_pool's.
    d = self.ctx.data
    return (jax.eval_shape(functools.partial(_new_pool, normalize=d.normalize,
                                             tail_rows=d.num_clients * self.slots),
                           d.x_private),)

  def setup_payloads(self):
    # Each client sends its label distribution p^k once (Algorithm 1, initialisation).
    return [comm.Payload('label_distribution', comm.UP, 'float', self.num_classes,
                         self.num_clients)]

  def init(self) -> base.AlgState:
    state = super().init()
    proto, valid = self._real_prototypes()
    cache = kc.empty_cache(self.num_clients, self.slots, self.ctx.data.input_shape)
    return state.replace(table=FedCache2Table(proto=proto, proto_valid=valid,
                                              label_freq=self.label_freq),
                         extra=cache)

  def _real_prototypes(self):
    """D_0^k (eq. 9): ``ipc`` distinct random real samples per class the client has."""
    d = self.ctx.data
    gen = rng.host_rng(self.spec.seed, 0, 'init')
    y = np.asarray(d.y_private)
    table = np.asarray(d.client_idx)
    rows = np.zeros((d.num_clients, self.slots), np.int32)
    valid = np.zeros((d.num_clients, self.slots), bool)
    ipc = self.options.ipc
    for k in range(d.num_clients):
      own = table[k, :d.client_n[k]]
      for c in range(self.num_classes):
        cand = own[y[own] == c]
        take = gen.choice(cand, min(ipc, len(cand)), replace=False) if len(cand) else []
        rows[k, c * ipc:c * ipc + len(take)] = take
        valid[k, c * ipc:c * ipc + len(take)] = True
    valid = jnp.asarray(valid)
    proto = base.rows_where(valid, d.normalize(jnp.take(d.x_private, jnp.asarray(rows), axis=0)),
                            0.0)
    return proto, valid

  # ---------------------------------------------------------------- round
  def round(self, state, r):
    t, active = r.t, r.active
    k_all = r.num_clients
    act = jnp.asarray(active)
    cache, table = state.extra, state.table
    payloads: list[comm.Payload] = []
    metrics: dict[str, Any] = {}   # device scalars and host numbers, read once by play_round

    # 1. Device-centric download (eq. 17).
    gids = r.ids   # a client's own cache row is its global id
    masks = self._sample(cache, t, gids, table.label_freq)
    flat = (masks & act[:, None, None]).reshape(k_all, -1)
    down_n = jnp.sum(flat, axis=1).astype(jnp.int32)
    receivers = int(np.sum(active))   # a host mask: no device read
    n_down = jnp.sum(down_n)
    # The widest download sets the training kernel's shape (none at all, as in round 1:
    # training on the private data alone): a host fact the last round left.
    most = self._widest(state, r)
    if most > 0:
      payloads += self._sample_payloads(comm.DOWN, jnp.sum(flat * cache.nbytes.reshape(1, -1)),
                                        n_down, receivers)
    metrics['down_items'] = n_down / max(receivers, 1)

    # 2. Local training on private + downloaded synthetic data (eq. 14).
    if most > 0:
      extra_idx = _selected_rows(flat, self._width(most)) + self.n_private
      d = r.fed.data
      idx, n = join_rows(d.client_idx, jnp.asarray(d.client_n, jnp.int32), extra_idx, down_n)
      state, metrics['train_loss'] = self.train_clients(
          state, r, data=Rows({'x': self._pool(cache), 'y': self._y_pool}, idx, n))
    else:
      state, metrics['train_loss'] = self.train_clients(state, r)

    # 3. On-device dataset distillation (eqs. 8-12).
    x0, v0, init_payloads = self._starting_points(state, r)
    payloads += init_payloads
    d = r.fed.data
    x_new, dd_loss, skipped = r.fed.run(
        self.distillation, state.clients, self.ctx.root, t, 'distill', active=active,
        data=self.private_rows(r.fed), row={'x': x0, 'valid': v0},
        shared=self._distillation_shared(d),
        fill=(x0, jnp.full((k_all,), jnp.nan, jnp.float32), jnp.zeros((k_all,), jnp.int32))).out
    metrics['dd_loss'] = base.nanmean(dd_loss)
    metrics['dd_skipped_steps'] = jnp.sum(skipped)

    # 4. Upload: the new set replaces the client's slot (eq. 13).
    x_recv, nbytes = self._encode(x_new, v0, active)
    cache = kc.write(cache, x_recv, v0, nbytes, act, t, jnp.asarray(gids))
    up_items = jnp.sum(v0 & act[:, None])
    payloads += self._sample_payloads(comm.UP, jnp.sum(nbytes * act[:, None]), up_items,
                                      receivers)
    metrics['up_items'] = up_items
    metrics['cache_items'] = jnp.sum(cache.valid)
    table = table.replace(proto=base.rows_where(act, x_new, table.proto),
                          proto_valid=base.rows_where(act, v0, table.proto_valid))
    return state.replace(table=table, extra=cache), base.RoundOutput(
        metrics, payloads, carry={WIDEST: (t + 1, self._widest_next(cache, t + 1))})

  # -------------------------------------------------------------- helpers
  def _sample(self, cache: kc.KnowledgeCache, t: int, gids: np.ndarray, label_freq):
    """Round ``t``'s download masks ``[S, K, P]`` of clients ``gids`` (eq. 17)."""
    o = self.options
    keys = rng.client_keys(self.ctx.root, t, gids, 'sample')
    exclude = jnp.asarray(gids) if o.exclude_own else jnp.full((len(gids),), -1)
    return kc.sample_clients(keys, cache.valid, jnp.asarray(self.slot_class), label_freq,
                             o.tau, mode=o.sampling, cap=o.max_download, exclude_rows=exclude)

  def _widest_next(self, cache: kc.KnowledgeCache, t: int) -> jax.Array:
    """The most samples any of the K clients would download in round ``t`` from ``cache`` (a
    device count, read with this round's output): the same draws as that round's, so its
    participants' widest download is at most this."""
    gids = np.arange(self.num_clients)
    masks = self._sample(cache, t, gids, self.label_freq)
    return jnp.max(jnp.sum(masks.reshape(len(gids), -1), axis=1)).astype(jnp.int32)

  def _widest(self, state, r) -> int:
    """The widest download of round ``r.t``: the count the previous round left (the next
    round's draws over every client), none before the first (an empty cache), else (the
    first round after a resume or a skipped round) one read of the draw over every client."""
    if r.carried is not None and r.carried.get(WIDEST, (None,))[0] == r.t:
      return int(r.carried[WIDEST][1])
    if r.carried == {} and r.t == 1:
      return 0
    return int(self._widest_next(state.extra, r.t))

  def _pool(self, cache: kc.KnowledgeCache) -> jax.Array:
    """``x_private`` followed by every cache slot (the rows clients can download).

    The synthetic rows are float model inputs, so the pool holds the private rows as
    model inputs too (built once, on the first round with downloads).
    """
    tail = cache.x.reshape((-1,) + cache.x.shape[2:])
    pool = self._pool_x
    if pool is None:
      d = self.ctx.data
      pool = _new_pool(d.x_private, d.normalize, tail.shape[0])
    # The tail goes through _set_tail every time, the first included, so the kernel
    # compiles in the first round with downloads, not in the round after it.
    self._pool_x = _set_tail(pool, tail, start=self.n_private)
    return self._pool_x

  def _sample_payloads(self, direction: str, nbytes: jax.Array, items: jax.Array,
                       receivers: int) -> list[comm.Payload]:
    """Distilled inputs (their encoded bytes, a float device sum: rounded when read) and their
    hard labels."""
    return [comm.Payload('distilled_inputs', direction, 'raw', nbytes,
                         copies=1, bytes_per_element=1.0),
            comm.Payload('distilled_labels', direction, 'label', items, copies=1,
                         classes=self.num_classes)]

  def _starting_points(self, state, r):
    """Where each client's distillation starts (eq. 8) and the traffic that costs."""
    t, active = r.t, r.active
    proto, valid = state.table.proto, state.table.proto_valid
    if self.options.proto_init == 'own':
      return proto, valid, []
    # sigma: a derangement of the clients, redrawn every sigma_period rounds.
    cache = state.extra
    k_pop = r.population
    period = (t - 1) // self.options.sigma_period
    order = rng.host_rng(self.spec.seed, period, 'server').permutation(k_pop)
    donor = np.empty(k_pop, np.int64)
    donor[order] = np.roll(order, -1)          # a cycle: nobody is its own donor (K > 1)
    donor = jnp.asarray(donor[r.ids])   # the donors of this round's clients
    dv = cache.valid[donor]
    use = jnp.any(dv, axis=1) & jnp.asarray(active)
    x0 = base.rows_where(use, cache.x[donor], proto)
    v0 = base.rows_where(use, dv, valid)
    sent = jnp.sum(jnp.where(use[:, None], cache.nbytes[donor] * dv, 0.0))
    items = jnp.sum(dv & use[:, None])
    # Device counts (zero bytes when no donor has a set yet, as in round 1).
    payloads = [comm.Payload('prototype_init', comm.DOWN, 'raw', sent, bytes_per_element=1.0),
                comm.Payload('prototype_init_labels', comm.DOWN, 'label', items,
                             classes=self.num_classes)]
    return x0, v0, payloads

  def _encode(self, x: jax.Array, valid: jax.Array, active: np.ndarray):
    """What the server stores for each uploaded sample, and its size in bytes."""
    k_all = valid.shape[0]
    validf = valid.astype(jnp.float32)
    if not self.image:       # tabular/audio features: float32, 4 bytes per value
      return x, validf * self.raw_item_bytes
    lo, hi = self.value_range
    q = codec.quantize(x, lo, hi)
    fmt = self.options.encoding
    if fmt == 'raw':
      return codec.dequantize(q, lo, hi), validf * self.raw_item_bytes
    rows = np.flatnonzero(active)
    # A host read the encoding needs: PNG and JPEG sizes come from the host's codecs.
    qh = np.asarray(q[rows])                                   # [A, P, H, W, C] uint8
    flat = qh.reshape((-1,) + qh.shape[2:])
    sizes = codec.encoded_sizes(flat, fmt, quality=self.options.jpeg_quality)
    nbytes = np.zeros((k_all, self.slots), np.float32)
    nbytes[rows] = sizes.reshape(len(rows), self.slots)
    if fmt == 'jpeg':        # receivers decode what JPEG kept
      decoded = codec.jpeg_roundtrip(flat, quality=self.options.jpeg_quality)
      q = q.at[jnp.asarray(rows)].set(jnp.asarray(decoded.reshape(qh.shape)))
    return codec.dequantize(q, lo, hi), jnp.asarray(nbytes) * validf


# ---------------------------------------- on-device dataset distillation (KRR)
def _embed(kernels, st, x: jax.Array, train: bool = False,
           mask: jax.Array | None = None) -> jax.Array:
  """Penultimate features F_f(x) ``[B, d]`` (the input of the final Dense), in float32."""
  if train and st.batch_stats:
    out, _ = kernels.apply(st.params, st.batch_stats, x, train=True, mask=mask, embed=True,
                           mutable=['batch_stats'])  # running stats are not written back
    return out
  return kernels.apply(st.params, st.batch_stats, x, train=False, embed=True)


class DistillCarry(NamedTuple):
  """The distillation's carry: the synthetic inputs and Adam's state, the targets (constant
  over the steps) and the loss sums of the steps that updated or were skipped."""
  x_b: jax.Array
  opt: Any
  phi: jax.Array
  y: jax.Array
  loss_sum: jax.Array
  ok: jax.Array
  skipped: jax.Array


@dataclasses.dataclass(frozen=True)
class SyntheticDistillation(Program):
  """One client's dataset distillation by KRR on its own features (eqs. 10-12).

  The client's synthetic inputs ``x_b`` are optimised with Adam(``lr``) to minimise the
  KRR loss (:func:`fedjax_kd.ops.krr.krr_loss`) of predicting the client's real data
  ``(x[idx[:n]], y[idx[:n]])`` from the synthetic set, with a linear kernel on the client
  model's penultimate features; ``epochs`` passes over the targets in shuffled minibatches
  of ``batch_size``. The model only reads (``apply`` is float32: the KRR solve needs the
  precision whatever ``train.compute_dtype`` says).

  Inputs: ``row = {'x': x_b [P, ...], 'valid': valid_b [P]}`` (the starting synthetic
  inputs and their real slots: a class the client lacks is masked) and
  ``shared = {'y_b': [P, C] one-hot labels, 'x', 'y': the pooled private data}``, the batches
  drawn over the client's rows of it. ``bn_mode='eval'`` uses running statistics,
  ``'train'`` the synthetic batch's own (as the authors' code; running stats are not
  updated); ``augment`` transforms the target inputs (one pass, ``chunk`` rows at a time);
  inputs are clipped to ``value_range`` after every step.

  Outputs ``(x_b, mean KRR loss of the steps that updated (NaN if none), steps skipped for a
  non-finite loss or gradient)``.
  """
  epochs: int
  batch_size: int
  lr: float
  reg: float
  bn_mode: str
  augment: Any
  chunk: int
  value_range: tuple[float, float]
  writes = False

  @property
  def batches(self) -> Batches:
    return Batches(self.epochs, self.batch_size)

  def batch_key(self, key):
    return jax.random.split(key)[1]

  def init(self, c, row, shared):
    k_feat = jax.random.split(c.key)[0]
    k, st = c.kernels, c.model

    def features(rows, i):
      xb = k.inputs(shared['x'][rows])
      if self.augment is not None:
        xb = self.augment(jax.random.fold_in(k_feat, i), xb)
      return _embed(k, st, xb)

    # Targets: the client's real data through its current (trained) extractor, detached:
    # only the synthetic inputs are learned.
    phi = jax.lax.stop_gradient(over_rows(features, c.idx, self.chunk))
    y = jax.nn.one_hot(shared['y'][c.idx], shared['y_b'].shape[-1], dtype=jnp.float32)
    zero = jnp.float32(0.0)
    return DistillCarry(row['x'], optax.adam(self.lr).init(row['x']), phi, y, zero,
                        jnp.int32(0), jnp.int32(0))

  def step(self, c, carry, batch, row, shared):
    valid_b = row['valid']
    vb = valid_b.astype(jnp.float32)
    n_max = carry.phi.shape[0]
    pos = batch.pos

    def loss_fn(xb):
      phi_b = _embed(c.kernels, c.model, xb, train=(self.bn_mode == 'train'), mask=valid_b)
      p = jnp.minimum(pos, n_max - 1)
      return krr.krr_loss(carry.phi[p], carry.y[p], phi_b, shared['y_b'], vb, batch.valid,
                          self.reg)

    value, grads = jax.value_and_grad(loss_fn)(carry.x_b)
    updates, new_opt = optax.adam(self.lr).update(grads, carry.opt, carry.x_b)
    lo, hi = self.value_range
    new_xb = jnp.clip(optax.apply_updates(carry.x_b, updates), lo, hi)
    used = jnp.any(batch.valid) & jnp.any(valid_b)
    # A non-finite loss or gradient skips the step (counted), so NaNs never reach the cache.
    ok = used & jnp.isfinite(value) & jnp.all(jnp.isfinite(grads))
    keep = lambda a, b: jax.tree.map(lambda u, v: jnp.where(ok, u, v), a, b)
    return carry._replace(x_b=keep(new_xb, carry.x_b), opt=keep(new_opt, carry.opt),
                          loss_sum=carry.loss_sum + jnp.where(ok, value, 0.0),
                          ok=carry.ok + ok, skipped=carry.skipped + (used & ~ok)), value

  def final(self, c, carry, row, shared):
    loss = jnp.where(carry.ok > 0, carry.loss_sum / jnp.maximum(carry.ok, 1), jnp.nan)
    return None, (carry.x_b, loss, carry.skipped)
