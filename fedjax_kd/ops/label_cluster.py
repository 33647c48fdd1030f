"""ACE-pFL's EMD-based client clustering (Algorithm 2) and Eq. (3) weights.

K. He, H. Bai, Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation", IEEE/ACM
Transactions on Networking 2025. Host-side numpy (float64); it runs once before
training.

Label distances (:data:`METRICS`). The printed EMD program is degenerate: a zero
flow is feasible and optimal, and its normalisation is then 0/0, so we offer
readings of it. All assume normalised histograms (rows of
:func:`label_histograms`):

  * ``'tv'`` (default): ``1/2 ||p - q||_1``, Rubner's EMD with the 0/1
    ground distance between distinct classes; in ``[0, 1]``.
  * ``'l1'``: ``||p - q||_1`` (twice ``'tv'``; same 1-D clustering).
  * ``'emd1d'``: the exact 1-D EMD (Wasserstein-1) with ground distance
    ``|i - j|`` between class indices, ``sum_c |CDF_p(c) - CDF_q(c)|``. Only
    meaningful when the class order means something.
  * ``'sorted_literal'``: the printed program read as an assignment with
    cost ``|p_m - q_n|``, i.e. ``mean_k |sort(p)_k - sort(q)_k|``. It ignores
    class identity (``[.5, .5, 0, 0]`` vs ``[0, 0, .5, .5]`` gives 0); for
    fidelity experiments only.

Clustering (:func:`cluster_clients`):

  * ``method='vector'`` (the paper's): distances of every client to a reference
    client ``z`` (``e_z = 0``), clustered by exact 1-D k-means
    (:func:`kmeans_1d`, dynamic programming: exact and deterministic, where the
    paper gives no initialisation or restarts). Cluster ids are ordered by
    centroid, so the reference client's cluster is 0.
  * ``method='matrix'`` (the Table V comparator, which the paper does not
    specify): k-means (Lloyd's with
    k-means++, best of ``n_init``; :func:`kmeans_rows`) on the rows of the
    ``K x K`` distance matrix. Cluster ids follow first appearance.

If there are fewer distinct values (rows) than requested clusters, the
effective number of clusters is the number of distinct values.

``ClusterResult.intra_distance`` is the Fig. 3 diagnostic: for each cluster the
mean pairwise distance (same metric) over client pairs inside it, 0 for
singletons. It is computed from the full distance matrix for both methods.

Eq. (3) weights (:func:`cluster_weights`): ``a_n = (D_v / D) / |v|`` with
``D_v = sum_{n in v} D_n``, so ``s^r = sum_n a_n s_n^r`` and ``sum_n a_n = 1``
(as printed, the weight multiplies ``D_v`` by ``|v|`` and would not sum to 1).
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from fedjax_kd.ops.errors import ParamError

METRICS = ('tv', 'l1', 'emd1d', 'sorted_literal')
METHODS = ('vector', 'matrix')


def label_histograms(counts) -> np.ndarray:
  """Normalises per-client class counts ``[K, C]`` to label histograms.

  Raises:
    ValueError: counts are not a finite non-negative ``[K, C]`` array, or a
      client has no samples (it cannot be clustered).
  """
  counts = np.asarray(counts, dtype=np.float64)
  if counts.ndim != 2 or counts.shape[1] < 1:
    raise ValueError(f'counts must be [K, C], got shape {counts.shape}')
  if not np.all(np.isfinite(counts)) or np.any(counts < 0):
    raise ValueError('counts must be finite and non-negative')
  totals = counts.sum(axis=1)
  empty = np.flatnonzero(totals <= 0)
  if empty.size:
    raise ValueError(f'client {int(empty[0])} has no samples (all label counts '
                     'are 0); it cannot be clustered')
  return counts / totals[:, None]


def _check_metric(metric: str) -> None:
  if metric not in METRICS:
    raise ParamError('metric', metric, METRICS)


def _features(h: np.ndarray, metric: str) -> tuple[np.ndarray, float]:
  """Rows ``f`` and a scale ``s`` with ``d(p, q) = s * sum |f(p) - f(q)|``."""
  c = h.shape[-1]
  if metric == 'tv':
    return h, 0.5
  if metric == 'l1':
    return h, 1.0
  if metric == 'emd1d':
    return np.cumsum(h, axis=-1), 1.0
  return np.sort(h, axis=-1), 1.0 / c  # 'sorted_literal'


def label_distance(p, q, metric: str = 'tv') -> float:
  """The distance between two label histograms ``[C]`` (see :data:`METRICS`)."""
  _check_metric(metric)
  p = np.asarray(p, dtype=np.float64)
  q = np.asarray(q, dtype=np.float64)
  if p.ndim != 1 or p.shape != q.shape:
    raise ValueError(f'p and q must be [C] of equal length, got {p.shape} '
                     f'and {q.shape}')
  fp, s = _features(p, metric)
  fq, _ = _features(q, metric)
  return float(s * np.sum(np.abs(fp - fq)))


def distances_to(hists, ref, metric: str = 'tv') -> np.ndarray:
  """Distances ``[K]`` from each histogram row of ``hists [K, C]`` to ``ref [C]``."""
  _check_metric(metric)
  hists = np.asarray(hists, dtype=np.float64)
  ref = np.asarray(ref, dtype=np.float64)
  if hists.ndim != 2 or ref.shape != hists.shape[1:]:
    raise ValueError(f'hists must be [K, C] and ref [C], got {hists.shape} '
                     f'and {ref.shape}')
  fh, s = _features(hists, metric)
  fr, _ = _features(ref, metric)
  return s * np.sum(np.abs(fh - fr[None, :]), axis=-1)


def distance_matrix(hists, metric: str = 'tv') -> np.ndarray:
  """The symmetric ``[K, K]`` matrix of pairwise distances (zero diagonal)."""
  _check_metric(metric)
  hists = np.asarray(hists, dtype=np.float64)
  if hists.ndim != 2:
    raise ValueError(f'hists must be [K, C], got {hists.shape}')
  f, s = _features(hists, metric)
  return s * np.sum(np.abs(f[:, None, :] - f[None, :, :]), axis=-1)


def kmeans_1d(values, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Exact 1-D k-means (minimum within-cluster sum of squares).

  Dynamic programming over the sorted *distinct* values, weighted by their
  multiplicities (optimal 1-D clusters are contiguous in sorted order and
  never split equal values), in ``O(k M^2)`` for ``M`` distinct values.
  Segment costs use prefix sums of the mean-centred values.

  Ties: among split points whose total cost is within ``1e-12 * (1 + total
  sum of squares)`` of the minimum, the smallest is taken (the later cluster
  starts as early as possible), so the result is deterministic and does not
  depend on floating-point noise between equally good partitions.

  Args:
    values: ``[N]`` finite numbers, ``N >= 1``.
    k: the requested number of clusters, ``>= 1``.

  Returns:
    ``(labels, centroids)``: ``labels [N]`` int64 in ``[0, k_eff)``, ordered so
    that cluster centroids ascend; ``centroids [k_eff]`` float64, where
    ``k_eff = min(k, number of distinct values)``.
  """
  x = np.asarray(values, dtype=np.float64)
  if x.ndim != 1 or x.size < 1:
    raise ValueError(f'values must be a non-empty 1-D array, got {x.shape}')
  if not np.all(np.isfinite(x)):
    raise ValueError('values must be finite')
  if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
    raise ValueError(f'k={k!r} must be an integer >= 1')
  uniq, inverse, mult = np.unique(x, return_inverse=True, return_counts=True)
  m = uniq.size
  k_eff = min(int(k), m)
  w = mult.astype(np.float64)
  y = uniq - np.sum(w * uniq) / np.sum(w)  # centred, for accurate costs
  cw = np.concatenate([[0.0], np.cumsum(w)])
  c1 = np.concatenate([[0.0], np.cumsum(w * y)])
  c2 = np.concatenate([[0.0], np.cumsum(w * y * y)])
  tol = 1e-12 * (1.0 + c2[-1])

  def cost(i, j):
    """Within-segment SSE of distinct values ``[i, j)`` (arrays broadcast)."""
    n = cw[j] - cw[i]
    s = c1[j] - c1[i]
    return np.maximum(c2[j] - c2[i] - s * s / n, 0.0)

  # best[j] = min cost of splitting the first j distinct values into `g`
  # clusters; back[g][j] = start of the last cluster.
  js = np.arange(m + 1)
  best = np.full(m + 1, np.inf)
  best[1:] = cost(0, js[1:])
  back = [np.zeros(m + 1, dtype=np.int64)]
  for g in range(2, k_eff + 1):
    new = np.full(m + 1, np.inf)
    arg = np.zeros(m + 1, dtype=np.int64)
    for j in range(g, m + 1):
      starts = np.arange(g - 1, j)  # the last cluster is [i, j)
      cand = best[starts] + cost(starts, j)
      first = int(np.flatnonzero(cand <= cand.min() + tol)[0])
      new[j] = cand[first]
      arg[j] = starts[first]
    best = new
    back.append(arg)
  bounds = [m]
  for g in range(k_eff, 1, -1):
    bounds.append(int(back[g - 1][bounds[-1]]))
  bounds.append(0)
  bounds = bounds[::-1]  # [0, b_1, ..., m]
  seg = np.zeros(m, dtype=np.int64)
  centroids = np.empty(k_eff)
  for g in range(k_eff):
    lo, hi = bounds[g], bounds[g + 1]
    seg[lo:hi] = g
    centroids[g] = np.sum(w[lo:hi] * uniq[lo:hi]) / np.sum(w[lo:hi])
  return seg[inverse.reshape(-1)], centroids


def _sq_dists(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
  diff = points[:, None, :] - centroids[None, :, :]
  return np.sum(diff * diff, axis=-1)


def _kmeans_pp(rng: np.random.Generator, points: np.ndarray,
               k: int) -> np.ndarray:
  """k-means++ seeding (distinct points as long as ``k <= #distinct rows``)."""
  n = points.shape[0]
  idx = [int(rng.integers(n))]
  d2 = _sq_dists(points, points[idx])[:, 0]
  for _ in range(1, k):
    total = d2.sum()
    if total > 0:
      i = int(rng.choice(n, p=d2 / total))
    else:
      i = int(rng.integers(n))
    idx.append(i)
    d2 = np.minimum(d2, _sq_dists(points, points[i:i + 1])[:, 0])
  return points[idx].copy()


def _lloyd(points: np.ndarray, centroids: np.ndarray,
           max_iter: int) -> tuple[np.ndarray, float]:
  """Lloyd iterations; empty clusters take the point farthest from its centroid."""
  n, k = points.shape[0], centroids.shape[0]
  labels = None
  for _ in range(max_iter):
    d = _sq_dists(points, centroids)
    new = np.argmin(d, axis=1)
    own = d[np.arange(n), new]
    counts = np.bincount(new, minlength=k)
    for c in np.flatnonzero(counts == 0):
      movable = counts[new] > 1
      i = int(np.argmax(np.where(movable, own, -1.0)))
      counts[new[i]] -= 1
      new[i] = c
      counts[c] = 1
      own[i] = 0.0
    centroids = np.stack([points[new == c].mean(axis=0) for c in range(k)])
    if labels is not None and np.array_equal(new, labels):
      labels = new
      break
    labels = new
  inertia = float(np.sum((points - centroids[labels]) ** 2))
  return labels, inertia


def _first_appearance(labels: np.ndarray) -> np.ndarray:
  """Relabels so that cluster ids follow the order of first appearance."""
  _, first = np.unique(labels, return_index=True)
  order = np.argsort(first, kind='stable')
  remap = np.empty(order.size, dtype=np.int64)
  remap[np.unique(labels)[order]] = np.arange(order.size)
  return remap[labels]


def kmeans_rows(points, k: int, seed: int, n_init: int = 10,
                max_iter: int = 100) -> np.ndarray:
  """K-means on the rows of ``points [N, D]`` (Lloyd's with k-means++).

  Deterministic given ``seed`` (one ``np.random.default_rng(seed)`` drives all
  ``n_init`` seedings); the run with the lowest inertia wins (the first on
  ties). The effective number of clusters is ``min(k, #distinct rows)``; every
  effective cluster is non-empty. Cluster ids are canonical: client 0's cluster
  is 0, the next new cluster met in row order is 1, and so on.

  Returns:
    ``labels [N]`` int64.
  """
  points = np.asarray(points, dtype=np.float64)
  if points.ndim != 2 or points.shape[0] < 1:
    raise ValueError(f'points must be a non-empty [N, D] array, got '
                     f'{points.shape}')
  if not np.all(np.isfinite(points)):
    raise ValueError('points must be finite')
  if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
    raise ValueError(f'k={k!r} must be an integer >= 1')
  if n_init < 1 or max_iter < 1:
    raise ValueError('n_init and max_iter must be >= 1')
  k_eff = min(int(k), np.unique(points, axis=0).shape[0])
  if k_eff == 1:
    return np.zeros(points.shape[0], dtype=np.int64)
  rng = np.random.default_rng(seed)
  best_labels, best_inertia = None, np.inf
  for _ in range(n_init):
    init = _kmeans_pp(rng, points, k_eff)
    labels, inertia = _lloyd(points, init, max_iter)
    if inertia < best_inertia:
      best_labels, best_inertia = labels, inertia
  return _first_appearance(best_labels)


@dataclasses.dataclass(frozen=True)
class ClusterResult:
  """The outcome of :func:`cluster_clients`.

  Attributes:
    labels: ``[K]`` int64 cluster id of every client, in ``[0, num_clusters)``.
    num_clusters: the effective number of clusters.
    reference: the reference client ``z`` (vector method) or ``-1`` (matrix).
    distances: ``[K]`` distances to the reference (vector) or the ``[K, K]``
      distance matrix (matrix).
    intra_distance: ``[num_clusters]`` mean pairwise distance inside each
      cluster (0 for singletons), the Fig. 3 diagnostic.
  """
  labels: np.ndarray
  num_clusters: int
  reference: int
  distances: np.ndarray
  intra_distance: np.ndarray


def intra_cluster_distance(dist: np.ndarray, labels,
                           num_clusters: int) -> np.ndarray:
  """Mean pairwise distance over client pairs inside each cluster ``[num_clusters]``."""
  labels = np.asarray(labels)
  out = np.zeros(num_clusters)
  for v in range(num_clusters):
    idx = np.flatnonzero(labels == v)
    if idx.size > 1:
      sub = dist[np.ix_(idx, idx)]
      out[v] = sub[np.triu_indices(idx.size, 1)].mean()
  return out


def cluster_clients(counts, num_clusters: int, *, method: str = 'vector',
                    metric: str = 'tv', reference: int | None = None,
                    hist=None, seed: int = 0) -> ClusterResult:
  """Algorithm 2: clusters clients by the distance between label histograms.

  Args:
    counts: ``[K, C]`` per-client class counts.
    num_clusters: the requested ``|V|``, an integer in ``[1, K]``.
    method: ``'vector'`` (distances to ``reference``, exact 1-D k-means) or
      ``'matrix'`` (k-means on the rows of the pairwise distance matrix).
    metric: one of :data:`METRICS`.
    reference: the reference client ``z`` in ``[0, K)``; required for the
      vector method, ignored by the matrix method.
    hist: optional ``[K, C]`` histograms used instead of
      ``label_histograms(counts)`` (e.g. noisy ones); used as given.
    seed: seeds the matrix method's k-means.

  Raises:
    ParamError: bad ``num_clusters``, ``method``, ``metric`` or ``reference``.
  """
  _check_metric(metric)
  if method not in METHODS:
    raise ParamError('method', method, METHODS)
  counts = np.asarray(counts, dtype=np.float64)
  if counts.ndim != 2:
    raise ValueError(f'counts must be [K, C], got shape {counts.shape}')
  num_clients = counts.shape[0]
  if (not isinstance(num_clusters, numbers.Integral)
      or isinstance(num_clusters, bool)
      or not 1 <= num_clusters <= num_clients):
    raise ParamError('num_clusters', num_clusters,
                     f'an integer in [1, {num_clients}] (the number of clients)')
  if hist is None:
    hists = label_histograms(counts)
  else:
    hists = np.asarray(hist, dtype=np.float64)
    if hists.shape != counts.shape:
      raise ValueError(f'hist must have the shape of counts {counts.shape}, '
                       f'got {hists.shape}')
    if not np.all(np.isfinite(hists)):
      raise ValueError('hist must be finite')
  full = distance_matrix(hists, metric)
  if method == 'vector':
    if (not isinstance(reference, numbers.Integral)
        or isinstance(reference, bool)
        or not 0 <= reference < num_clients):
      raise ParamError('reference', reference,
                        f'an integer in [0, {num_clients - 1}] (a client)')
    distances = distances_to(hists, hists[reference], metric)
    labels, centroids = kmeans_1d(distances, int(num_clusters))
    k_eff, ref = int(centroids.size), int(reference)
  else:
    distances = full
    labels = kmeans_rows(full, int(num_clusters), seed)
    k_eff, ref = int(labels.max()) + 1, -1
  return ClusterResult(
      labels=labels.astype(np.int64), num_clusters=k_eff, reference=ref,
      distances=distances,
      intra_distance=intra_cluster_distance(full, labels, k_eff))


def cluster_weights(labels, sizes, active=None) -> np.ndarray:
  """Eq. (3) per-client aggregation weights ``a [K]`` (float64, sum 1).

  ``a_n = (D_v / D) / |v|`` for the cluster ``v`` of client ``n``, where ``D``,
  ``D_v = sum_{m in v} D_m`` and ``|v|`` count **active** clients only:
  inactive clients get 0, clusters without an active client drop out and the
  remaining cluster weights renormalise to 1. With equal sizes this is the
  plain mean ``1 / #active`` whatever the labels: under a balanced split Eq. 3's
  one global teacher makes the clustering a no-op.

  Args:
    labels: ``[K]`` int cluster ids.
    sizes: ``[K]`` non-negative sample counts ``D_n``.
    active: optional ``[K]`` bool mask of participating clients (all if None).

  Raises:
    ValueError: shapes differ, sizes are negative, or the active clients hold
      no data.
  """
  labels = np.asarray(labels)
  sizes = np.asarray(sizes, dtype=np.float64)
  if labels.ndim != 1 or sizes.shape != labels.shape:
    raise ValueError(f'labels and sizes must be [K], got {labels.shape} and '
                     f'{sizes.shape}')
  if not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
    raise ValueError('sizes must be finite and non-negative')
  if active is None:
    act = np.ones(labels.shape, dtype=bool)
  else:
    act = np.asarray(active, dtype=bool)
    if act.shape != labels.shape:
      raise ValueError(f'active must be [K], got {act.shape}')
  eff = np.where(act, sizes, 0.0)
  total = eff.sum()
  if total <= 0:
    raise ValueError('the active clients hold no data; Eq. (3) is undefined')
  _, inv = np.unique(labels, return_inverse=True)
  inv = inv.reshape(-1)
  d_v = np.bincount(inv, weights=eff)
  n_v = np.bincount(inv, weights=act.astype(np.float64))
  a = d_v[inv] / total / np.maximum(n_v[inv], 1.0)
  return np.where(act, a, 0.0)
