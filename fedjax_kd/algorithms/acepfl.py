"""ACE-pFL: EMD-based client clustering, dynamic temperature and triple distillation.

K. He, H. Bai, Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient Personalized
Federated Learning With Knowledge Distillation", IEEE/ACM Transactions on Networking
2025 (Algorithms 1-2, Eqs. 2-4). Where the paper is silent or inconsistent, the
choices below say what we do and why (also in ``docs/papers.md``).

Personalised FL with heterogeneous client models that exchange only soft predictions
on a shared, *labelled* public set D0. Before round 1 the clients are clustered once
(:func:`fedjax_kd.ops.label_cluster.cluster_clients`): each client's label histogram
is compared with a random reference client's (total variation by default: the printed
EMD program is degenerate), and the N distances are split by exact 1-D k-means
(deterministic, where the paper gives no initialisation); ``cluster_method='matrix'``
is Table V's comparator. A round, for every participating client:

1. local training on the private data (CE, ``train.*``, lr eta1);
2. the temperature ``T_r`` of Eq. 2 (:mod:`fedjax_kd.ops.temperature`: stages of
   ``r0`` rounds as the text describes, and a normalised sigmoid argument so the
   curve rises smoothly instead of in steps);
3. soft predictions ``softmax(z / T_r)`` on all of D0 (inference mode), top-K
   filtered, optionally with noise (off by default; the paper gives no mechanism),
   uploaded as K values + K indices per
   sample. The receiver completes each row (``renormalize``): by default the
   missing mass ``1 - sum(top-K)`` is spread over the dropped classes
   (``'fill'``). This departs from the plain reading (rescale the K values, zeros
   elsewhere, ``'client'``): at T = 35-50 those zeros are unreachable targets --
   the KD gradient ``T (q - t)`` stays near ``T / C`` per dropped class, logits grow
   without bound, and on digits training diverged (UA 0.225 against 0.975);

4. the server's aggregate: Eq. 3 (``aggregation='eq3_global'``, default: the mean
   inside each cluster, clusters weighted by their data share, one teacher for
   everybody, as Eq. 3, Algorithm 1 and Fig. 1 describe; the weights are read so
   that they sum to 1), one teacher per cluster (``'per_cluster'``, the option for
   testing the clustering ablation) or the plain mean of Eq. 1 (``'mean'``);
5. the distillation update on D0 (``distill.*``, lr eta2) with the triple loss of
   Eq. 4 (:func:`fedjax_kd.ops.losses.triple_distillation_loss`):
   ``0.4 CE(public labels) + T^2 [0.3 KL(s^r||q) + 0.2 KL(s^b||q) + 0.1 KL(M||q)]``,
   teacher-first KL (the printed student-first KL is infinite against a top-K
   teacher's zeros). ``s^b`` is the client's best past model (by validation
   accuracy; the paper does not say by what), kept as its log-probabilities on D0;
   ``M`` is the running mean of past aggregates, towards which the student distils
   (the printed ``KL(s^r || M)`` does not depend on the client model). Both are
   device arrays (in the client table and the
   server state), so checkpoints hold them. ``L_SD`` and ``L_GD`` start in round 2.

The evaluated quantity is the unweighted mean of the clients' personalised test
accuracies; the sample-weighted mean is logged too.

:class:`FedMD` is the FedMD-style baseline (Li & Wang, "FedMD: Heterogenous
Federated Learning via Model Distillation", NeurIPS 2019 workshop) on the same
engine: the plain mean of full soft predictions at one fixed temperature, clients
distil towards it (no clustering, no top-K, no past-model terms).
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
from fedjax_kd.core import rng
from fedjax_kd.core.program import SGD
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import aggregate, comm, label_cluster, losses, privacy
from fedjax_kd.ops import temperature as temperature_ops
from fedjax_kd.ops.errors import ParamError

AGGREGATIONS = ('eq3_global', 'per_cluster', 'mean')
CLUSTER_METHODS = ('vector', 'matrix')
# How a filtered row becomes a teacher: 'fill' (default, see the note in ACEPFL),
# 'client' (kept entries rescaled to 1, zeros elsewhere), 'server' (the aggregate
# is rescaled) or 'none' (sub-stochastic rows, literal).
RENORMALIZE = ('fill', 'client', 'server', 'none')
GD_MODES = ('student', 'literal')
BEST_METRICS = ('val', 'public')
DISTILLATION = ('triple', 'double', 'single')
NOISE = ('none', 'gaussian', 'laplace')


def _weights(value, field: str) -> tuple[float, ...]:
  """Eq. 4's four weights: numbers >= 0, not all 0."""
  try:
    weights = tuple(float(w) for w in value)
  except (TypeError, ValueError):
    weights = ()
  if len(weights) != 4 or any(not np.isfinite(w) or w < 0 for w in weights) or not any(weights):
    raise ConfigError(field, value, 'four numbers >= 0, not all 0: (alpha1 CE, alpha2 KD, '
                      'alpha3 SD, alpha4 GD), e.g. [0.4, 0.3, 0.2, 0.1]')
  return weights


@dataclasses.dataclass(frozen=True)
class ACEOptions:
  """``acepfl.*`` (what each choice follows: docs/papers.md). :meth:`validate` resolves the
  ablation switches into the fields the algorithm reads (``clustering=False``: one cluster;
  ``dynamic_temperature=False``: ``curve='fixed'``; ``distillation``: zeroed weights)."""
  group: ClassVar[str] = 'acepfl'
  clusters: int = options.option(3, '|V|, at most clients.num_clients', ge=1)
  clustering: bool = options.option(True, 'ablation switch: False is one cluster (Table XI)')
  cluster_method: str = options.option('vector', "'vector' (Algorithm 2) or 'matrix' "
                                       '(Table V)', choices=CLUSTER_METHODS)
  distance: str = options.option('tv', "'tv' (0/1 ground EMD), 'l1', 'emd1d' or "
                                 "'sorted_literal'", choices=label_cluster.METRICS)
  reference: int = options.option(-1, 'the reference client z; -1 draws it from the seed',
                                  ge=-1)
  aggregation: str = options.option('eq3_global', "'eq3_global', 'per_cluster' or 'mean' "
                                    '(Eq. 1)', choices=AGGREGATIONS)
  top_k: int = options.option(5, 'K entries kept per uploaded row; 0 keeps all classes', ge=0)
  renormalize: str = options.option('fill', "top-K rows: 'fill', 'client', 'server' or "
                                    "'none'", choices=RENORMALIZE)
  t0: float = options.option(30.0, 'Eq. 2: the initial temperature')
  k1: float = options.option(5.0, 'Eq. 2: k1')
  k2: float = options.option(5.0, 'Eq. 2: k2')
  r0: int = options.option(100, 'Eq. 2: rounds a stage', ge=1)
  curve: str = options.option('f1', "'f1' (Eq. 2), 'f2'..'f5' (Table XIII) or 'fixed'",
                              choices=temperature_ops.CURVES)
  dynamic_temperature: bool = options.option(True, 'ablation switch: False keeps T0 every '
                                             'round (Table XII)')
  stage_div: str = options.option('r0', "'r0' (as the text) or 'T0' (as printed)",
                                  choices=('r0', 'T0'))
  normalize_delta: bool = options.option(True, 'sigmoid of (r mod r0) / r0, not of the raw '
                                         'r mod r0')
  weights: tuple[float, ...] = options.option((0.4, 0.3, 0.2, 0.1), 'alpha1..4: CE, KD, SD, '
                                              'GD (Eq. 4)', check=_weights)
  distillation: str = options.option('triple', "ablation switch: 'triple', 'double' or "
                                     "'single'", choices=DISTILLATION)
  kl_direction: str = options.option('teacher_student', "standard KD or 'student_teacher' "
                                     '(as printed)', choices=losses.KL_DIRECTIONS)
  gd_mode: str = options.option('student', "KL(M || student), or 'literal' (logged, no "
                                'gradient)', choices=GD_MODES)
  best_metric: str = options.option('val', "the best past model by 'val' or 'public' "
                                    'accuracy', choices=BEST_METRICS)
  hist_epsilon: float = options.option(0.0, 'Laplace epsilon on the label counts; 0 is off',
                                       ge=0)
  noise: str = options.option('none', "noise on the uploads: 'none', 'gaussian' or "
                              "'laplace'", choices=NOISE)
  noise_scale: float = options.option(0.0, 'its sigma or b (no formal epsilon accounting)',
                                      ge=0)

  def validate(self, spec, algorithm) -> ACEOptions:
    g = self.group
    k = spec.clients.num_clients
    if self.clusters > k:
      raise ConfigError(f'{g}.clusters', self.clusters,
                        f'an integer in [1, {k}] (at most clients.num_clients)')
    if self.reference > k - 1:
      raise ConfigError(f'{g}.reference', self.reference, f'an integer in [-1, {k - 1}]')
    if spec.data.num_public_noise:
      raise ConfigError('data.num_public_noise', spec.data.num_public_noise,
                        '0 for acepfl (it trains on the open set\'s labels, which the added '
                        'noise rows do not have)')
    weights = self.weights
    if self.distillation in ('double', 'single'):   # ablations: zeroed, not renormalised
      weights = weights[:3] + (0.0,)
    if self.distillation == 'single':
      weights = weights[:2] + (0.0, 0.0)
    o = dataclasses.replace(self, clusters=self.clusters if self.clustering else 1,
                            curve=self.curve if self.dynamic_temperature else 'fixed',
                            weights=weights)
    try:
      temperature_ops.validate_temperature(o.t0, o.k1, o.k2, o.r0, o.curve, o.stage_div)
    except ParamError as e:
      raise fields.field_error(e, algorithm.param_fields()) from None
    if o.best_metric == 'val' and o.weights[2] > 0 and spec.data.val_fraction <= 0:
      raise ConfigError('data.val_fraction', spec.data.val_fraction,
                        "a number in (0, 1) when acepfl.best_metric='val' (the best past "
                        "model is chosen on each client's validation rows); or set "
                        "acepfl.best_metric='public'")
    if o.noise != 'none' and o.noise_scale <= 0:
      raise ConfigError(f'{g}.noise_scale', o.noise_scale,
                        f"a number > 0 with acepfl.noise={o.noise!r}")
    if o.weights[0] > 0 and spec.data.public_source:
      raise ConfigError('data.public_source', spec.data.public_source,
                        "'' (ACE-pFL's CE term trains on the public labels, so the public "
                        'set must come from the task\'s own data set); or set '
                        'acepfl.weights[0] = 0')
    return o


def _ace_loss(logits, batch, row, *, direction):
  """The distillation program's loss: Eq. 4 on a public batch.

  One teacher for everybody (Eq. 3, Eq. 1) comes gathered in ``batch`` (no per-client
  copies); per-cluster teachers come per client in ``row``. The choice is static (the
  dicts' keys), so each mode compiles once.
  """
  pos = batch['_pos']
  s = batch['s'] if 's' in batch else row['s'][pos]
  m = batch['m'] if 'm' in batch else row['m'][pos]
  return losses.triple_distillation_loss(
      logits, batch['y'], s, row['best'][pos], m, row['T'], row['w'], direction)


# One module-level function per direction, so the engine's jit cache sees stable objects.
_LOSS_FNS = {d: functools.partial(_ace_loss, direction=d) for d in losses.KL_DIRECTIONS}


_COMPLETION = {'fill': 'fill', 'client': 'renormalize', 'server': 'none', 'none': 'none'}


@functools.partial(jax.jit, static_argnames=('k', 'completion', 'noise'))
def _upload(logp: jax.Array, temperature: jax.Array, active: jax.Array, key: jax.Array,
            scale: jax.Array, *, k: int, completion: str, noise: str) -> tuple[jax.Array,
                                                                                jax.Array]:
  """Each client's upload as the server reads it.

  ``softmax(z / T)`` (``logp`` are log-probabilities, and
  ``softmax(logp / T) == softmax(z / T)``), top-K filtered, optionally noised on
  the kept entries, then completed to a full row
  (:func:`fedjax_kd.ops.aggregate.complete_top_k`).

  Returns:
    ``(rows [K, m, C], kept [K, m, C] bool)``, zero for inactive clients.
  """
  probs = jax.nn.softmax(logp / temperature, axis=-1)
  probs, kept = aggregate.top_k_filter(probs, k, renormalize=False)
  if noise != 'none':
    probs = privacy.noisy_topk_probs(key, probs, kept, noise, scale, renormalize=False)
  probs = aggregate.complete_top_k(probs, kept, completion)
  mask = active[:, None, None]
  return jnp.where(mask, probs, 0.0), kept & mask


@jax.jit
def _teacher_stats(teachers: jax.Array, y_pub: jax.Array) -> dict[str, jax.Array]:
  """Per-teacher non-zeros (download size), entropy and public-label accuracy (device)."""
  return {'nnz': jnp.sum(teachers > 0, axis=(1, 2)),
          'entropy': jnp.mean(aggregate.entropy(teachers), axis=1),
          'acc': jnp.mean(jnp.argmax(teachers, -1) == y_pub[None], axis=1)}


def _teacher_metrics(stats: dict[str, jax.Array], fresh: np.ndarray) -> dict[str, jax.Array]:
  """Entropy and public-label accuracy of this round's aggregates (diagnostics, device
  scalars); ``fresh`` is the host mask of the teachers that got uploads."""
  n = int(fresh.sum())
  if not n:
    return {}
  f = jnp.asarray(fresh)   # a mask of fixed shape [V]: no new program when the count changes
  return {'teacher_entropy': jnp.sum(jnp.where(f, stats['entropy'], 0.0)) / n,
          'teacher_acc': jnp.sum(jnp.where(f, stats['acc'], 0.0)) / n}


@jax.jit
def _literal_gd(teachers: jax.Array, history: jax.Array, temperature: jax.Array) -> jax.Array:
  """Eq. 4's printed ``L_GD = T^2 KL(s^r || M)`` of each teacher ``[V]``: a constant of the
  client model (no gradient)."""
  kl = losses.tempered_kl(jnp.log(jnp.maximum(history, 1e-30)), teachers)   # [V, m]
  return temperature**2 * jnp.mean(kl, axis=-1)


def _ratio(sum_count) -> float | None:
  """``sum / count`` of a host pair, None for a zero count (a metric left out)."""
  total, count = sum_count
  return float(total / count) if count else None


@flax.struct.dataclass
class ACEPFLTable:
  """Per client (rows: clients).

  Attributes:
    best_acc: ``[K]`` the selection accuracy of the client's best past model
      (-1: none yet; a finite sentinel, the runner's NaN guard rejects any other).
    best_logp: ``[K, m, C]`` that model's log-probabilities on D0 (SD's teacher).
    size: ``[K]`` int, the client's private data size D_n (Eq. 3's weights; constant).
    cluster: ``[K]`` int, the client's cluster (Algorithm 2; constant).
    teacher_of: ``[K]`` int, which aggregate the client distils from (its cluster
      with per-cluster aggregation, else 0; constant).
  """
  best_acc: Any
  best_logp: Any
  size: Any
  cluster: Any
  teacher_of: Any


@flax.struct.dataclass
class ACEPFLServer:
  """The running mean of past aggregates per teacher (the target of ``L_GD``).

  Attributes:
    hist: ``[V, m, C]`` the mean of each teacher's aggregates so far.
    hist_count: ``[V]`` how many aggregates each mean holds.
  """
  hist: Any
  hist_count: Any


class ACEPFL(base.Algorithm):
  """ACE-pFL; see the module docstring."""
  name = 'acepfl'
  options_class = ACEOptions
  paper_rules = 'acepfl'
  uses_public = True
  samples_public = False      # the whole labelled D0 every round, in a fixed order
  has_server_model = False

  @classmethod
  def param_fields(cls) -> dict[str, str]:
    """The config field behind each parameter of the ops this algorithm calls."""
    g = cls.name
    return {'t0': f'{g}.t0', 'k1': f'{g}.k1', 'k2': f'{g}.k2', 'r0': f'{g}.r0',
            'curve': f'{g}.curve', 'stage_div': f'{g}.stage_div', 'rounds': 'rounds',
            'num_clusters': f'{g}.clusters', 'method': f'{g}.cluster_method',
            'metric': f'{g}.distance', 'reference': f'{g}.reference'}

  def __init__(self, ctx: base.Context):
    super().__init__(ctx)
    o = self.options
    d = self.ctx.data
    self.num_classes = c = d.num_classes
    if o.top_k > c:
      raise ConfigError('acepfl.top_k', o.top_k,
                        f'an integer in [0, {c}] (the number of classes; 0 keeps all)')
    self.k_top = o.top_k or c
    self.x_pub = d.x_public
    self.m = int(d.x_public.shape[0])
    if self.m == 0:
      raise ConfigError('data.num_public', 0, 'an integer >= 1 (ACE-pFL distils on D0)')
    self.y_pub = jnp.asarray(d.y_public, jnp.int32)
    if o.weights[0] > 0 and int(jnp.max(self.y_pub)) >= c:
      raise ConfigError('data.public_source', self.spec.data.public_source,
                        f'a public set whose labels are in [0, {c})')
    try:
      self._cluster()
      self.temps = temperature_ops.temperature_schedule(
          max(self.spec.rounds, 1), t0=o.t0, k1=o.k1, k2=o.k2, r0=o.r0, curve=o.curve,
          stage_div=o.stage_div, normalize_delta=o.normalize_delta)
    except ParamError as e:
      raise fields.field_error(e, self.param_fields()) from None
    self.rules = comm.get_rules(self.spec.comm.rules, self.paper_rules)
    # D0 is never augmented; lr eta2 (distill.*).
    self.distillation = SGD(_LOSS_FNS[o.kl_direction], self.spec.distill.epochs,
                            self.spec.distill.batch_size, slot=self.distill_slot)

  def programs(self, shapes):
    k, m, c, v = self.num_clients, self.m, self.num_classes, self.n_teachers
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    row = {'best': shapes.table.best_logp, 'T': f32(k), 'w': f32(k, 4)}
    columns = {'y': self.y_pub}
    if v == 1:
      columns.update(s=f32(m, c), m=f32(m, c))
    else:
      row.update(s=f32(k, m, c), m=f32(k, m, c))
    return (self.planned_training(),
            base.planned(self.distillation, base.public_rows(self.x_pub, k, **columns), row,
                         None))

  # ---------------------------------------------------------- clustering
  def _cluster(self):
    """Algorithm 2, once, on the host (deterministic given the seed)."""
    o = self.options
    counts = self.ctx.data.client_labels().astype(np.float64)
    gen = rng.host_rng(self.spec.seed, 0, 'custom')
    hist = None
    if o.hist_epsilon > 0:   # epsilon-DP histogram: Laplace on the label counts, clipped at 0
      noisy = privacy.laplace_counts(gen, counts, o.hist_epsilon)
      hist = label_cluster.label_histograms(np.maximum(noisy, 0) + 1e-12)
    reference = o.reference if o.reference >= 0 else int(gen.integers(self.num_clients))
    self.clustering = label_cluster.cluster_clients(
        counts, o.clusters, method=o.cluster_method, metric=o.distance, reference=reference,
        hist=hist)
    self.num_clusters = int(self.clustering.num_clusters)
    self.n_teachers = self.num_clusters if o.aggregation == 'per_cluster' else 1

  def cluster_summary(self) -> dict[str, float]:
    """The clustering diagnostics logged once (Fig. 3's intra-cluster distance)."""
    out = {'clusters': self.num_clusters, 'reference_client': int(self.clustering.reference)}
    labels = np.asarray(self.clustering.labels)
    for v, dist in enumerate(np.asarray(self.clustering.intra_distance)):
      out[f'cluster{v}_size'] = int(np.sum(labels == v))
      out[f'cluster{v}_intra_distance'] = float(dist)
    return out

  # ------------------------------------------------------------ lifecycle
  def init(self) -> base.AlgState:
    state = super().init()
    k, m, c, v = self.num_clients, self.m, self.num_classes, self.n_teachers
    cluster = np.asarray(self.clustering.labels, np.int32)
    table = ACEPFLTable(
        best_acc=jnp.full((k,), -1.0, jnp.float32),
        best_logp=jnp.zeros((k, m, c), jnp.float32),
        size=jnp.asarray(self.ctx.data.client_n, jnp.int32),
        cluster=jnp.asarray(cluster),
        teacher_of=jnp.asarray(cluster if v > 1 else np.zeros_like(cluster)))
    server = ACEPFLServer(hist=jnp.zeros((v, m, c), jnp.float32),
                          hist_count=jnp.zeros((v,), jnp.int32))
    return state.replace(table=table, extra=server)

  def setup_payloads(self) -> list[comm.Payload]:
    """Open data (the labelled D0) plus the one-time clustering traffic."""
    out = super().setup_payloads()
    n, c = self.num_clients, self.num_classes
    if self.options.clusters > 1:
      if self.options.cluster_method == 'vector':
        out += [comm.Payload('reference_histogram', comm.DOWN, 'float', c, n - 1,
                             multicast=True),
                comm.Payload('distances', comm.UP, 'float', 1, n)]
      else:
        out += [comm.Payload('histograms', comm.UP, 'float', c, n)]
      out += [comm.Payload('cluster_ids', comm.DOWN, 'index', 1, n)]
    if self.options.aggregation == 'eq3_global' and self.num_clusters > 1:
      out += [comm.Payload('data_sizes', comm.UP, 'index', 1, n)]   # D_n for Eq. 3
    return out

  def temperature(self, t: int) -> float:
    o = self.options
    if t <= len(self.temps):
      return float(self.temps[t - 1])
    return temperature_ops.dynamic_temperature(
        t, o.t0, o.k1, o.k2, o.r0, curve=o.curve, stage_div=o.stage_div,
        normalize_delta=o.normalize_delta, rounds=self.spec.rounds)

  # ---------------------------------------------------------------- round
  def round(self, state, r):
    t, active = r.t, r.active
    o = self.options
    temp = self.temperature(t)
    # Host numbers and device scalars; play_round reads the device ones once.
    metrics: dict[str, Any] = {'temperature': temp}
    if t == 1:
      metrics.update(self.cluster_summary())
    payloads: list[comm.Payload] = []
    act = jnp.asarray(active)
    n_act = int(np.sum(active))   # a host mask: no device read
    k = r.num_clients

    # 1. Local training on private data (lr eta1).
    state, metrics['train_loss'] = self.train_clients(state, r)

    # 2-3. Tempered, top-K filtered soft predictions on D0.
    logp = r.fed.predict(state.clients, self.x_pub, active, chunk=self.spec.eval.chunk,
                         log=True)
    up, kept = _upload(logp, jnp.float32(temp), act, rng.server_key(self.ctx.root, t, 'custom'),
                       jnp.float32(o.noise_scale), k=self.k_top,
                       completion=_COMPLETION[o.renormalize], noise=o.noise)
    filtered = self.k_top < self.num_classes
    payloads.append(comm.Payload('soft_predictions', comm.UP, 'float', self.m * self.k_top,
                                 n_act))
    if filtered:
      payloads.append(comm.Payload('topk_indices', comm.UP, 'index', self.m * self.k_top, n_act))

    # 4. Server aggregation (Eq. 3 / per cluster / Eq. 1).
    table, ex = state.table, state.extra
    # The round's clients' clusters and data sizes, the constants ``table.cluster`` and
    # ``table.size`` hold, taken on the host (no device read).
    cluster = np.asarray(self.clustering.labels, np.int32)[r.ids]
    size = np.asarray(self.ctx.data.client_n, np.int32)[r.ids]
    teachers, fresh = self.aggregate_uploads(up, active, cluster, size)
    stats = _teacher_stats(teachers, self.y_pub)
    payloads += self._downlink_payloads(stats['nnz'], active, cluster)

    # 5. Triple distillation on D0 (lr eta2).
    hist, hist_count = ex.hist, ex.hist_count
    has_best = table.best_acc >= 0
    has_hist = hist_count[table.teacher_of] > 0
    w = jnp.asarray(o.weights, jnp.float32)
    gd_on = o.gd_mode == 'student'
    w_k = jnp.stack([jnp.full((k,), w[0]),
                     jnp.full((k,), w[1]),
                     jnp.where(has_best, w[2], 0.0),
                     jnp.where(has_hist & gd_on, w[3], 0.0)], axis=1)
    row = {'best': table.best_logp, 'T': jnp.full((k,), temp, jnp.float32), 'w': w_k}
    columns = {'y': self.y_pub}
    if self.n_teachers == 1:
      columns.update(s=teachers[0], m=hist[0])
    else:
      row.update(s=jnp.take(teachers, table.teacher_of, axis=0),
                 m=jnp.take(hist, table.teacher_of, axis=0))
    ran = r.fed.run(self.distillation, state.clients, self.ctx.root, t, 'distill',
                    data=base.public_rows(self.x_pub, k, **columns), row=row, active=active)
    state = state.replace(clients=ran.states)
    metrics['distill_loss'] = base.nanmean(ran.metrics)
    if o.gd_mode == 'literal' or o.weights[3] > 0:
      used = jnp.asarray(fresh) & (hist_count > 0)
      # Evaluated every round, round 1 (no history yet) included, so its ops compile
      # in round 1 rather than in round 2; the metric is reported once there is history
      # (left out while no teacher has any).
      vals = _literal_gd(teachers, hist, jnp.float32(temp))
      metrics['gd_literal'] = base.Later((jnp.sum(jnp.where(used, vals, 0.0)), jnp.sum(used)),
                                         _ratio)

    # Bookkeeping: the best past model and the running mean of aggregates, on the device:
    # every active client's predictions are taken (the kernel's slot count never varies and
    # nothing is read), and those that beat their best past model replace it.
    improved = jnp.zeros((k,), bool)
    if o.weights[2] > 0:
      acc = self.selection_accuracy(state, r)
      improved = act & (acc > table.best_acc)
      active_np = np.asarray(active, bool)
      metrics[f'{o.best_metric}_acc'] = base.Later(
          acc, lambda a: float(np.mean(a[active_np])) if n_act else float('nan'))
      new_logp = r.fed.predict(state.clients, self.x_pub, active,
                               chunk=self.spec.eval.chunk, log=True)
      table = table.replace(
          best_logp=jnp.where(improved[:, None, None], new_logp, table.best_logp),
          best_acc=jnp.where(improved, acc, table.best_acc))
    cnt = hist_count.astype(jnp.float32)[:, None, None]
    f = jnp.asarray(fresh)[:, None, None]
    ex = ex.replace(hist=jnp.where(f, (cnt * hist + teachers) / (cnt + 1.0), hist),
                    hist_count=hist_count + jnp.asarray(fresh, jnp.int32))
    metrics['best_updates'] = jnp.sum(improved).astype(jnp.int32)
    metrics.update(_teacher_metrics(stats, fresh))
    return state.replace(table=table, extra=ex), base.RoundOutput(metrics, payloads)

  # -------------------------------------------------------------- helpers
  def aggregate_uploads(self, up: jax.Array, active: np.ndarray, cluster: np.ndarray,
                        size: np.ndarray) -> tuple[jax.Array, np.ndarray]:
    """``[V, m, C]`` teachers (V = 1 unless per cluster) and which got fresh uploads (host).

    ``cluster`` and ``size`` are the round's clients' cluster ids and data sizes.
    """
    o = self.options
    act_f = np.asarray(active, np.float64)
    if o.aggregation == 'per_cluster':
      teachers = aggregate.cluster_means(up, jnp.asarray(cluster),
                                         jnp.asarray(act_f, jnp.float32), self.num_clusters)
      fresh = np.asarray([act_f[cluster == v].sum() > 0 for v in range(self.num_clusters)])
    else:
      if o.aggregation == 'eq3_global':
        a = label_cluster.cluster_weights(cluster, np.asarray(size, np.float64),
                                          np.asarray(active, bool))
      else:   # Eq. 1: the plain mean over participating clients
        a = act_f / max(act_f.sum(), 1.0)
      teachers = aggregate.mean_aggregate(up, jnp.asarray(a, jnp.float32))[None]
      fresh = np.asarray([act_f.sum() > 0])
    if o.renormalize == 'server':
      teachers = teachers / jnp.maximum(jnp.sum(teachers, -1, keepdims=True), 1e-30)
    return teachers, fresh

  def _downlink_payloads(self, nnz: jax.Array, active: np.ndarray,
                         cluster: np.ndarray) -> list[comm.Payload]:
    """Each receiver gets its teacher, dense or sparse, whichever is smaller.

    ``nnz`` ``[V]`` stays on the device: the choice is made there, and the dense form has an
    index payload of zero elements.
    """
    out = []
    dense = self.m * self.num_classes
    # sparse < dense bytes  <=>  nnz * (f + i) < dense * f  <=>  nnz < ceil(dense * f / (f + i))
    per_sparse = self.rules.float_bytes + self.rules.index_bytes
    limit = min(-(-dense * self.rules.float_bytes // per_sparse), np.iinfo(np.int32).max)
    for v in range(self.n_teachers):
      members = (cluster == v) if self.n_teachers > 1 else np.ones_like(active, bool)
      receivers = int(np.sum(members & np.asarray(active, bool)))
      if not receivers:
        continue
      sparse = nnz[v] < limit
      name = 'aggregate' if self.n_teachers == 1 else f'aggregate_cluster{v}'
      out += [comm.Payload(name, comm.DOWN, 'float', jnp.where(sparse, nnz[v], dense),
                           receivers, multicast=True),
              comm.Payload(name + '_indices', comm.DOWN, 'index', jnp.where(sparse, nnz[v], 0),
                           receivers, multicast=True)]
    return out

  def selection_accuracy(self, state, r) -> jax.Array:
    """``[S]`` accuracy that picks the best past model (-inf for inactive clients), on the
    device."""
    if self.options.best_metric == 'public':
      acc, _ = r.fed.evaluate_shared(state.clients, self.x_pub, self.y_pub, active=r.active,
                                     chunk=self.spec.eval.chunk, read=False)
    else:
      acc, _ = r.fed.evaluate(state.clients, split='val', active=r.active,
                              chunk=self.spec.eval.chunk, read=False)
    return jnp.where(jnp.isfinite(acc), acc, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class FedMDOptions:
  """``fedmd.*``."""
  group: ClassVar[str] = 'fedmd'
  temperature: float = options.option(1.0, 'the temperature of the uploaded softmax',
                                      ge=fields.MIN_TEMPERATURE)
  public_ce: float = options.option(0.0, 'weight of the CE on the public labels', ge=0)

  def validate(self, spec, algorithm) -> None:
    del algorithm
    if self.public_ce > 0 and spec.data.public_source:
      raise ConfigError('fedmd.public_ce', self.public_ce, "0 when data.public_source is set "
                        "(the public labels are not in the task's label space)")


class FedMD(ACEPFL):
  """FedMD-style mean aggregation on ACE-pFL's engine (see the module docstring).

  Clients upload full softmax outputs at ``fedmd.temperature`` on D0; the server
  averages them (Eq. 1); clients distil towards the mean with ``T^2 KL`` and,
  optionally, ``fedmd.public_ce`` times the CE on the public labels.
  """
  name = 'fedmd'
  options_class = FedMDOptions
  paper_rules = 'acepfl'

  @classmethod
  def param_fields(cls) -> dict[str, str]:
    return {**super().param_fields(), 't0': 'fedmd.temperature'}

  @classmethod
  def options_from_config(cls, config, spec) -> ACEOptions:
    """ACE-pFL's engine options that make FedMD: one cluster, the plain mean, full rows."""
    o = options.read(FedMDOptions, config, spec, cls)
    return ACEOptions(clusters=1, aggregation='mean', top_k=0, renormalize='none',
                      t0=o.temperature, curve='fixed', weights=(o.public_ce, 1.0, 0.0, 0.0),
                      best_metric='public')
