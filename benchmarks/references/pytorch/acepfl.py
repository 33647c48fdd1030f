"""ACE-pFL in PyTorch (K. He, H. Bai, Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation", IEEE/ACM Transactions on
Networking 2025, Algorithms 1-2, Eqs. 2-4), and the single-client baseline.

Every client keeps its own model (architectures may differ); clients exchange only soft
predictions on the shared, *labelled* public set D0. Once, before round 1 (Algorithm 2):
a reference client ``z`` is drawn, every client's label histogram is compared with ``z``'s
(the EMD, read as total variation: the printed program is degenerate), and the N distances
are split into ``|V|`` clusters by exact 1-D k-means. One round, in the paper's order:

  1. every client trains its model on its private data (cross-entropy, lr eta1);
  2. the temperature ``T_r`` of Eq. 2 (stages of ``r0`` rounds, sigmoid of ``(r mod r0)/r0``);
  3. every client predicts ``softmax(z / T_r)`` on all of D0 in inference mode
     (``model.eval()``), keeps each row's top-K and uploads them; the server completes each
     row (by default the missing mass is spread over the dropped classes);
  4. the server aggregates (Eq. 3): the mean inside each cluster, the clusters weighted by
     their data share, one teacher ``s^r`` for everybody;
  5. every client updates on D0 (lr eta2) with Eq. 4:
     ``0.4 CE(public labels) + T^2 [0.3 KL(s^r||q) + 0.2 KL(s^b||q) + 0.1 KL(M||q)]``, where
     ``q = softmax(z / T_r)``, ``s^b`` the soft predictions of the client's best past model
     (chosen on its validation rows) and ``M`` the running mean of past aggregates
     (``L_SD`` and ``L_GD`` start in round 2);
  6. the best past models (by validation accuracy) and ``M`` are updated.

The rows' ``test_acc`` is UA, the mean over clients of each client model's accuracy on its
personalised test split. Diagnostics: ``temperature``, ``clusters``, ``teacher_acc`` (the
aggregate's argmax is the public label), ``teacher_entropy``, ``val_acc``,
``best_updates``, ``gd_literal`` (Eq. 4's printed ``L_GD``, which has no gradient).

The fedjax_kd options this reference runs are those its config fields select (the
``acepfl`` group; ``spec.options``); an option it does not run raises ``ValueError`` naming
the field. The distillation loop is this module's own (``ctx.fit`` takes one target); it
draws a new ``torch.randperm`` of D0 every epoch from ``ctx.gen``. fedjax_kd's 'single': each
client trains alone on its private data every round.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import numpy as np

ALGORITHMS = ('acepfl', 'single')
CONFIG = 'configs/acepfl_mnist_cpu.py'
FIXED = ()
METRICS = ('temperature', 'clusters', 'teacher_acc', 'best_updates')
VARIANTS = {
    'acepfl': ('PyTorch ACE-pFL', 'acepfl', {}),
    'no_clustering': ('PyTorch w/o clustering', 'acepfl', {'acepfl.clustering': False}),
    'fixed_t': ('PyTorch fixed T = T0', 'acepfl', {'acepfl.dynamic_temperature': False}),
    'double': ('PyTorch double (no L_GD)', 'acepfl', {'acepfl.distillation': 'double'}),
    'single_kd': ('PyTorch single (L_CE + L_KD)', 'acepfl', {'acepfl.distillation': 'single'}),
    'single': ('PyTorch single client', 'single', {}),
}
DEFAULT_VARIANTS = tuple(VARIANTS)

# How a received top-K row becomes a teacher row (the ``acepfl.renormalize`` values).
_COMPLETION = {'fill': 'fill', 'client': 'rescale', 'server': 'none', 'none': 'none'}
_EPS = 1e-8   # smoothing of the teacher for the printed KL(student || teacher)


# ------------------------------------------------------------ Eq. 2: the temperature
def _sigmoid(u: float) -> float:
  return 1.0 / (1.0 + math.exp(-u)) if u >= 0 else math.exp(u) / (1.0 + math.exp(u))


def _f1(r: int, t0: float, k1: float, k2: float, r0: int, stage_div: str,
        normalize_delta: bool) -> float:
  stage = math.floor(r / (r0 if stage_div == 'r0' else t0))
  dr = r - r0 * math.floor(r / r0)
  x = dr / r0 if normalize_delta else dr
  return t0 + k1 * _sigmoid(k2) * stage + 2 * k1 * _sigmoid(k2 * x)


def temperature(r: int, t0: float = 30.0, k1: float = 5.0, k2: float = 5.0, r0: int = 100,
                curve: str = 'f1', stage_div: str = 'r0', normalize_delta: bool = True,
                rounds: int = 300) -> float:
  """``T_r`` of round ``r`` (1-based).

  ``'f1'``: Eq. 2, ``T0 + k1 sigma(k2) floor(r / r0) + 2 k1 sigma(k2 dr)`` with
  ``dr = (r mod r0) / r0`` (``normalize_delta``; the raw ``r mod r0`` saturates the sigmoid in
  a round) and the stage ``floor(r / r0)`` the text describes (``stage_div='T0'``: the
  printed ``floor(r / T0)``). ``'f4'``: Fig. 5's accelerating curve,
  ``T0 + (1 + e^k1) / k2 * stage + (1 + e^{k1 dr}) / k2``. ``'f2'``/``'f3'``/``'f5'`` (the
  paper gives no formula): concave / convex / linear from ``f1(1)`` to ``f1(rounds)``.
  ``'fixed'``: ``T0`` (Table XII's "Fix.").
  """
  if curve == 'fixed':
    return float(t0)
  args = (t0, k1, k2, r0, stage_div, normalize_delta)
  if curve == 'f1':
    return _f1(r, *args)
  if curve == 'f4':
    stage = math.floor(r / (r0 if stage_div == 'r0' else t0))
    dr = r - r0 * math.floor(r / r0)
    x = dr / r0 if normalize_delta else dr
    return t0 + (1 + math.exp(k1)) / k2 * stage + (1 + math.exp(k1 * x)) / k2
  t_s, t_e = _f1(1, *args), _f1(rounds, *args)
  u = (r - 1) / (rounds - 1) if rounds > 1 else 0.0
  if curve == 'f5' or k2 == 0:
    ratio = u
  elif curve == 'f2':
    ratio = (2 * _sigmoid(k2 * u) - 1) / (2 * _sigmoid(k2) - 1)
  elif curve == 'f3':
    ratio = math.expm1(k2 * u) / math.expm1(k2)
  else:
    raise ValueError(f'acepfl.curve: {curve!r}')
  return t_s + (t_e - t_s) * ratio


# ------------------------------------------------------------ Algorithm 2: clustering
def label_distance(p: np.ndarray, q: np.ndarray, metric: str = 'tv') -> float:
  """The EMD between two normalised label histograms, as ``acepfl.distance`` reads it.

  ``'tv'``: ``1/2 sum |p - q|`` (EMD with ground distance 1 between distinct classes);
  ``'l1'``: ``sum |p - q|``; ``'emd1d'``: ``sum |CDF_p - CDF_q|`` (ground distance
  ``|i - j|``); ``'sorted_literal'``: the printed program as an assignment,
  ``mean |sort(p) - sort(q)|``.
  """
  p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
  if metric == 'tv':
    return float(0.5 * np.abs(p - q).sum())
  if metric == 'l1':
    return float(np.abs(p - q).sum())
  if metric == 'emd1d':
    return float(np.abs(np.cumsum(p) - np.cumsum(q)).sum())
  if metric == 'sorted_literal':
    return float(np.abs(np.sort(p) - np.sort(q)).mean())
  raise ValueError(f'acepfl.distance: {metric!r}')


def kmeans_1d(values: Sequence[float], k: int) -> np.ndarray:
  """Exact k-means of scalars (least within-cluster squares), cluster ids by centroid.

  Optimal 1-D clusters are runs of the sorted values that never split equal values, so a
  dynamic programme over the distinct sorted values finds the optimum; with fewer distinct
  values than ``k`` each distinct value is a cluster. Ties between equally good splits go to
  the earliest start of the later cluster.
  """
  x = np.asarray(values, np.float64)
  uniq, inv = np.unique(x, return_inverse=True)
  w = np.bincount(inv.reshape(-1), minlength=len(uniq)).astype(np.float64)
  m, k = len(uniq), min(int(k), len(uniq))

  def sse(i, j):   # distinct values [i, j), weighted by multiplicity
    ww, vv = w[i:j], uniq[i:j]
    mu = (ww * vv).sum() / ww.sum()
    return float((ww * (vv - mu) ** 2).sum())

  best = [[math.inf] * (m + 1) for _ in range(k + 1)]
  back = [[0] * (m + 1) for _ in range(k + 1)]
  best[0][0] = 0.0
  for g in range(1, k + 1):
    for j in range(g, m + 1):
      for i in range(g - 1, j):
        c = best[g - 1][i] + sse(i, j)
        if c < best[g][j] - 1e-12:
          best[g][j], back[g][j] = c, i
  seg, j = np.zeros(m, np.int64), m
  for g in range(k, 0, -1):
    i = back[g][j]
    seg[i:j] = g - 1
    j = i
  return seg[inv.reshape(-1)]


def eq3_weights(labels: Sequence[int], sizes: Sequence[float]) -> np.ndarray:
  """Eq. 3 per client: ``a_n = (D_v / D) / |v|``, ``D_v`` the data of ``n``'s cluster ``v``.

  The mean inside a cluster, clusters weighted by their share of the data (the printed
  ``sum_{n in v} D_v / D`` would count ``D_v`` ``|v|`` times; this reading sums to 1).
  """
  labels, sizes = np.asarray(labels), np.asarray(sizes, np.float64)
  a = np.zeros(len(labels))
  for v in np.unique(labels):
    members = labels == v
    a[members] = sizes[members].sum() / sizes.sum() / members.sum()
  return a


# ------------------------------------------------------------ top-K and Eq. 4
def top_k_rows(probs, k: int, completion: str = 'fill'):
  """Keeps each row's ``k`` largest probabilities and completes the row as the receiver does.

  ``'fill'``: the missing mass ``1 - sum(kept)`` is shared equally by the dropped classes;
  ``'rescale'``: the kept entries are rescaled to sum to 1, zeros elsewhere; ``'none'``: the
  kept entries as they are, zeros elsewhere.
  """
  import torch  # pylint: disable=g-import-not-at-top
  c = probs.shape[-1]
  idx = torch.topk(probs, k, dim=-1).indices
  kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, idx, True)
  vals = torch.where(kept, probs, torch.zeros_like(probs))
  mass = vals.sum(-1, keepdim=True)
  if completion == 'none' or k == c:
    return vals
  if completion == 'rescale':
    return vals / mass.clamp_min(1e-30)
  rest = (1.0 - mass).clamp_min(0.0) / (c - k)
  return torch.where(kept, vals, rest.expand_as(vals))


def kl_div(log_q, teacher, direction: str = 'teacher_student'):
  """Per-sample ``KL(teacher || q)`` (standard KD; zero teacher entries count 0) or, with
  ``'student_teacher'``, the printed ``KL(q || teacher)`` against a teacher smoothed to
  ``(t + 1e-8) / (1 + C 1e-8)``."""
  import torch  # pylint: disable=g-import-not-at-top
  if direction == 'teacher_student':
    return (torch.xlogy(teacher, teacher) - teacher * log_q).sum(-1)
  t = (teacher + _EPS) / (1.0 + _EPS * teacher.shape[-1])
  return (log_q.exp() * (log_q - t.log())).sum(-1)


def ace_loss(logits, labels, teacher, best_logits, history, temp: float,
             weights: Sequence[float], direction: str = 'teacher_student'):
  """Eq. 4 per sample: ``a1 CE(logits, labels) + T^2 (a2 KL(s^r||q) + a3 KL(s^b||q) +
  a4 KL(M||q))``, ``q = softmax(logits / T)``, ``s^b = softmax(best_logits / T)``.

  A zero weight leaves its term out (``best_logits`` / ``history`` may then be None).
  """
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  a1, a2, a3, a4 = weights
  log_q = F.log_softmax(logits / temp, -1)
  kl = 0.0
  if a2:
    kl = kl + a2 * kl_div(log_q, teacher, direction)
  if a3:
    kl = kl + a3 * kl_div(log_q, F.softmax(best_logits / temp, -1), direction)
  if a4:
    kl = kl + a4 * kl_div(log_q, history, direction)
  out = temp * temp * kl
  if a1:
    out = out + a1 * F.cross_entropy(logits, labels, reduction='none')
  return out


# ------------------------------------------------------------ what the reference runs
def _check(spec) -> None:
  """Raises ValueError naming the first config field whose value this reference does not run."""
  for group, o in (('train', spec.train), ('distill', spec.distill.optimizer)):
    if o is None:
      continue
    for field, ok in (('optimizer', o.optimizer == 'sgd'), ('momentum', o.momentum == 0),
                      ('weight_decay', o.weight_decay == 0), ('lr_decay', o.lr_decay == 1),
                      ('compute_dtype', o.compute_dtype == 'float32')):
      if not ok:
        raise ValueError(f'{group}.{field}: the reference runs plain SGD in float32 '
                         f'(got {getattr(o, field)!r})')
  if spec.partial:
    raise ValueError('clients.participation: the reference runs every client every round')
  if spec.selection.stragglers:
    raise ValueError('selection.stragglers: the reference runs no stragglers')
  if spec.clients.shared_init:
    raise ValueError('clients.shared_init: the reference gives each client its own init')
  if spec.data.augment != 'none':
    raise ValueError(f'data.augment: the reference runs no augmentation, got '
                     f'{spec.data.augment!r}')
  if spec.data.per_client_test is False:
    raise ValueError('data.per_client_test: UA needs the per-client test splits')
  if spec.algorithm != 'acepfl':
    return
  o = spec.options
  for field, ok in (('cluster_method', o.cluster_method == 'vector'),
                    ('hist_epsilon', o.hist_epsilon == 0), ('noise', o.noise == 'none')):
    if not ok:
      raise ValueError(f'acepfl.{field}: not in the reference (got {getattr(o, field)!r})')


def _steps(ctx, n: int, rule, t: int, who: int, phase: str) -> list:
  """Minibatches of ``range(n)``: a new ``torch.randperm`` every epoch, the last one partial
  (``reference.batches='fedjax'``: fedjax_kd's order)."""
  torch = ctx.torch
  epochs, batch_size, _ = rule
  if ctx.options.batches == 'fedjax':
    pos = ctx.lockstep.order(t, who, phase, n, n, epochs, batch_size)
    return [torch.from_numpy(p[p < n].astype(np.int64)) for p in pos]
  out = []
  for _ in range(epochs):
    perm = torch.randperm(n, generator=ctx.gen)
    out += [perm[i:i + batch_size] for i in range(0, n, batch_size)]
  return [j for j in out if len(j)]


def _logits(ctx, model, x, chunk: int = 1000):
  """Raw logits in inference mode (``model.eval()``)."""
  torch = ctx.torch
  model.eval()
  with torch.no_grad():
    return torch.cat([model(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)])


def _accuracy(ctx, model, x, y) -> float:
  return float((_logits(ctx, model, x).argmax(1) == y).float().mean())


def _distill(ctx, model, x0, y0, teacher, best_logits, history, temp, weights, direction,
             rule, t: int, who: int) -> float:
  """Eq. 4's update on D0: SGD at eta2, a new permutation of D0 every epoch."""
  torch = ctx.torch
  model.train()
  opt = torch.optim.SGD(model.parameters(), lr=rule[2])
  losses = []
  for j in _steps(ctx, x0.shape[0], rule, t, who, 'distill'):
    loss = ace_loss(model(x0[j]), y0[j], teacher[j],
                    None if best_logits is None else best_logits[j],
                    None if history is None else history[j], temp, weights, direction).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
  return float(np.mean(losses)) if losses else float('nan')


def _entropy(p) -> float:
  return float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())


def rounds(ctx) -> Iterator[dict[str, Any]]:
  """Yields one metrics row per round."""
  torch = ctx.torch
  s, spec = ctx.setting, ctx.setting.spec
  _check(spec)
  n_clients, c = ctx.num_clients, s.num_classes
  models = [ctx.model(k) for k in range(n_clients)]
  if spec.algorithm == 'single':
    for t in range(1, spec.rounds + 1):
      loss = np.mean([ctx.fit(m, x, y, s.train, soft=False, t=t, who=k, phase='train')
                      for k, (m, (x, y)) in enumerate(zip(models, ctx.data))])
      yield {'round': t, 'test_acc': ctx.mean_client_acc(models), 'train_loss': float(loss)}
    return

  o = spec.options
  # Algorithm 2, once: distances of the label histograms to a random client z, 1-D k-means.
  counts = np.stack([np.bincount(y.numpy(), minlength=c) for _, y in ctx.data]).astype(float)
  hists = counts / counts.sum(1, keepdims=True)
  z = (o.reference if o.reference >= 0
       else int(torch.randint(n_clients, (1,), generator=ctx.gen)))
  dist = np.array([label_distance(h, hists[z], o.distance) for h in hists])
  cluster = kmeans_1d(dist, o.clusters)
  n_clusters = int(cluster.max()) + 1
  sizes = counts.sum(1)
  if o.aggregation == 'per_cluster':
    teacher_of, n_teachers = cluster, n_clusters
    members = [np.flatnonzero(cluster == v) for v in range(n_clusters)]
    weights_of = [np.full(len(ix), 1.0 / len(ix)) for ix in members]
  else:
    teacher_of, n_teachers = np.zeros(n_clients, np.int64), 1
    a = (eq3_weights(cluster, sizes) if o.aggregation == 'eq3_global'
         else np.full(n_clients, 1.0 / n_clients))
    members, weights_of = [np.arange(n_clients)], [a]
  k_top = o.top_k if 0 < o.top_k < c else c
  completion = _COMPLETION[o.renormalize]
  x0, y0 = ctx.x_pub, ctx.y_pub   # all of D0, the same every round and in the same order
  rule = s.distill
  val_rows = None
  if o.best_metric == 'val' and o.weights[2] > 0:
    d = s.experiment.ctx.data   # each client's validation rows (held out of its partition)
    vi, vn = np.asarray(d.val_idx), np.asarray(d.val_n)
    val_rows = [torch.from_numpy(vi[k, :int(vn[k])].astype(np.int64))
                for k in range(n_clients)]
  best_acc = [-1.0] * n_clients
  best_logits: list = [None] * n_clients
  history: list = [None] * n_teachers   # running mean of each teacher's past aggregates
  hist_count = [0] * n_teachers

  for t in range(1, spec.rounds + 1):
    temp = temperature(t, o.t0, o.k1, o.k2, o.r0, o.curve, o.stage_div, o.normalize_delta,
                       spec.rounds)
    row: dict[str, Any] = {'round': t, 'temperature': temp, 'clusters': n_clusters}
    if t == 1:
      row['reference_client'] = z
      row.update({f'cluster{v}_size': int((cluster == v).sum()) for v in range(n_clusters)})
    # 1. private training (CE, eta1)
    row['train_loss'] = float(np.mean([
        ctx.fit(m, x, y, s.train, soft=False, t=t, who=k, phase='train')
        for k, (m, (x, y)) in enumerate(zip(models, ctx.data))]))
    # 2-3. tempered, top-K filtered soft predictions on D0 (inference mode)
    uploads = torch.stack([top_k_rows(torch.softmax(_logits(ctx, m, x0) / temp, 1), k_top,
                                      completion) for m in models])      # [K, m, C]
    # 4. the server's aggregate(s)
    teachers = torch.stack([
        torch.einsum('k,kmc->mc', torch.tensor(w, dtype=uploads.dtype), uploads[ix])
        for ix, w in zip(members, weights_of)])                           # [V, m, C]
    if o.renormalize == 'server':
      teachers = teachers / teachers.sum(-1, keepdim=True).clamp_min(1e-30)
    row['teacher_acc'] = float(np.mean([(tt.argmax(1) == y0).float().mean() for tt in teachers]))
    row['teacher_entropy'] = float(np.mean([_entropy(tt) for tt in teachers]))
    if (o.gd_mode == 'literal' or o.weights[3] > 0) and hist_count[0] > 0:
      row['gd_literal'] = float(np.mean([
          temp ** 2 * float(kl_div(history[v].clamp_min(1e-30).log(), teachers[v]).mean())
          for v in range(n_teachers)]))
    # 5. Eq. 4 on D0 (eta2)
    losses = []
    for k, m in enumerate(models):
      v = int(teacher_of[k])
      w = list(o.weights)
      if best_logits[k] is None:
        w[2] = 0.0
      if o.gd_mode != 'student' or hist_count[v] == 0:
        w[3] = 0.0
      losses.append(_distill(ctx, m, x0, y0, teachers[v], best_logits[k], history[v], temp,
                             w, o.kl_direction, rule, t, k))
    row['distill_loss'] = float(np.mean(losses))
    # 6. the best past models and the running mean of the aggregates
    improved = 0
    if o.weights[2] > 0:
      accs = []
      for k, m in enumerate(models):
        if val_rows is not None:
          acc = _accuracy(ctx, m, ctx.xp[val_rows[k]], ctx.yp[val_rows[k]])
        else:
          acc = _accuracy(ctx, m, x0, y0)
        accs.append(acc)
        if acc > best_acc[k]:
          best_acc[k], best_logits[k] = acc, _logits(ctx, m, x0)
          improved += 1
      row[f'{o.best_metric}_acc'] = float(np.mean(accs))
    row['best_updates'] = improved
    for v in range(n_teachers):
      history[v] = (teachers[v] if history[v] is None
                    else (hist_count[v] * history[v] + teachers[v]) / (hist_count[v] + 1))
      hist_count[v] += 1
    if not all(bool(torch.isfinite(p).all()) for m in models for p in m.parameters()):
      row['nonfinite'] = f'a client model holds NaN or Inf after round {t}'
      yield row
      return
    row['test_acc'] = ctx.mean_client_acc(models)
    yield row
