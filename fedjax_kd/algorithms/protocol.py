"""The public-set distillation round shared by DS-FL, SCARLET, CFD, COMET and Selective-FD.

The round structure is DS-FL's (Itahara et al., IEEE TMC 2021, Algorithm 1)
as run by SCARLET's code (Azuma et al., "Soft-Label Caching and Sharpening for
Communication-Efficient Federated Distillation", 2025, Algorithm 1, in the order
of the authors' reproducibility code):

  1. downlink: the previous round's labels (only the fresh ones when the
     soft-label cache is on), their indices, cache signals and this round's
     request; every participating client rebuilds its targets and distils on
     them (``schedule='next_round'``);
  2. local training on private data;
  3. prediction on the requested public indices and upload;
  4. server: aggregate, merge with the cache (:mod:`fedjax_kd.ops.cache`),
     distil the server model ``w_g`` (the evaluated model).

``schedule='same_round'`` (DS-FL's paper) runs step 1 at the end of the same
round instead; the sequence of updates each client sees is identical, only the
point where client accuracy is measured differs (after distillation instead of
after local training).

Algorithms differ only in hooks: what a client may upload
(:meth:`upload_masks`), what it uploads (soft or hard labels), how the server
aggregates (:meth:`aggregate`), what it sends down (:meth:`downlink`) and how
a client turns that into targets (:meth:`client_targets`). Everything carried
between rounds is a device array, in :class:`ProtocolTable` (per client) or
:class:`ProtocolServer` (the caches, the pending downlink), so checkpoints hold
it and resume loses nothing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

import flax

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.ops import aggregate
from fedjax_kd.ops import cache as cache_ops
from fedjax_kd.ops import comm

Array = jax.Array
SCHEDULES = ('next_round', 'same_round')
CACHE_MODES = ('auto', 'on', 'off')


@dataclasses.dataclass(frozen=True)
class CacheOptions:
  """``cache.*``: SCARLET's soft-label cache, for any algorithm of this family."""
  group: ClassVar[str] = 'cache'
  mode: str = options.option('auto', "'auto' is on for SCARLET, off for the others",
                             choices=CACHE_MODES)
  duration: int = options.option(50, 'D: a cached label is reused while t - t_cached <= D',
                                 ge=0)
  enabled: bool = options.derived(False, 'the mode resolved for the algorithm')

  def validate(self, spec, algorithm) -> CacheOptions:
    del spec
    on = algorithm.cache_by_default if self.mode == 'auto' else self.mode == 'on'
    return dataclasses.replace(self, enabled=on)


@flax.struct.dataclass
class ProtocolTable:
  """The family's per-client arrays (rows: clients; ``None`` where unused).

  Attributes:
    local_labels: ``[K, N_pub, C]`` each client's own cached labels, when
      targets differ per client (COMET) and the cache is on. Their stamps are
      the same for every client (such runs have full participation), so
      ``ProtocolServer.local_stamp`` holds them once.
    client_stamp: ``[K, N_pub]`` the round each client last synced each public
      sample (cache on, partial participation: the catch-up traffic).
    upload_mask: ``[K, N_pub]`` bool, which public samples a client may upload
      (Selective-FD's client-side selectors); None lets everyone upload.
  """
  local_labels: Any = None
  client_stamp: Any = None
  upload_mask: Any = None


@flax.struct.dataclass
class ProtocolServer:
  """The family's server-side state: the pending downlink and the caches.

  Attributes:
    has_prev, prev_round, prev_idx, prev_use, prev_signals, prev_payload,
      prev_server_labels: last round's downlink, sent at the start of the next
      (``schedule='next_round'``).
    cache_labels, cache_stamp: the server's soft-label cache (cache on).
    local_labels, local_stamp: the clients' cache copy when every client gets
      the same targets (one copy serves all; cache on); with per-client targets
      only the stamps (the labels are in ``ProtocolTable``).
    prev_pre_stamp, prev_post_stamp: the cache stamps of last round's samples
      before and after its update (cache on, partial participation).
  """
  has_prev: Any
  prev_round: Any
  prev_idx: Any
  prev_use: Any
  prev_signals: Any
  prev_payload: Any
  prev_server_labels: Any
  cache_labels: Any = None
  cache_stamp: Any = None
  local_labels: Any = None
  local_stamp: Any = None
  prev_pre_stamp: Any = None
  prev_post_stamp: Any = None


class Protocol(base.Algorithm):
  """Base class of the public-set FD family; see the module docstring."""
  uses_public = True
  has_server_model = True
  per_client_targets = False   # True: targets differ per client (COMET)
  cache_by_default = False    # cache.mode='auto' turns the cache on (SCARLET)

  def __init__(self, ctx):
    super().__init__(ctx)
    self.n_public = int(self.ctx.data.x_public.shape[0])
    self.n_round = self.spec.distill.public_per_round   # <= n_public, checked by config.validate
    self.num_classes = self.ctx.data.num_classes
    self.track_clients = self.cache.enabled and self.spec.partial
    # Debug mode: assert that the labels a client rebuilds from its cache equal
    # the server's zhat, where they should (always, under full participation).
    self.debug = bool(os.environ.get('FEDJAX_KD_DEBUG'))

  # ------------------------------------------------------------- options
  @property
  def cache(self) -> CacheOptions:
    return self.options.cache

  @property
  def schedule(self) -> str:
    return 'next_round'

  # --------------------------------------------------------------- hooks
  def upload_masks(self) -> Array | None:
    """``[K, N_pub]`` bool: which public samples each client may upload (None: all).

    Computed once; it becomes ``ProtocolTable.upload_mask``.
    """
    return None

  upload_kind = 'float'   # 'float' soft labels, or 'label' hard labels (CFD)

  def aggregate(self, probs: Array, mask: Array) -> tuple[Array, Array, dict]:
    """Server aggregation of uploads.

    Args:
      probs: ``[S, n, C]`` client probabilities (zero where ``mask`` is False).
      mask: ``[S, n]`` which client uploaded which sample.

    Returns:
      ``(labels [n, C], keep [n] bool, metrics)``: the server's training
      labels, which samples got one, and scalar diagnostics.
    """
    raise NotImplementedError

  def downlink(self, state, r: base.Round, x: Array, labels: Array, probs: Array,
               mask: Array) -> tuple[base.AlgState, Array]:
    """What the server sends for the fresh samples, aligned with ``x``.

    Default: the server's labels (DS-FL, SCARLET, Selective-FD).
    """
    del r, x, probs, mask
    return state, labels

  down_elements_per_row = None   # floats per fresh sample sent down (default C)
  downlink_is_server_labels = True  # False when clients get other content (CFD, COMET)

  def client_targets(self, state, r: base.Round, x: Array,
                     payload: Array) -> tuple[Array, Array | None]:
    """Turns the downlink payload into distillation targets.

    Returns:
      ``(targets [n, C] or [S, n, C], loss weights [S] or None)``.
    """
    del state, r, x
    return payload, None

  # ----------------------------------------------------------- lifecycle
  def init(self):
    state = super().init()
    n, c, k = self.n_round, self.num_classes, self.num_clients
    server = ProtocolServer(
        has_prev=jnp.zeros((), bool),
        prev_round=jnp.zeros((), jnp.int32),
        prev_idx=jnp.zeros((n,), jnp.int32),
        prev_use=jnp.zeros((n,), bool),
        prev_signals=jnp.zeros((n,), jnp.int32),
        prev_payload=jnp.zeros((n,) + self.payload_shape(), jnp.float32),
        prev_server_labels=jnp.zeros((n, c), jnp.float32))
    table = ProtocolTable(upload_mask=self.upload_masks())
    if self.cache.enabled:
      cache = cache_ops.empty_cache(self.n_public, c)
      server = server.replace(cache_labels=cache.labels, cache_stamp=cache.stamp)
      local = cache_ops.empty_cache(self.n_public, c, k if self.per_client_targets else None)
      server = server.replace(local_stamp=local.stamp)
      if self.per_client_targets:   # each client's own cached labels
        table = table.replace(local_labels=local.labels)
      else:
        server = server.replace(local_labels=local.labels)
    if self.track_clients:
      table = table.replace(client_stamp=jnp.full((k, self.n_public), cache_ops.EMPTY,
                                                  jnp.int32))
      server = server.replace(prev_pre_stamp=jnp.zeros((n,), jnp.int32),
                              prev_post_stamp=jnp.zeros((n,), jnp.int32))
    return state.replace(table=table, extra=server)

  def payload_shape(self) -> tuple[int, ...]:
    return (self.num_classes,)

  def round(self, state, r):
    metrics: dict[str, float] = {}
    payloads: list[comm.Payload] = []
    if self.schedule == 'next_round':
      state = self._client_step(state, r, metrics, payloads)
    state, metrics['train_loss'] = self.train_clients(state, r)
    state = self._server_step(state, r, metrics, payloads)
    if self.schedule == 'same_round':
      state = self._client_step(state, r, metrics, payloads)
    return state, base.RoundOutput(metrics, payloads)

  def evaluate(self, state):
    out = self.server_metrics(state)
    out.update(self.client_metrics(state))
    return out

  # ------------------------------------------------------------ server
  def _server_step(self, state, r, metrics, payloads):
    t, active = r.t, r.active
    ex = state.extra
    draw, _ = self.sample_public(t)
    draw = jnp.asarray(draw, jnp.int32)
    if self.cache.enabled:
      idx, req = cache_ops.select(ex.cache_stamp, draw, t, self.cache.duration)
    else:
      idx, req = draw, jnp.ones(draw.shape, bool)
    x = jnp.take(self.ctx.data.x_public, idx, axis=0)
    act = jnp.asarray(active)
    mask = act[:, None] & req[None, :]
    allowed = state.table.upload_mask
    if allowed is not None:   # the share of the participants' requested uploads that pass
      offered = jnp.maximum(jnp.sum(mask), 1)
      mask = mask & jnp.take(allowed, idx, axis=1)
      metrics['inlier_fraction'] = float(jnp.sum(mask) / offered)
    probs = self.predict_clients(state, r, x)
    probs = probs * mask[:, :, None]
    labels, keep, agg_metrics = self.aggregate(probs, mask)
    metrics.update({k: float(v) for k, v in agg_metrics.items()})
    if self.cache.enabled:
      pre_stamp = ex.cache_stamp[idx]
      server = cache_ops.SoftLabelCache(ex.cache_labels, ex.cache_stamp)
      server, zhat, signals = cache_ops.update_global(server, idx, labels, keep & req, t,
                                                      self.cache.duration)
      ex = ex.replace(cache_labels=server.labels, cache_stamp=server.stamp)
      if self.track_clients:
        ex = ex.replace(prev_pre_stamp=pre_stamp, prev_post_stamp=server.stamp[idx])
      use = signals != cache_ops.ABSENT
      counts = cache_ops.signal_counts(signals)
      metrics.update({f'n_{k}': v for k, v in counts.items() if k != 'absent'})
      metrics['hit_ratio'] = counts['cached'] / float(self.n_round)
    else:
      zhat, signals, use = labels, jnp.full(idx.shape, cache_ops.NEWLY_CACHED, jnp.int32), keep
    metrics['entropy'] = float(jnp.sum(aggregate.entropy(zhat) * use)
                               / jnp.maximum(jnp.sum(use), 1))
    metrics.update(self._label_diagnostics(idx, zhat, use, probs, mask))
    state = state.replace(extra=ex)
    state, metrics['server_distill_loss'] = self._distill_server(state, t, x, zhat, use)
    state, payload = self.downlink(state, r, x, zhat, probs, mask)
    ex = state.extra.replace(has_prev=jnp.ones((), bool), prev_round=jnp.asarray(t, jnp.int32),
                             prev_idx=idx, prev_use=use, prev_signals=signals,
                             prev_payload=payload.astype(jnp.float32), prev_server_labels=zhat)
    rows, requested = int(jnp.sum(mask)), int(jnp.sum(req))
    metrics['requested'] = requested
    metrics['labelled'] = int(jnp.sum(use))
    payloads += [comm.Payload('request', comm.DOWN, 'index', requested, int(np.sum(active)),
                              multicast=True),
                 comm.Payload('uploads', comm.UP, self.upload_kind,
                              rows if self.upload_kind == 'label' else rows * self.num_classes,
                              classes=self.num_classes),
                 comm.Payload('upload_indices', comm.UP, 'index', rows)]
    return state.replace(extra=ex)

  def _label_diagnostics(self, idx, zhat, use, probs, mask) -> dict[str, float]:
    """How often the server's labels and the clients' uploads name the true class.

    Diagnostics only (the open set's labels never reach training): ``label_acc``
    is the argmax accuracy of the labels the round distils on, ``upload_acc``
    the argmax accuracy of the clients' uploads, both over the samples that
    have them. Empty when the public set is another data set (other classes).
    """
    y_pub = self.ctx.data.y_public
    if y_pub is None or self.spec.data.public_source:   # another data set's classes
      return {}
    y = jnp.take(jnp.asarray(y_pub, jnp.int32), idx, axis=0)
    hit = jnp.argmax(zhat, -1) == y
    up_hit = (jnp.argmax(probs, -1) == y[None, :]) & mask
    return {'label_acc': float(jnp.sum(hit * use) / jnp.maximum(jnp.sum(use), 1)),
            'upload_acc': float(jnp.sum(up_hit) / jnp.maximum(jnp.sum(mask), 1))}

  def _distill_server(self, state, t, x, targets, use):
    x, targets, count = _labelled_first(x, targets, use)
    if count == 0:
      return state, float('nan')
    return self.distill_server(state, t, x, targets, count=count)

  # ------------------------------------------------------------ client
  def _client_step(self, state, r, metrics, payloads):
    t, active = r.t, r.active
    ex, table = state.extra, state.table
    if not bool(ex.has_prev):
      return state
    idx, signals, use = ex.prev_idx, ex.prev_signals, ex.prev_use
    x = jnp.take(self.ctx.data.x_public, idx, axis=0)
    targets, weights = self.client_targets(state, r, x, ex.prev_payload)
    fresh = cache_ops.is_fresh(signals)
    receivers = int(np.sum(active))
    if self.cache.enabled:
      own = self.per_client_targets   # per-client labels live in the client table
      local = cache_ops.SoftLabelCache((table if own else ex).local_labels, ex.local_stamp)
      queue = cache_ops.fifo_queue(targets, signals)
      local, targets = cache_ops.rebuild_local(local, idx, signals, queue, ex.prev_round)
      ex = ex.replace(local_stamp=local.stamp)
      if own:
        table = table.replace(local_labels=local.labels)
      else:
        ex = ex.replace(local_labels=local.labels)
      if self.debug and self.downlink_is_server_labels:
        diff = jnp.max(jnp.abs(targets - ex.prev_server_labels) * use[:, None])
        if float(diff) > 0:
          raise AssertionError(f'round {t}: client cache out of sync with the server '
                               f'(max label difference {float(diff):.3g})')
      payloads.append(comm.Payload('signals', comm.DOWN, 'signal', int(jnp.sum(use)),
                                   receivers, multicast=True))
      if self.track_clients:
        act = jnp.asarray(active)
        upd, stale = cache_ops.catch_up_counts(table.client_stamp, idx, ex.prev_pre_stamp, act)
        table = table.replace(client_stamp=cache_ops.sync_clients(
            table.client_stamp, idx, ex.prev_post_stamp, act))
        n_upd, n_stale = int(jnp.sum(upd)), int(jnp.sum(stale))
        metrics['catch_up_entries'] = n_upd + n_stale
        payloads += [comm.Payload('catch_up_labels', comm.DOWN, 'float',
                                  n_upd * self.num_classes),
                     comm.Payload('catch_up_indices', comm.DOWN, 'index', n_upd + n_stale)]
    per_row = self.down_elements_per_row or self.num_classes
    x, targets, count = _labelled_first(x, targets, use)
    payloads += [comm.Payload('labels', comm.DOWN, 'float', int(jnp.sum(fresh & use)) * per_row,
                              receivers, multicast=True),
                 comm.Payload('indices', comm.DOWN, 'index', count, receivers, multicast=True)]
    state = state.replace(extra=ex, table=table)
    if count:
      state, metrics['distill_loss'] = self.distill_clients(
          state, r, x, targets, count=count, weights=weights)
    return state


def _labelled_first(x: Array, targets: Array, use: Array) -> tuple[Array, Array, int]:
  """Moves the samples that have a label to the front (fixed shapes, no recompiles).

  Returns ``(x, targets, count)``; distillation then reads the first ``count``
  rows. ``targets`` may carry a leading client axis.
  """
  order = jnp.argsort(~use, stable=True)
  return (jnp.take(x, order, axis=0), jnp.take(targets, order, axis=-2),
          int(jnp.sum(use)))
