"""FedEntOpt client selection: A. Lutz, G. Steidl, K. Mueller, W. Samek, "Boosting Federated
Learning with FedEntOpt: Mitigating Label Skew by Entropy-Based Client Selection", arXiv
2411.01240v2, Algorithm 1.

Clients upload their label counts once (optionally Laplace-noised, ``selection.dp``); the
server greedily maximises the entropy of the cohort's summed counts with a FIFO buffer of
``Q`` recently selected clients. The selection does not depend on the model, so the whole
``[R, M]`` schedule is computed up front (:func:`fedentopt_schedule`, float64, lowest-index
ties) and a resumed run recomputes the same schedule.

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
statistics (:func:`fedjax_kd.selection.counts.schedule_stats`) on the true counts.
"""

from __future__ import annotations

import numpy as np

from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import privacy
from fedjax_kd.selection import base
from fedjax_kd.selection import counts as counts_lib

# The whole [rounds, clients a round] int64 schedule is computed (and written to
# selection.json) up front; a config that would need more than this is refused.
MAX_SCHEDULE_BYTES = 64 * 2**20

TIE_TOL = 1e-5  # bits: entropies this close are tied
TIE_BREAKS = ('lowest', 'random')

# Stream tags mixed into the seed so that the schedules and the DP noise of one
# seed use independent random streams.
_FEDENTOPT_STREAM = 0xFE0
_DP_STREAM = 0xD9


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
  counts = counts_lib.check_counts(counts)
  k = counts.shape[0]
  if not counts_lib.is_int(m) or m < 1:
    raise ValueError(f'm={m!r} must be an integer >= 1')
  if not counts_lib.is_int(q) or q < 0:
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
      h = counts_lib.count_entropy(total[None, :] + counts[ids])
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
  counts = counts_lib.check_counts(counts)
  k = counts.shape[0]
  counts_lib.check_schedule_args(k, rounds, m)
  if not counts_lib.is_int(q) or not 0 <= q <= k - m:
    raise ValueError(f'buffer size q={q!r} must be in [0, K - m] = '
                     f'[0, {k - m}]')
  if not counts_lib.is_int(seed) or seed < 0:
    raise ValueError(f'seed={seed!r} must be a non-negative integer')
  rng = np.random.default_rng(np.random.SeedSequence([seed,
                                                      _FEDENTOPT_STREAM]))
  out = np.zeros((rounds, m), np.int64)
  buf: tuple[int, ...] = ()
  for r in range(rounds):
    out[r], buf = fedentopt_round(counts, m, q, buf, rng, tie_tol=tie_tol,
                                  tie_break=tie_break)
  return out


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


class FedEntOpt(base.Method):
  """``selection.method='fedentopt'``: the precomputed schedule's row of each round."""
  name = 'fedentopt'
  uploads_label_counts = True

  @classmethod
  def validate(cls, spec) -> None:
    sel, k = spec.selection, spec.clients.num_clients
    if sel.q > k - sel.m:
      raise ConfigError('selection.buffer', sel.buffer,
                        f'a fraction with Q = floor(buffer * K) <= K - M = {k} - {sel.m} = '
                        f'{k - sel.m} (got Q = {sel.q}); otherwise fewer than M clients can be '
                        f'available in a round; i.e. buffer <= {(k - sel.m) / k:g}')
    if spec.rounds * sel.m * 8 > MAX_SCHEDULE_BYTES:
      raise ConfigError('rounds', spec.rounds,
                        f'at most {MAX_SCHEDULE_BYTES // (8 * sel.m):,} with selection.method='
                        f"'fedentopt' and {sel.m} clients a round: its schedule is computed up "
                        f'front and would take {spec.rounds * sel.m * 8 / 2**30:.1f} GiB (the '
                        f'limit is {MAX_SCHEDULE_BYTES // 2**20} MiB)')

  def __init__(self, spec, counts, sizes):
    super().__init__(spec, counts, sizes)
    self._counts = (dp_counts(counts, self.sel.epsilon, spec.seed) if self.sel.dp
                    else counts)
    self.schedule = fedentopt_schedule(self._counts, spec.rounds, self.m, self.sel.q,
                                       spec.seed, tie_tol=self.sel.tie_tol,
                                       tie_break=self.sel.tie_break)

  @property
  def counts(self):
    return self._counts

  def select(self, t, losses_fn):
    del losses_fn
    return np.asarray(self.schedule[t - 1], np.int64), base.NO_CANDIDATES

  def description(self):
    return {'q': self.sel.q, 'dp': self.sel.dp,
            'epsilon': self.sel.epsilon if self.sel.dp else None,
            'selection_counts': self._counts.tolist(), 'schedule': self.schedule.tolist()}
