"""Tests for the selection methods' math (FedEntOpt, uniform, Power-of-Choice, KL)."""

import math

import numpy as np
import pytest

from fedjax_kd.data.partition import label_histogram, partition
from fedjax_kd import selection as sel

# CIFAR-10-like balanced labels: 5000 per class.
CIFAR10_LABELS = np.repeat(np.arange(10), 5000)


def _counts(name, seed, k=100, **kw):
  p = partition(name, CIFAR10_LABELS, k, num_classes=10, seed=seed, **kw)
  return label_histogram(CIFAR10_LABELS, p.client_indices, 10)


def _c2(seed):
  return _counts('classes', seed, classes_per_client=2)


def _dir01(seed):
  return _counts('niid_labeldir', seed, alpha=0.1, min_size=10)


# -----------------------------------------------------------------------------
# A literal transcription of Algorithm 1, python lists and loops.
# -----------------------------------------------------------------------------


def _entropy_literal(v):
  """Entropy(v / ||v||_1) in bits, 0 log 0 = 0 (the paper's Entropy)."""
  tot = sum(v)
  h = 0.0
  if tot > 0:
    for x in v:
      if x > 0:
        p = x / tot
        h -= p * math.log2(p)
  return h


def _algorithm1_literal(counts, K, M, Q, B, rng, tie_break='lowest',
                        tie_tol=1e-5):
  C = len(counts[0])
  L = [0.0] * C  # line 5
  S = []  # line 6
  A = set(range(K))  # line 7
  for i in range(M):  # line 8
    A = A - set(B)  # line 9: A only shrinks inside the round
    if Q > 0:
      # Every pick entered B, so line 9 already excluded it.
      assert not A & set(S)
    else:
      # Q = 0: the buffer never holds anyone (our reading: pure greedy); chosen
      # clients are still "excluded for further selection" (Eq. (5) text).
      A = A - set(S)
    assert A, 'A ran empty'
    if S:  # line 11
      ent = {}
      for j in sorted(A):
        ent[j] = _entropy_literal([L[c] + counts[j][c] for c in range(C)])
      hmax = max(ent.values())
      tied = sorted(j for j in ent if ent[j] >= hmax - tie_tol)
      if tie_break == 'lowest':
        jstar = tied[0]
      else:
        jstar = tied[int(rng.integers(len(tied)))]
    else:  # line 15: uniform over A
      cand = sorted(A)
      jstar = cand[int(rng.integers(len(cand)))]
    if Q > 0:
      if len(B) >= Q:  # line 18
        B.pop(0)  # line 19
      B.append(jstar)  # line 22
    L = [L[c] + counts[jstar][c] for c in range(C)]  # line 23
    S.append(jstar)  # line 24
  return S, B


def _literal_schedule(counts, rounds, m, q, seed, tie_break='lowest'):
  counts = [[float(x) for x in row] for row in np.asarray(counts)]
  rng = np.random.default_rng(np.random.SeedSequence([seed, 0xFE0]))
  B = []
  out = []
  for _ in range(rounds):
    S, B = _algorithm1_literal(counts, len(counts), m, q, B, rng, tie_break)
    out.append(S)
  return np.array(out, np.int64)


@pytest.mark.parametrize('setting,q,tie_break', [
    ('c2', 70, 'lowest'),
    ('c2', 5, 'lowest'),
    ('c2', 0, 'lowest'),
    ('c2', 70, 'random'),
    ('dir', 50, 'lowest'),
    ('dir', 5, 'lowest'),
    ('dir', 0, 'lowest'),
    ('dir_dp', 50, 'lowest'),
    ('dir_dp', 70, 'random'),
])
def test_schedule_matches_literal_algorithm1(setting, q, tie_break):
  seed = 3
  if setting == 'c2':
    counts = _c2(seed)
  elif setting == 'dir':
    counts = _dir01(seed)
  else:
    counts = sel.dp_counts(_dir01(seed), 0.5, seed)
  got = sel.fedentopt_schedule(counts, 60, 10, q, seed, tie_break=tie_break)
  want = _literal_schedule(counts, 60, 10, q, seed, tie_break)
  assert got.dtype == np.int64 and got.shape == (60, 10)
  np.testing.assert_array_equal(got, want)


def test_round_buffer_matches_literal():
  counts = _c2(1)
  rng_a = np.random.default_rng(5)
  rng_b = np.random.default_rng(5)
  buf_a, buf_b = (), []
  cl = [[float(x) for x in r] for r in counts]
  for _ in range(20):
    s_a, buf_a = sel.fedentopt_round(counts, 10, 15, buf_a, rng_a)
    s_b, buf_b = _algorithm1_literal(cl, 100, 10, 15, buf_b, rng_b)
    assert list(s_a) == s_b
    assert list(buf_a) == buf_b and len(buf_a) <= 15


# -----------------------------------------------------------------------------
# Hand-worked cases.
# -----------------------------------------------------------------------------


def test_hand_worked_tiny_case():
  # counts: 0 = [10, 0], 1 = [0, 10], 2 = [5, 5], 3 = [10, 0].
  # first 0: L=[10,0]; 1 -> [10,10] H=1, 2 -> [15,5] H=.811, 3 -> H=0  => 1;
  #   third: L=[10,10]; 2 -> [15,15] H=1, 3 -> [20,10] H=.918  => 2.
  # first 1: 0 and 3 both give [10,10] (tie) => 0; third: 2 ([15,15]) => 2.
  # first 2: 0,1,3 all give H(.75,.25) (tie) => 0; L=[15,5]:
  #   1 -> [15,15] H=1, 3 -> [25,5]  => 1.
  # first 3: 0 -> [20,0], 1 -> [10,10], 2 -> [15,5] => 1; third: 2 => 2.
  counts = np.array([[10, 0], [0, 10], [5, 5], [10, 0]], np.float64)
  want2 = {0: [0, 1], 1: [1, 0], 2: [2, 0], 3: [3, 1]}
  want3 = {0: [0, 1, 2], 1: [1, 0, 2], 2: [2, 0, 1], 3: [3, 1, 2]}
  seen = set()
  for s in range(40):
    got2, buf2 = sel.fedentopt_round(counts, 2, 0, (),
                                     np.random.default_rng(s))
    got3, _ = sel.fedentopt_round(counts, 3, 0, (), np.random.default_rng(s))
    first = int(got2[0])
    seen.add(first)
    assert got2.tolist() == want2[first]
    assert got3.tolist() == want3[first]
    assert buf2 == ()  # q = 0: the buffer never holds anyone
  assert seen == {0, 1, 2, 3}  # the first client is uniform over A


def test_first_client_uses_documented_draw():
  counts = np.ones((10, 3))
  rng = np.random.default_rng(11)
  got, _ = sel.fedentopt_round(counts, 1, 4, (1, 4, 7), rng)
  avail = [0, 2, 3, 5, 6, 8, 9]
  want = avail[int(np.random.default_rng(11).integers(len(avail)))]
  assert got.tolist() == [want]


def _first_is(counts, firsts, **kw):
  """Seeds whose first pick is in ``firsts``, with their selections."""
  out = []
  for s in range(60):
    got, _ = sel.fedentopt_round(counts, 2, 0, (), np.random.default_rng(s),
                                 **kw)
    if int(got[0]) in firsts:
      out.append(got.tolist())
  assert out
  return out


def test_tie_breaking():
  # Clients 1 and 2 are permutation-equivalent complements of client 0 / 3.
  counts = np.array([[10, 0, 0], [0, 0, 10], [0, 10, 0], [10, 0, 0]], float)
  for got in _first_is(counts, {0, 3}):
    assert got[1] == 1  # lowest index among the tied
  seconds = {g[1] for g in _first_is(counts, {0, 3}, tie_break='random')}
  assert seconds == {1, 2}
  # A gap far inside the tolerance is still a tie ...
  near = counts.copy()
  near[1, 2] = 10 + 1e-4  # H([10, 10.0001]) = 1 - 3.6e-11
  for got in _first_is(near, {0, 3}):
    assert got[1] == 1
  # ... a gap larger than the tolerance is not: client 2 wins.
  far = counts.copy()
  far[1, 2] = 12.0  # H([10, 12]) = 0.994 < 1 - 1e-5
  for got in _first_is(far, {0, 3}):
    assert got[1] == 2
  # ... unless the tolerance is widened.
  for got in _first_is(far, {0, 3}, tie_tol=0.01):
    assert got[1] == 1
  with pytest.raises(ValueError, match='tie_break'):
    sel.fedentopt_round(counts, 2, 0, (), np.random.default_rng(0),
                        tie_break='highest')


# -----------------------------------------------------------------------------
# Buffer semantics and validation.
# -----------------------------------------------------------------------------


def test_buffer_excludes_recent_rounds():
  counts = _dir01(2)
  m, q = 10, 20
  s = sel.fedentopt_schedule(counts, 200, m, q, 7)
  for r in range(len(s)):
    assert len(set(s[r].tolist())) == m
    for lag in (1, 2):
      if r + lag < len(s):
        assert not set(s[r].tolist()) & set(s[r + lag].tolist())
  # Once warm, each round picks from exactly K - q clients; the ones that help
  # the entropy come back as soon as they leave the buffer.
  assert any(set(s[r]) & set(s[r + 3]) for r in range(len(s) - 3))


def test_evicted_clients_do_not_return_in_round():
  # 0, 1, 2 would be the ideal complements but sit in B at the round start;
  # 0 is evicted by the first pick, 1 by the second, yet neither returns.
  counts = np.array([[0, 10], [0, 10], [0, 10], [10, 0], [10, 0], [10, 0],
                     [10, 0]], float)
  for s in range(10):
    got, buf = sel.fedentopt_round(counts, 3, 3, (0, 1, 2),
                                   np.random.default_rng(s))
    assert set(got.tolist()) <= {3, 4, 5, 6}
    assert len(set(got.tolist())) == 3
    assert buf == tuple(got.tolist())
  # q < m: the buffer keeps only the last q picks, rows stay distinct.
  got, buf = sel.fedentopt_round(counts, 4, 2, (), np.random.default_rng(0))
  assert len(set(got.tolist())) == 4 and buf == tuple(got.tolist()[-2:])


def test_validation():
  counts = _c2(0)
  with pytest.raises(ValueError, match=r'q=91.*\[0, K - m\] = \[0, 90\]'):
    sel.fedentopt_schedule(counts, 5, 10, 91, 0)
  with pytest.raises(ValueError, match='q='):
    sel.fedentopt_schedule(counts, 5, 10, -1, 0)
  sel.fedentopt_schedule(counts, 2, 10, 90, 0)  # q = K - m is fine
  with pytest.raises(ValueError, match='m='):
    sel.fedentopt_schedule(counts, 5, 0, 0, 0)
  with pytest.raises(ValueError, match='m='):
    sel.fedentopt_schedule(counts, 5, 101, 0, 0)
  with pytest.raises(ValueError, match='rounds'):
    sel.fedentopt_schedule(counts, -1, 10, 0, 0)
  with pytest.raises(ValueError, match='non-negative'):
    sel.fedentopt_schedule(-np.ones((4, 2)), 1, 1, 0, 0)
  with pytest.raises(ValueError, match='finite'):
    sel.fedentopt_schedule(np.full((4, 2), np.nan), 1, 1, 0, 0)
  with pytest.raises(ValueError, match='K, C'):
    sel.fedentopt_schedule(np.ones(4), 1, 1, 0, 0)
  assert sel.fedentopt_schedule(counts, 0, 10, 70, 0).shape == (0, 10)
  with pytest.raises(ValueError, match='no client available'):
    sel.fedentopt_round(np.ones((3, 2)), 2, 2, (0, 1),
                        np.random.default_rng(0))


def test_schedule_is_pure_function_of_args():
  counts = _c2(0)
  a = sel.fedentopt_schedule(counts, 30, 10, 70, 4)
  b = sel.fedentopt_schedule(counts, 30, 10, 70, 4)
  c = sel.fedentopt_schedule(counts, 30, 10, 70, 5)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  np.testing.assert_array_equal(sel.fedentopt_schedule(counts, 10, 10, 70, 4),
                                a[:10])


# -----------------------------------------------------------------------------
# Entropy helpers and statistics.
# -----------------------------------------------------------------------------


def test_entropy_helpers():
  assert sel.entropy_bits(np.array([0.5, 0.5])) == pytest.approx(1.0)
  assert sel.entropy_bits(np.full(10, 0.1)) == pytest.approx(math.log2(10))
  assert sel.entropy_bits(np.array([1.0, 0.0])) == 0.0
  np.testing.assert_allclose(
      sel.entropy_bits(np.array([[0.25, 0.75], [1.0, 0.0]])),
      [0.8112781244591328, 0.0])
  np.testing.assert_allclose(
      sel.count_entropy(np.array([[1, 3], [0, 0], [2, 2]])),
      [0.8112781244591328, 0.0, 1.0])
  assert sel.count_entropy(np.zeros(3)) == 0.0
  counts = np.array([[10, 0, 0], [0, 5, 0], [0, 5, 0], [3, 0, 0]], float)
  assert sel.label_coverage(counts, [1, 2]) == 1
  assert sel.label_coverage(counts, [0, 1, 3]) == 2
  assert sel.cohort_entropy(counts, [0, 1, 2]) == pytest.approx(1.0)
  assert sel.cohort_entropy(counts, [1, 3]) == pytest.approx(
      -(5 / 8) * math.log2(5 / 8) - (3 / 8) * math.log2(3 / 8))
  st = sel.schedule_stats(counts, np.array([[0, 1], [1, 2], [0, 3]]))
  np.testing.assert_allclose(st['entropy'], [
      -(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3), 0.0, 0.0])
  assert st['coverage'].tolist() == [2, 1, 1]
  assert st['full_coverage'].tolist() == [False, False, False]
  assert st['participation'].tolist() == [2, 2, 1, 1]
  st2 = sel.schedule_stats(counts, np.array([[0, 1], [1, 2]]),
                           num_classes_threshold=2)
  assert st2['full_coverage'].tolist() == [True, False]
  assert st2['full_coverage_rate'] == 0.5


# -----------------------------------------------------------------------------
# Reference-entropy table (counts only, K = 100): the numbers of an earlier,
# independent numpy simulation of the same settings.
# -----------------------------------------------------------------------------

SEEDS = range(5)


def _table_row(counts_fn, m, q):
  fe, rnd = [], []
  for s in SEEDS:
    counts = counts_fn(s)
    fe.append(sel.schedule_stats(counts,
                                 sel.fedentopt_schedule(counts, 100, m, q, s)))
    rnd.append(sel.schedule_stats(counts,
                                  sel.uniform_schedule(100, 100, m, s)))
  return fe, rnd


def test_reference_table_c2():
  # Reference: FedEntOpt 3.297-3.300 +- 0.01, 100 %; random 2.98-3.00 +- 0.15,
  # 23-32 %. Measured (seeds 0-4): about 3.29 / 100 % and 3.00 / ~25 %.
  fe, rnd = _table_row(_c2, 10, 70)
  fe_mean = np.mean([s['entropy_mean'] for s in fe])
  rnd_mean = np.mean([s['entropy_mean'] for s in rnd])
  assert 3.267 <= fe_mean <= 3.322  # max is log2(10) = 3.3219
  assert all(s['full_coverage_rate'] == 1.0 for s in fe)
  assert all(s['entropy_std'] < 0.03 for s in fe)
  assert 2.95 <= rnd_mean <= 3.03
  rnd_cov = np.mean([s['full_coverage_rate'] for s in rnd])
  assert 0.13 <= rnd_cov <= 0.42
  assert 0.10 <= np.mean([s['entropy_std'] for s in rnd]) <= 0.20


def test_reference_table_dir01():
  # Reference: FedEntOpt 3.21-3.23 +- 0.065, 100 %; random 2.66-2.68 +- 0.21,
  # 92-94 %. Measured over 20 partition seeds with the library's NIID-Bench
  # split: FedEntOpt 3.229-3.274 (mean 3.257), random 2.66-2.82 (mean 2.73),
  # coverage 93 %: the reference ranges sit at the low end of the seed spread,
  # so the upper bounds are widened by the measured spread.
  fe, rnd = _table_row(_dir01, 10, 50)
  fe_mean = np.mean([s['entropy_mean'] for s in fe])
  rnd_mean = np.mean([s['entropy_mean'] for s in rnd])
  assert 3.18 <= fe_mean <= 3.29
  assert all(s['full_coverage_rate'] == 1.0 for s in fe)
  assert all(s['entropy_mean'] > math.log2(9) for s in fe)
  assert 2.63 <= rnd_mean <= 2.78
  assert fe_mean - rnd_mean > 0.4
  rnd_cov = np.mean([s['full_coverage_rate'] for s in rnd])
  assert 0.82 <= rnd_cov <= 0.99
  assert 0.15 <= np.mean([s['entropy_std'] for s in rnd]) <= 0.27


# -----------------------------------------------------------------------------
# DP (Laplace-noised counts).
# -----------------------------------------------------------------------------


def test_dp_counts():
  counts = _dir01(1)
  noisy = sel.dp_counts(counts, 0.5, 1)
  assert noisy.dtype == np.float64 and noisy.shape == counts.shape
  assert np.all(noisy >= 0)
  assert np.mean(noisy != counts) > 0.5
  assert np.any((noisy > 0) & (noisy != np.round(noisy)))  # kept as float
  # Lap(scale 2): mean |noise| = 2 on entries that are not clipped.
  big = counts > 50
  assert np.mean(np.abs(noisy - counts)[big]) == pytest.approx(2.0, abs=0.4)
  np.testing.assert_array_equal(noisy, sel.dp_counts(counts, 0.5, 1))
  assert not np.array_equal(noisy, sel.dp_counts(counts, 0.5, 2))
  for bad in (0.0, -1.0):
    with pytest.raises(ValueError, match='epsilon'):
      sel.dp_counts(counts, bad, 0)


@pytest.mark.parametrize('counts_fn,q', [(_c2, 70), (_dir01, 50)])
def test_dp_barely_changes_entropy(counts_fn, q):
  for s in range(3):
    counts = counts_fn(s)
    raw = sel.fedentopt_schedule(counts, 100, 10, q, s)
    dp = sel.fedentopt_schedule(sel.dp_counts(counts, 0.5, s), 100, 10, q, s)
    assert not np.array_equal(raw, dp)
    h_raw = sel.schedule_stats(counts, raw)['entropy_mean']
    h_dp = sel.schedule_stats(counts, dp)['entropy_mean']  # true counts
    assert abs(h_raw - h_dp) < 0.02


# -----------------------------------------------------------------------------
# Uniform and Power-of-Choice.
# -----------------------------------------------------------------------------


def test_uniform_schedule():
  s = sel.uniform_schedule(20, 4000, 5, 3)
  assert s.dtype == np.int64 and s.shape == (4000, 5)
  assert all(len(set(row.tolist())) == 5 for row in s)
  np.testing.assert_array_equal(s, sel.uniform_schedule(20, 4000, 5, 3))
  assert not np.array_equal(s, sel.uniform_schedule(20, 4000, 5, 4))
  freq = np.bincount(s.reshape(-1), minlength=20)
  # Expected 1000 each, sd ~ 27.
  assert freq.min() > 880 and freq.max() < 1120
  # Fresh draw each round: consecutive rows are not the same cohort.
  assert np.mean([set(a) == set(b) for a, b in zip(s[:-1], s[1:])]) < 0.01
  with pytest.raises(ValueError, match='m='):
    sel.uniform_schedule(5, 3, 6, 0)


def test_power_of_choice_candidates():
  sizes = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
  rng = np.random.default_rng(0)
  for _ in range(200):
    c = sel.power_of_choice_candidates(rng, sizes, 3)
    assert c.dtype == np.int64 and len(set(c.tolist())) == 3
    assert 4 not in c
  rng = np.random.default_rng(1)
  draws = np.array([sel.power_of_choice_candidates(rng, sizes, 1)[0]
                    for _ in range(20000)])
  freq = np.bincount(draws, minlength=5) / len(draws)
  np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4, 0.0], atol=0.015)
  # d = #positive clients returns all of them.
  c = sel.power_of_choice_candidates(rng, sizes, 4)
  assert sorted(c.tolist()) == [0, 1, 2, 3]
  with pytest.raises(ValueError, match='d='):
    sel.power_of_choice_candidates(rng, sizes, 5)


def test_power_of_choice_select():
  cand = np.array([7, 3, 9, 1, 5])
  losses = np.array([0.5, 2.0, np.nan, 2.0, 1.0])
  assert sel.power_of_choice_select(cand, losses, 3).tolist() == [1, 3, 5]
  assert sel.power_of_choice_select(cand, losses, 5).tolist() == [
      1, 3, 5, 7, 9]
  losses2 = np.array([-np.inf, 0.1, np.nan, 0.3, 0.2])
  assert sel.power_of_choice_select(cand, losses2, 5).tolist() == [
      1, 5, 3, 7, 9]
  with pytest.raises(ValueError, match='m='):
    sel.power_of_choice_select(cand, losses, 6)
  with pytest.raises(ValueError, match='distinct'):
    sel.power_of_choice_select([1, 1], [0.0, 1.0], 1)


# ------------------------------------------------------------- the registry
def test_a_registered_method_is_a_config_value_with_its_own_rules():
  """A method registers as an algorithm does: the config accepts its name, runs its rules
  after the spec's and lists it when refusing another name; the selector adds dropout."""
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top

  @sel.register
  class Lowest(sel.Method):
    """The M clients with the lowest ids, every round."""
    name = 'lowest_ids'

    @classmethod
    def validate(cls, spec):
      if spec.clients.num_clients < 4:
        raise ConfigError('clients.num_clients', spec.clients.num_clients, 'at least 4')

    def select(self, t, losses_fn):
      return np.arange(self.m, dtype=np.int64), sel.base.NO_CANDIDATES

  try:
    assert list(sel.METHODS)[:4] == ['uniform', 'fedentopt', 'power_of_choice', 'kl']
    c = tiny_config(**{'clients.participation': 0.5, 'selection.method': 'lowest_ids',
                       'selection.dropout': 0.5})
    spec = config_lib.validate(c)
    selector = sel.ClientSelector(spec, np.ones((4, 10)), np.full(4, 10), method=Lowest)
    for t in (1, 2):
      plan = selector.plan(t)
      np.testing.assert_array_equal(plan.order, [0, 1])
      assert plan.active.sum() == 1 and plan.active[:2].any()   # round(0.5 * 2) dropped
    assert selector.setup_payloads() == []    # it uploads no label counts
    assert selector.description()['method'] == 'lowest_ids'
    with pytest.raises(ConfigError, match=r'^clients\.num_clients=3 is not allowed: expected '
                                          r'at least 4'):
      config_lib.validate(tiny_config(**{'clients.num_clients': 3,
                                         'selection.method': 'lowest_ids'}))
    with pytest.raises(ConfigError, match="expected one of 'uniform', 'fedentopt', "
                                          "'power_of_choice', 'kl', 'lowest_ids'"):
      config_lib.validate(tiny_config(**{'selection.method': 'oort'}))
    class Other(sel.Method):
      name = 'lowest_ids'
    with pytest.raises(ValueError,
                       match=r'already registered to .*\.Lowest \(pass replace=True\)'):
      sel.register(Other)
    with pytest.raises(ValueError, match='not a subclass of selection.Method'):
      sel.register(object)
    class Mine(sel.Method):
      name = 'fedentopt'
    with pytest.raises(ValueError, match="'fedentopt' is a built-in selection method"):
      sel.register(Mine, replace=True)
    sel.unregister('fedentopt')        # built-in ones stay
    assert 'fedentopt' in sel.METHODS
  finally:
    sel.unregister('lowest_ids')
  assert 'lowest_ids' not in sel.METHODS
