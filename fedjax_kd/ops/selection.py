"""Client selection: FedEntOpt (entropy-greedy with a FIFO buffer), uniform and
Power-of-Choice sampling, plus cohort label statistics.

FedEntOpt: A. Lutz, G. Steidl, K. Mueller, W. Samek, "Boosting Federated
Learning with FedEntOpt: Mitigating Label Skew by Entropy-Based Client
Selection", arXiv 2411.01240v2. Power-of-Choice: Y. J. Cho, J. Wang, G. Joshi,
"Client Selection in Federated Learning: Convergence Analysis and
Power-of-Choice Selection Strategies", 2020.
KL: M. Seol, T. Kim, "Performance Enhancement in Federated Learning by
Reducing Class Imbalance of Non-IID Data", Sensors 23(3):1152, 2023, Algorithm 2
(:func:`kl_selection`, the cohort FedEntOpt's "KL" baseline selects).

Everything here is host-side numpy in float64: float32 sums can straddle the tie
tolerance and then break ties differently from a float64 reference. FedEntOpt and
uniform selection do not depend on the model, so :func:`fedentopt_schedule` and
:func:`uniform_schedule` return the
whole ``[R, M]`` schedule up front; Power-of-Choice needs the current losses
and is split into :func:`power_of_choice_candidates` and
:func:`power_of_choice_select`.

FedEntOpt semantics (one call of Algorithm 1 = :func:`fedentopt_round`):

  * The objective is the literal Eq. (5): the entropy in bits of the
    normalised **sum of raw counts** ``L + l^(j)`` (n-weighted), not an average
    of per-client distributions.
  * Availability within a round is ``avail = not in B at round start and not
    selected so far``: a client evicted from B during the round does
    not come back in that round. This equals the literal ``A <- A \\ B`` at
    every iteration of the loop.
  * The first client is uniform over the available clients, drawn as
    ``avail_sorted[rng.integers(len(avail_sorted))]``.
  * Candidates within ``tie_tol`` bits of the maximum entropy are tied:
    permutation-equivalent candidates have equal entropies whose computed
    values differ in the last bits, and a fixed rule keeps the schedule the
    same across precisions. ``'lowest'`` takes the lowest client index, ``'random'`` draws uniformly
    among the tied (sorted) ids with ``rng.integers``.
  * After each pick: if ``len(B) >= Q`` the oldest entry is evicted, then the
    pick is appended. ``Q = 0`` means the buffer never holds anyone (pure
    greedy with a random first client); the literal pseudo-code would keep
    the last pick in B.
  * ``Q <= K - M`` is required so that ``A`` never runs empty.

DP: :func:`dp_counts` applies the Laplace mechanism of
:func:`fedjax_kd.ops.privacy.laplace_counts` once per seed; noisy counts are
clipped at 0 and kept as float. Use them only for selection; compute cohort
statistics (:func:`schedule_stats`) on the true counts.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from fedjax_kd.ops import privacy

__all__ = [
    'TIE_TOL', 'TIE_BREAKS', 'entropy_bits', 'count_entropy', 'FedEntOptState',
    'fedentopt_round', 'fedentopt_schedule', 'uniform_round', 'uniform_schedule',
    'power_of_choice_candidates', 'power_of_choice_select', 'label_coverage',
    'cohort_entropy', 'schedule_stats', 'dp_counts', 'kl_to_uniform', 'kl_selection'
]

TIE_TOL = 1e-5  # bits: entropies this close are tied
TIE_BREAKS = ('lowest', 'random')

# Stream tags mixed into the seed so that the schedules and the DP noise of one
# seed use independent random streams.
_FEDENTOPT_STREAM = 0xFE0
_DP_STREAM = 0xD9


def _is_int(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_counts(counts) -> np.ndarray:
  counts = np.asarray(counts, dtype=np.float64)
  if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
    raise ValueError(f'counts must be a non-empty [K, C] array, got shape '
                     f'{counts.shape}')
  if not np.all(np.isfinite(counts)) or np.any(counts < 0):
    raise ValueError('counts must be finite and non-negative')
  return counts


def entropy_bits(p: np.ndarray) -> np.ndarray:
  """Shannon entropy in bits over the last axis, ``0 * log 0 = 0``.

  Args:
    p: ``[..., C]`` already normalised rows (each sums to 1, or is all 0).

  Returns:
    float64 ``[...]`` entropies.
  """
  p = np.asarray(p, dtype=np.float64)
  pos = p > 0
  logs = np.log2(np.where(pos, p, 1.0))
  return -np.sum(np.where(pos, p * logs, 0.0), axis=-1)


def count_entropy(counts) -> np.ndarray:
  """Entropy in bits of ``counts / counts.sum()`` over the last axis.

  Args:
    counts: ``[..., C]`` non-negative counts (float or int).

  Returns:
    float64 ``[...]`` entropies; an all-zero row has entropy 0.
  """
  counts = np.asarray(counts, dtype=np.float64)
  total = np.sum(counts, axis=-1, keepdims=True)
  p = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
  return entropy_bits(p)


@dataclasses.dataclass(frozen=True)
class FedEntOptState:
  """The FedEntOpt server state carried across rounds.

  Attributes:
    buffer: the FIFO buffer B of recently selected client ids, oldest first.
  """
  buffer: tuple[int, ...] = ()


def fedentopt_round(counts: np.ndarray,
                    m: int,
                    q: int,
                    buffer: tuple[int, ...],
                    rng: np.random.Generator,
                    *,
                    tie_tol: float = TIE_TOL,
                    tie_break: str = 'lowest'
                   ) -> tuple[np.ndarray, tuple[int, ...]]:
  """One call of Algorithm 1 (FedEntOpt).

  Args:
    counts: ``[K, C]`` label-count vectors (DP-noised if DP is on), float64.
    m: M, the number of clients to select, ``>= 1``.
    q: Q, the maximum buffer size, ``>= 0``.
    buffer: the FIFO buffer at the start of the round, oldest first.
    rng: draws the first client (``rng.integers`` over the sorted available
      ids) and, with ``tie_break='random'``, the tie breaks.
    tie_tol: candidates within this many bits of the maximum are tied.
    tie_break: ``'lowest'`` (lowest client index) or ``'random'``.

  Returns:
    ``(selected, new_buffer)``: int64 ``[m]`` client ids in selection order and
    the updated buffer (a tuple, oldest first).

  Raises:
    ValueError: invalid arguments, or no client is available before ``m``
      clients were selected.
  """
  counts = _check_counts(counts)
  k = counts.shape[0]
  if not _is_int(m) or m < 1:
    raise ValueError(f'm={m!r} must be an integer >= 1')
  if not _is_int(q) or q < 0:
    raise ValueError(f'buffer size q={q!r} must be an integer >= 0')
  if tie_break not in TIE_BREAKS:
    raise ValueError(f'tie_break={tie_break!r} must be one of {TIE_BREAKS}')
  if not tie_tol >= 0:
    raise ValueError(f'tie_tol={tie_tol!r} must be >= 0')
  buf = [int(b) for b in buffer]
  if any(b < 0 or b >= k for b in buf):
    raise ValueError(f'buffer {tuple(buf)} holds ids outside [0, {k})')
  avail = np.ones(k, bool)
  avail[buf] = False  # buffer membership at the start of the round
  total = np.zeros(counts.shape[1], np.float64)
  selected = np.zeros(m, np.int64)
  for i in range(m):
    ids = np.flatnonzero(avail)
    if ids.size == 0:
      raise ValueError(
          f'no client available to select client {i + 1} of m={m} (K={k}, '
          f'{len(buffer)} buffered at round start, q={q}); need q <= K - m')
    if i == 0:
      j = int(ids[rng.integers(ids.size)])
    else:
      h = count_entropy(total[None, :] + counts[ids])
      tied = ids[h >= np.max(h) - tie_tol]
      if tie_break == 'lowest':
        j = int(tied[0])
      else:
        j = int(tied[rng.integers(tied.size)])
    if q > 0:
      if len(buf) >= q:
        buf.pop(0)
      buf.append(j)
    total = total + counts[j]
    avail[j] = False
    selected[i] = j
  return selected, tuple(buf)


def _check_schedule_args(k: int, rounds, m) -> None:
  if not _is_int(rounds) or rounds < 0:
    raise ValueError(f'rounds={rounds!r} must be an integer >= 0')
  if not _is_int(m) or not 1 <= m <= k:
    raise ValueError(f'm={m!r} must be an integer in [1, K] = [1, {k}]')


def fedentopt_schedule(counts,
                       rounds: int,
                       m: int,
                       q: int,
                       seed: int,
                       *,
                       tie_tol: float = TIE_TOL,
                       tie_break: str = 'lowest') -> np.ndarray:
  """The FedEntOpt selection schedule for ``rounds`` rounds (it does not depend on the model).

  A pure function of its arguments: the buffer starts empty and one generator
  ``np.random.default_rng(np.random.SeedSequence([seed, 0xFE0]))`` feeds every
  round's :func:`fedentopt_round` in order.

  Args:
    counts: ``[K, C]`` finite non-negative label counts (DP-noised or not).
    rounds: R >= 0.
    m: M, clients per round, in ``[1, K]``.
    q: Q, the buffer size, in ``[0, K - M]``.
    seed: non-negative integer seed.
    tie_tol: tie tolerance in bits.
    tie_break: one of `TIE_BREAKS`.

  Returns:
    int64 ``[rounds, m]``; row r is round r+1's cohort in selection order.

  Raises:
    ValueError: invalid arguments (e.g. ``q`` outside ``[0, K - m]``).
  """
  counts = _check_counts(counts)
  k = counts.shape[0]
  _check_schedule_args(k, rounds, m)
  if not _is_int(q) or not 0 <= q <= k - m:
    raise ValueError(f'buffer size q={q!r} must be in [0, K - m] = '
                     f'[0, {k - m}]')
  if not _is_int(seed) or seed < 0:
    raise ValueError(f'seed={seed!r} must be a non-negative integer')
  rng = np.random.default_rng(np.random.SeedSequence([seed,
                                                      _FEDENTOPT_STREAM]))
  out = np.zeros((rounds, m), np.int64)
  buf: tuple[int, ...] = ()
  for r in range(rounds):
    out[r], buf = fedentopt_round(counts, m, q, buf, rng, tie_tol=tie_tol,
                                  tie_break=tie_break)
  return out


# The stream of uniform client selection: ``fedjax_kd.core.rng.PHASES['select']`` (a test
# keeps the two equal; ops import nothing from the engine).
SELECT_STREAM = 4


def uniform_round(num_clients: int, m: int, seed: int, t: int) -> np.ndarray:
  """Round ``t``'s uniform cohort: ``m`` distinct ids without replacement.

  ``default_rng([seed, t, SELECT_STREAM]).choice(num_clients, m, replace=False)``:
  the generator the experiment layer draws from (``fedjax_kd.core.rng.host_rng``
  with phase ``'select'``), so a schedule computed here is the one a run uses.
  """
  gen = np.random.default_rng([seed, t, SELECT_STREAM])
  return np.asarray(gen.choice(num_clients, size=m, replace=False), np.int64)


def uniform_schedule(num_clients: int, rounds: int, m: int,
                     seed: int) -> np.ndarray:
  """Uniform selection without replacement, a fresh draw per round.

  Ignores client sizes. Row ``r`` is :func:`uniform_round` of round ``r + 1``.

  Args:
    num_clients: K >= 1.
    rounds: R >= 0.
    m: clients per round, in ``[1, K]``.
    seed: non-negative integer seed.

  Returns:
    int64 ``[rounds, m]``, distinct ids within each row.
  """
  if not _is_int(num_clients) or num_clients < 1:
    raise ValueError(f'num_clients={num_clients!r} must be an integer >= 1')
  _check_schedule_args(num_clients, rounds, m)
  if not _is_int(seed) or seed < 0:
    raise ValueError(f'seed={seed!r} must be a non-negative integer')
  out = np.zeros((rounds, m), np.int64)
  for r in range(rounds):
    out[r] = uniform_round(num_clients, m, seed, r + 1)
  return out


def power_of_choice_candidates(rng: np.random.Generator, sizes,
                               d: int) -> np.ndarray:
  """Power-of-Choice step 1: ``d`` distinct candidates, ``P ∝ n_k / N``.

  Sequential sampling without replacement (numpy's ``Generator.choice`` with
  ``p``): each draw is proportional to the sizes of the clients not drawn yet.
  Clients of size 0 are never drawn.

  Args:
    rng: the generator.
    sizes: ``[K]`` non-negative client sizes ``n_k``.
    d: the candidate-set size, in ``[1, #clients with n_k > 0]``.

  Returns:
    int64 ``[d]`` distinct client ids in draw order.
  """
  sizes = np.asarray(sizes, dtype=np.float64)
  if sizes.ndim != 1 or not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
    raise ValueError('sizes must be a finite non-negative [K] vector')
  positive = int(np.count_nonzero(sizes))
  if not _is_int(d) or not 1 <= d <= positive:
    raise ValueError(f'd={d!r} must be an integer in [1, {positive}] (the '
                     'number of clients with positive size)')
  p = sizes / sizes.sum()
  return np.asarray(rng.choice(sizes.size, size=d, replace=False, p=p),
                    np.int64)


def power_of_choice_select(candidates, losses, m: int) -> np.ndarray:
  """Power-of-Choice step 3: the ``m`` candidates with the highest loss.

  Ties are broken by the lower client id; NaN losses rank last.

  Args:
    candidates: int ``[d]`` distinct client ids.
    losses: float ``[d]`` the candidates' local losses ``F_k(theta)``.
    m: clients to select, in ``[1, d]``.

  Returns:
    int64 ``[m]`` client ids, highest loss first.
  """
  candidates = np.asarray(candidates, dtype=np.int64).reshape(-1)
  losses = np.asarray(losses, dtype=np.float64).reshape(-1)
  if candidates.shape != losses.shape:
    raise ValueError(f'candidates {candidates.shape} and losses '
                     f'{losses.shape} must have the same length')
  if np.unique(candidates).size != candidates.size:
    raise ValueError('candidates must be distinct')
  if not _is_int(m) or not 1 <= m <= candidates.size:
    raise ValueError(f'm={m!r} must be an integer in [1, d] = '
                     f'[1, {candidates.size}]')
  nan = np.isnan(losses)
  neg = np.where(nan, 0.0, -losses)
  order = np.lexsort((candidates, neg, nan))  # last key is the primary one
  return candidates[order[:m]]


def label_coverage(counts, cohort) -> int:
  """Number of classes with a positive summed count over ``cohort``."""
  counts = _check_counts(counts)
  total = counts[np.asarray(cohort, dtype=np.int64)].sum(axis=0)
  return int(np.count_nonzero(total > 0))


def cohort_entropy(counts, cohort) -> float:
  """Entropy in bits of the summed label counts of ``cohort``."""
  counts = _check_counts(counts)
  total = counts[np.asarray(cohort, dtype=np.int64)].sum(axis=0)
  return float(count_entropy(total))


def schedule_stats(counts, schedule, num_classes_threshold=None) -> dict:
  """Per-round label statistics of a selection schedule.

  Evaluate on the **true** counts, also for schedules chosen from DP-noised
  counts (noise makes absent classes look present).

  Args:
    counts: ``[K, C]`` label counts.
    schedule: int ``[R, M]`` client ids.
    num_classes_threshold: a round has full coverage when at least this many
      classes are present; ``None`` means all C classes.

  Returns:
    A dict with ``entropy`` float64 ``[R]`` (bits of the summed cohort counts),
    ``coverage`` int64 ``[R]`` (classes present), ``full_coverage`` bool
    ``[R]``, ``participation`` int64 ``[K]`` (selections per client), and the
    scalars ``entropy_mean``, ``entropy_std`` (population std over rounds, 0
    if R = 0), ``full_coverage_rate`` (fraction of rounds) and
    ``above_log2_cm1`` (fraction of rounds with entropy > log2(C - 1), which
    implies full coverage).
  """
  counts = _check_counts(counts)
  k, c = counts.shape
  schedule = np.asarray(schedule, dtype=np.int64)
  if schedule.ndim != 2:
    raise ValueError(f'schedule must be [R, M], got shape {schedule.shape}')
  if schedule.size and (schedule.min() < 0 or schedule.max() >= k):
    raise ValueError(f'schedule holds ids outside [0, {k})')
  threshold = c if num_classes_threshold is None else num_classes_threshold
  totals = counts[schedule].sum(axis=1)  # [R, C]
  entropy = count_entropy(totals).reshape(schedule.shape[0])
  coverage = np.count_nonzero(totals > 0, axis=-1).astype(np.int64)
  full = coverage >= threshold
  rounds = schedule.shape[0]
  above = entropy > math.log2(c - 1) if c > 1 else np.zeros(rounds, bool)
  return {
      'entropy': entropy,
      'coverage': coverage,
      'full_coverage': full,
      'participation': np.bincount(schedule.reshape(-1),
                                   minlength=k).astype(np.int64),
      'entropy_mean': float(entropy.mean()) if rounds else float('nan'),
      'entropy_std': float(entropy.std()) if rounds else 0.0,
      'full_coverage_rate': float(full.mean()) if rounds else float('nan'),
      'above_log2_cm1': float(np.mean(above)) if rounds else float('nan'),
  }


def dp_counts(counts, epsilon: float, seed: int) -> np.ndarray:
  """Laplace-noised label counts for selection.

  ``privacy.laplace_counts(default_rng(SeedSequence([seed, 0xD9])), counts,
  epsilon)``: ``max(l + Lap(0, 1/epsilon), 0)`` per entry, float64, not rounded,
  noise drawn once per seed (add/remove-one neighbours, L1 sensitivity 1).

  Raises:
    ValueError: ``epsilon`` is not a finite number > 0 (message names it).
  """
  rng = np.random.default_rng(np.random.SeedSequence([seed, _DP_STREAM]))
  return privacy.laplace_counts(rng, counts, epsilon)


# ----------------------------------------------------------------- KL (Seol & Kim)
def kl_to_uniform(counts) -> float:
  """``D_KL(P || U)`` in nats of ``P = counts / sum(counts)`` against the uniform
  distribution over the entries of ``counts`` (``0 log 0 = 0``; 0 for an all-zero vector)."""
  counts = np.asarray(counts, dtype=np.float64).reshape(-1)
  total = counts.sum()
  if total <= 0 or counts.size == 0:
    return 0.0
  p = counts / total
  pos = p > 0
  return float(np.sum(p[pos] * np.log(p[pos] * counts.size)))


def kl_selection(counts, m: int, threshold: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
  """The "KL" client selection FedEntOpt compares with (M. Seol, T. Kim, Sensors 23(3):1152,
  2023, Algorithm 2): a greedy, deterministic cohort from the uploaded label counts.

  Clients are visited in descending order of their data amount (ties: lower id). The first
  one is taken whole and sets the cap ``cap = max_c v_c`` of the cohort's class volume
  ``v``. Each later client is taken if it has a sample of the cohort's currently rarest
  class ``f = argmin_c v_c`` (lowest class index on ties); it contributes
  ``s_c = min(cap - v_c, n_c)`` of each class (the rest of its data would be left out).
  The selection stops when ``m`` clients are taken or ``D_KL(v / sum v || uniform) <
  threshold``; a pass that takes nobody ends it early (fewer than ``m`` clients).

  Choices where the pseudo-code is open: the stop test runs after every pick (``h`` is a
  maximum, which a test only after a full pass could overshoot); a repeated pass visits
  only clients not yet taken; classes no client has are left out of ``argmin`` and of the
  uniform target (otherwise nobody could ever be added); clients with no data are never
  taken. No randomness: the same counts give the same cohort in every round.

  Args:
    counts: ``[K, C]`` finite non-negative label counts.
    m: the maximum number of clients (``h``), in ``[1, K]``.
    threshold: ``theta_KLD`` (nats) >= 0; 0 stops only at ``m`` clients.

  Returns:
    ``(ids, allocation)``: int64 ``[<= m]`` client ids in pick order and float64 ``[K, C]``
    each client's allocated per-class sample counts ``s`` (zero rows for the others).
  """
  counts = _check_counts(counts)
  k, _ = counts.shape
  if not _is_int(m) or not 1 <= m <= k:
    raise ValueError(f'm={m!r} must be an integer in [1, K] = [1, {k}]')
  if not (isinstance(threshold, numbers.Real) and math.isfinite(threshold)
          and threshold >= 0):
    raise ValueError(f'threshold={threshold!r} must be a finite number >= 0')
  classes = counts.sum(axis=0) > 0          # classes some client has
  totals = counts.sum(axis=1)
  order = np.argsort(-totals, kind='stable')
  order = order[totals[order] > 0]
  v = np.zeros(counts.shape[1], np.float64)
  alloc = np.zeros_like(counts)
  taken = np.zeros(k, bool)
  picked: list[int] = []
  cap = 0.0
  while len(picked) < m:
    added = False
    for c in order:
      if taken[c]:
        continue
      if not picked:
        share = counts[c].copy()
        cap = float(np.max(v + share))
      else:
        rare = np.flatnonzero(classes)[np.argmin(v[classes])]
        if counts[c, rare] <= 0:
          continue
        share = np.minimum(cap - v, counts[c])
      v += share
      alloc[c] = share
      taken[c] = True
      picked.append(int(c))
      added = True
      if len(picked) >= m or kl_to_uniform(v[classes]) < threshold:
        return np.asarray(picked, np.int64), alloc
    if not added:
      break
  return np.asarray(picked, np.int64), alloc
