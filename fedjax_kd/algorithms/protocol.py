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
(:meth:`Protocol.upload_masks`), what it uploads (soft or hard labels), how the
server aggregates (:meth:`Protocol.aggregate`), what it sends down
(:meth:`Protocol.downlink`) and how a client turns that into targets
(:meth:`Protocol.client_targets`). Every hook is listed once, with its default
and the algorithms that override it, in the table of :class:`Protocol`'s
docstring, and defined in the hooks section at the top of the class. Everything
carried between rounds is a device array, in :class:`ProtocolTable` (per
client) or :class:`ProtocolServer` (the caches, the pending downlink), so
checkpoints hold it and resume loses nothing.

Each step of a round (``_client_step``, ``_server_step``) returns the state,
its metrics and its payloads; :meth:`Protocol.round` merges them. Metrics and
payload counts stay device scalars: the round reads to the host only what its
own control flow needs (whether a downlink is pending, how many samples carry a
label), and ``play_round`` reads the rest once per round.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, ClassVar

import flax

import jax
import jax.numpy as jnp
import ml_collections
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
  """Base class of the public-set FD family (the round: the module docstring).

  A member of the family is this class with some of its hooks overridden. Every
  hook is in the "hooks" section right below, with its default; the rest of the
  class (the round, the cache, the byte accounting) is the same for all:

  =============================  ==============================  ================================
  hook                           default                         overridden by
  =============================  ==============================  ================================
  ``schedule``                   ``'next_round'``: step 1 opens  DS-FL (``dsfl.schedule``,
                                 the next round (SCARLET's       ``'same_round'`` by default)
                                 code)
  ``cache_by_default``           False: ``cache.mode='auto'``    SCARLET (True)
                                 is off
  ``per_client_targets``         False: one set of targets for   COMET (True)
                                 all
  ``upload_masks()``             None: every client may upload   Selective-FD (KuLSIF client-side
                                 every requested sample          selectors)
  ``upload_kind``                ``'float'``: C soft-label       CFD (``'label'``: one hard label
                                 floats a sample                 a sample)
  ``aggregate(probs, mask)``     none: every member defines it   DS-FL (SA/ERA), SCARLET
                                                                 (Enhanced ERA), CFD (votes),
                                                                 COMET (mean), Selective-FD
                                                                 (server-side selector)
  ``payload_shape()``            ``(C,)``: one label a sample    COMET (``(clusters, C)``)
  ``downlink(...)``              the server's labels             CFD (the server model's
                                                                 outputs), COMET (centroids)
  ``down_elements_per_row``      None: C floats a fresh sample   COMET
  ``downlink_is_server_labels``  True: clients get the server's  CFD, COMET (False)
                                 labels (the debug check
                                 applies)
  ``client_targets(...)``        the downlink as sent, no loss   COMET (nearest centroid,
                                 weights                         ``comet.weight``)
  =============================  ==============================  ================================
  """
  uses_public = True
  has_server_model = True

  # ================================================================ hooks
  # Everything a member of the family may override, in the order of the table above.

  @property
  def schedule(self) -> str:
    """When clients distil on the server's labels: ``'next_round'`` (step 1 at the start of the
    next round, SCARLET's code) or ``'same_round'`` (at the end of this one, DS-FL's paper)."""
    return 'next_round'

  cache_by_default: ClassVar[bool] = False
  """The cache's state under ``cache.mode='auto'`` (True for SCARLET)."""

  per_client_targets: ClassVar[bool] = False
  """True: the targets differ per client (COMET), so the clients' caches hold one copy each."""

  def upload_masks(self) -> Array | None:
    """``[K, N_pub]`` bool: which public samples each client may upload (None: all).

    Computed once, in :meth:`init`; it becomes ``ProtocolTable.upload_mask``.
    """
    return None

  upload_kind: ClassVar[str] = 'float'
  """What a client uploads per sample: ``'float'`` (C soft-label floats) or ``'label'`` (one
  hard label, CFD)."""

  def aggregate(self, probs: Array, mask: Array) -> tuple[Array, Array, dict]:
    """Server aggregation of uploads.

    Args:
      probs: ``[S, n, C]`` client probabilities (zero where ``mask`` is False).
      mask: ``[S, n]`` which client uploaded which sample.

    Returns:
      ``(labels [n, C], keep [n] bool, metrics)``: the server's training
      labels, which samples got one, and scalar diagnostics (device scalars
      are fine: they are read with the round's other metrics).
    """
    raise NotImplementedError

  def payload_shape(self) -> tuple[int, ...]:
    """The shape of the downlink per sample (``ProtocolServer.prev_payload``'s rows)."""
    return (self.num_classes,)

  def downlink(self, state, r: base.Round, x: Array, labels: Array, probs: Array,
               mask: Array) -> tuple[base.AlgState, Array]:
    """What the server sends for the fresh samples, aligned with ``x``
    (``[n, *payload_shape()]``).

    Default: the server's labels (DS-FL, SCARLET, Selective-FD).
    """
    del r, x, probs, mask
    return state, labels

  down_elements_per_row: ClassVar[int | None] = None
  """Floats sent down per fresh sample (None: C)."""

  downlink_is_server_labels: ClassVar[bool] = True
  """False when clients get other content than the server's labels (CFD, COMET); the
  ``FEDJAX_KD_DEBUG`` cache check compares the two only when True."""

  def client_targets(self, state, r: base.Round, x: Array,
                     payload: Array) -> tuple[Array, Array | None]:
    """Turns the downlink payload into distillation targets.

    Returns:
      ``(targets [n, C] or [S, n, C], loss weights [S] or None)``.
    """
    del state, r, x
    return payload, None

  def weighted_targets(self) -> bool:
    """Whether :meth:`client_targets` gives loss weights (COMET's lambda other than 1)."""
    return False

  # ============================================================== the rest
  def programs(self, shapes):
    del shapes
    return (self.planned_training(),
            self.planned_distillation(self.per_client_targets, self.weighted_targets()),
            self.planned_server_distillation())

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
  @functools.cached_property
  def cache(self) -> CacheOptions:
    """The soft-label cache's options: the member's own ``cache`` field, or, for a member
    whose options do not nest :class:`CacheOptions` (or that has none), the ``cache.*``
    group read from the config as the built-in members read it."""
    own = getattr(self.options, 'cache', None)
    if isinstance(own, CacheOptions):
      return own
    config = self.spec.raw if self.spec.raw is not None else ml_collections.ConfigDict()
    return options.read(CacheOptions, config, self.spec, type(self))

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

  def round(self, state, r):
    """One round: each step returns its metrics and payloads, merged here in round order.

    The metrics and payload counts stay device values; ``play_round`` reads them once.
    """
    metrics: dict[str, Any] = {}
    payloads: list[comm.Payload] = []
    if self.schedule == 'next_round':
      state, step_metrics, step_payloads = self._client_step(state, r, self._pending(state, r))
      metrics.update(step_metrics)
      payloads += step_payloads
    state, metrics['train_loss'] = self.train_clients(state, r)
    state, step_metrics, step_payloads = self._server_step(state, r)
    metrics.update(step_metrics)
    payloads += step_payloads
    if self.schedule == 'same_round':
      state, step_metrics, step_payloads = self._client_step(state, r, True)
      metrics.update(step_metrics)
      payloads += step_payloads
    # The server step left a downlink: the next round's clients receive it.
    return state, base.RoundOutput(metrics, payloads, carry={PENDING: True})

  @staticmethod
  def _pending(state, r) -> bool:
    """Whether a downlink waits for this round's clients (none before the first server step,
    which is not always round 1's): the host fact the last round left, else (the first round
    after a resume) one read of the state's flag."""
    if r.carried is not None:
      return bool(r.carried.get(PENDING, False))
    return bool(jax.device_get(state.extra.has_prev))

  def evaluate(self, state):
    out = self.server_metrics(state)
    out.update(self.client_metrics(state))
    return out

  # ------------------------------------------------------------ server
  def _server_step(self, state, r) -> tuple[base.AlgState, dict[str, Any], list[comm.Payload]]:
    """Steps 3-4: the request, the uploads, aggregation, the cache, the server's distillation
    and the downlink it leaves for the clients.

    Returns:
      ``(state, metrics, payloads)``; metrics and payload counts are device scalars.
    """
    t, active = r.t, r.active
    ex = state.extra
    metrics: dict[str, Any] = {}
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
      metrics['inlier_fraction'] = jnp.sum(mask) / offered
    probs = self.predict_clients(state, r, x)
    probs = probs * mask[:, :, None]
    labels, keep, agg_metrics = self.aggregate(probs, mask)
    # Floats, as they always were: a host number as it is, a device value as float32.
    metrics.update({k: float(v) if isinstance(v, (int, float, np.number)) else
                    jnp.asarray(v, jnp.float32) for k, v in agg_metrics.items()})
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
      metrics['hit_ratio'] = counts['cached'] / self.n_round
    else:
      zhat, signals, use = labels, jnp.full(idx.shape, cache_ops.NEWLY_CACHED, jnp.int32), keep
    metrics['entropy'] = (jnp.sum(aggregate.entropy(zhat) * use)
                          / jnp.maximum(jnp.sum(use), 1))
    metrics.update(self.label_diagnostics(idx, zhat, use, probs, mask))
    state = state.replace(extra=ex)
    # The server distils on the samples that have a label (with the cache on, all of a
    # round's samples may be cached ones): their count stays on the device, and with none
    # every step is empty and leaves the model as it was (the loss is then NaN).
    labelled = jnp.sum(use)
    xs, zs = _labelled_first(x, zhat, use)
    state, loss = self.distill_server(state, t, xs, zs, count=labelled)
    metrics['server_distill_loss'] = base.Later((loss, labelled), _loss_if_distilled)
    state, payload = self.downlink(state, r, x, zhat, probs, mask)
    ex = state.extra.replace(has_prev=jnp.ones((), bool), prev_round=jnp.asarray(t, jnp.int32),
                             prev_idx=idx, prev_use=use, prev_signals=signals,
                             prev_payload=payload.astype(jnp.float32), prev_server_labels=zhat)
    rows, requested = jnp.sum(mask), jnp.sum(req)
    metrics['requested'] = requested
    metrics['labelled'] = labelled
    payloads = [comm.Payload('request', comm.DOWN, 'index', requested, int(np.sum(active)),
                             multicast=True),
                comm.Payload('uploads', comm.UP, self.upload_kind, rows,
                             classes=self.num_classes,
                             scale=1 if self.upload_kind == 'label' else self.num_classes),
                comm.Payload('upload_indices', comm.UP, 'index', rows)]
    return state.replace(extra=ex), metrics, payloads

  def label_diagnostics(self, idx, zhat, use, probs, mask) -> dict[str, Array]:
    """How often the server's labels and the clients' uploads name the true class.

    Diagnostics only (the open set's labels never reach training): ``label_acc``
    is the argmax accuracy of the labels the round distils on, ``upload_acc``
    the argmax accuracy of the clients' uploads, both over the samples that
    have them (device scalars). Empty when the public set is another data set
    (other classes).
    """
    y_pub = self.ctx.data.y_public
    if y_pub is None or self.spec.data.public_source:   # another data set's classes
      return {}
    y = jnp.take(jnp.asarray(y_pub, jnp.int32), idx, axis=0)
    if self.spec.data.num_public_noise:   # added noise rows have no class: left out
      use, mask = use & (y >= 0), mask & (y >= 0)[None, :]
    hit = jnp.argmax(zhat, -1) == y
    up_hit = (jnp.argmax(probs, -1) == y[None, :]) & mask
    return {'label_acc': jnp.sum(hit * use) / jnp.maximum(jnp.sum(use), 1),
            'upload_acc': jnp.sum(up_hit) / jnp.maximum(jnp.sum(mask), 1)}

  # ------------------------------------------------------------ client
  def _client_step(self, state, r, pending: bool
                   ) -> tuple[base.AlgState, dict[str, Any], list[comm.Payload]]:
    """Step 1: the pending downlink (if ``pending``) reaches the round's clients, who rebuild
    their targets (from their caches when the cache is on) and distil on them.

    Returns:
      ``(state, metrics, payloads)``; metrics and payload counts are device scalars.
    """
    t, active = r.t, r.active
    ex, table = state.extra, state.table
    metrics: dict[str, Any] = {}
    payloads: list[comm.Payload] = []
    if not pending:
      return state, metrics, payloads
    idx, signals, use = ex.prev_idx, ex.prev_signals, ex.prev_use
    # The clients distil on the downlink's samples that carry a label: a device count, as
    # in the server step (none: empty steps, no change, and no distill_loss).
    labelled = jnp.sum(use)
    x = jnp.take(self.ctx.data.x_public, idx, axis=0)
    targets, weights = self.client_targets(state, r, x, ex.prev_payload)
    fresh = cache_ops.is_fresh(signals)
    receivers = int(np.sum(active))   # a host mask: no device read
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
        if float(diff) > 0:   # debug mode only: a read per round is its price
          raise AssertionError(f'round {t}: client cache out of sync with the server '
                               f'(max label difference {float(diff):.3g})')
      payloads.append(comm.Payload('signals', comm.DOWN, 'signal', labelled, receivers,
                                   multicast=True))
      if self.track_clients:
        act = jnp.asarray(active)
        upd, stale = cache_ops.catch_up_counts(table.client_stamp, idx, ex.prev_pre_stamp, act)
        table = table.replace(client_stamp=cache_ops.sync_clients(
            table.client_stamp, idx, ex.prev_post_stamp, act))
        n_upd, n_stale = jnp.sum(upd), jnp.sum(stale)
        metrics['catch_up_entries'] = n_upd + n_stale
        payloads += [comm.Payload('catch_up_labels', comm.DOWN, 'float', n_upd,
                                  scale=self.num_classes),
                     comm.Payload('catch_up_indices', comm.DOWN, 'index', n_upd + n_stale)]
    per_row = self.down_elements_per_row or self.num_classes
    payloads += [comm.Payload('labels', comm.DOWN, 'float', jnp.sum(fresh & use), receivers,
                              multicast=True, scale=per_row),
                 comm.Payload('indices', comm.DOWN, 'index', labelled, receivers,
                              multicast=True)]
    state = state.replace(extra=ex, table=table)
    x, targets = _labelled_first(x, targets, use)
    state, loss = self.distill_clients(state, r, x, targets, count=labelled, weights=weights)
    metrics['distill_loss'] = base.Later((loss, labelled),
                                         functools.partial(_loss_if_distilled, none=None))
    return state, metrics, payloads


def _loss_if_distilled(value, none=float('nan')) -> float | None:
  """A distillation loss read with its sample count: ``none`` where no sample was distilled
  (the server's NaN; None leaves the clients' out of the round's metrics)."""
  loss, count = value
  return none if int(count) == 0 else float(loss)


# RoundOutput.carry's key: the round's server step left a downlink for the next round.
PENDING = 'downlink_pending'


def _labelled_first(x: Array, targets: Array, use: Array) -> tuple[Array, Array]:
  """Moves the samples that have a label to the front (fixed shapes, no recompiles).

  Returns ``(x, targets)``; distillation then reads the first ``sum(use)`` rows.
  ``targets`` may carry a leading client axis.
  """
  order = jnp.argsort(~use, stable=True)
  return jnp.take(x, order, axis=0), jnp.take(targets, order, axis=-2)
