"""The label-skew baselines FedEntOpt compares with: FedRS, FedLC and the "KL" client selector.

Quick tier: the losses and the selection on tiny arrays, worked out by hand in the comments.
Slow tier: two-round runs through the runner (bytes by hand) and FedRS with FedEntOpt's
selection (the combination of FedEntOpt's Table II).
"""

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import selection as sel_ops
from fedjax_kd.algorithms import base
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import label_skew
from fedjax_kd.running import experiment
from tests.test_fedcache2 import run
from tests.test_fedentopt import K, fe_tiny, spec_of

LOGITS = jnp.array([[1.0, 2.0, 0.5]])


# ------------------------------------------------------------------ FedRS
def test_fedrs_restricted_softmax_by_hand():
  # A client with counts (4, 2, 0): class 2 is missing. Paper scales, alpha = 0.5: (1, 1, 0.5).
  scales = label_skew.fedrs_scales([[4, 2, 0]], 0.5)
  np.testing.assert_array_equal(scales, [[1.0, 1.0, 0.5]])
  # Logits (1, 2, 0.5) -> (1, 2, 0.25); label 0:
  # -1 + ln(e^1 + e^2 + e^0.25) = -1 + ln(2.718282 + 7.389056 + 1.284025)
  #                             = -1 + ln(11.391363) = -1 + 2.432856 = 1.432856.
  loss = label_skew.restricted_cross_entropy(LOGITS, jnp.array([0]), jnp.asarray(scales[0]))
  np.testing.assert_allclose(loss, [1.432856], rtol=1e-5)
  # The authors' code's scales: alpha + (1 - alpha) n / max n = 0.5 + 0.5 (1, 0.5, 0)
  # = (1, 0.75, 0.5); logits -> (1, 1.5, 0.25): -1 + ln(2.718282 + 4.481689 + 1.284025)
  # = -1 + ln(8.483996) = -1 + 2.138182 = 1.138182.
  prop = label_skew.fedrs_scales([[4, 2, 0]], 0.5, proportional=True)
  np.testing.assert_allclose(prop, [[1.0, 0.75, 0.5]])
  loss = label_skew.restricted_cross_entropy(LOGITS, jnp.array([0]), jnp.asarray(prop[0]))
  np.testing.assert_allclose(loss, [1.138182], rtol=1e-5)
  # alpha = 1 is plain cross-entropy: -1 + ln(e + e^2 + e^0.5) = -1 + ln(11.756059) = 1.464369.
  ones = label_skew.fedrs_scales([[4, 2, 0]], 1.0)
  loss = label_skew.restricted_cross_entropy(LOGITS, jnp.array([0]), jnp.asarray(ones[0]))
  np.testing.assert_allclose(loss, [1.464369], rtol=1e-5)


def test_fedrs_damps_the_gradient_of_a_missing_class():
  # d loss / d o_c = s_c softmax(s o)_c for c != y: the missing class's is alpha times its
  # probability under the restricted softmax, 0.5 * 1.284025 / 11.391363 = 0.056360.
  scales = jnp.asarray(label_skew.fedrs_scales([[4, 2, 0]], 0.5)[0])
  g = jax.grad(lambda o: label_skew.restricted_cross_entropy(o, jnp.array([0]), scales)[0])(
      LOGITS)
  np.testing.assert_allclose(g[0, 2], 0.5 * 1.284025 / 11.391363, rtol=1e-5)
  # A client with no data at all gets scale 1 (it never trains; no division by zero).
  np.testing.assert_array_equal(label_skew.fedrs_scales([[0, 0, 0]], 0.5), [[1.0, 1.0, 1.0]])


# ------------------------------------------------------------------ FedLC
def test_fedlc_calibrated_loss_by_hand():
  # Counts (16, 1, 81), tau = 1: margins 16^-1/4 = 0.5, 1^-1/4 = 1, 81^-1/4 = 1/3.
  margins, present = label_skew.fedlc_margins([[16, 1, 81]], 1.0)
  np.testing.assert_allclose(margins, [[0.5, 1.0, 1 / 3]], rtol=1e-6)
  # z = (1 - 0.5, 2 - 1, 0.5 - 1/3) = (0.5, 1, 0.166667); label 0:
  # ln(e^0.5 + e^1 + e^0.166667) - 0.5 = ln(1.648721 + 2.718282 + 1.181360) - 0.5
  #                                    = ln(5.548363) - 0.5 = 1.713503 - 0.5 = 1.213503.
  loss = label_skew.calibrated_cross_entropy(LOGITS, jnp.array([0]), margins[0], present[0])
  np.testing.assert_allclose(loss, [1.213503], rtol=1e-5)
  # tau = 2 doubles the margins: z = (0, 0, -0.166667); label 1:
  # ln(1 + 1 + 0.846482) - 0 = ln(2.846482) = 1.046084.
  m2, p2 = label_skew.fedlc_margins([[16, 1, 81]], 2.0)
  loss = label_skew.calibrated_cross_entropy(LOGITS, jnp.array([1]), m2[0], p2[0])
  np.testing.assert_allclose(loss, [1.046084], rtol=1e-5)


def test_fedlc_leaves_a_missing_class_out_of_the_softmax():
  # Counts (16, 1, 0): class 2 has n = 0, an infinite margin: it leaves the softmax.
  margins, present = label_skew.fedlc_margins([[16, 1, 0]], 1.0)
  np.testing.assert_array_equal(present, [[1, 1, 0]])
  assert np.all(np.isfinite(margins))
  # z = (0.5, 1, -): label 0: ln(e^0.5 + e^1) - 0.5 = ln(4.367003) - 0.5 = 0.974077;
  # label 1: ln(4.367003) - 1 = 0.474077.
  for y, want in ((0, 0.974077), (1, 0.474077)):
    loss = label_skew.calibrated_cross_entropy(LOGITS, jnp.array([y]), margins[0], present[0])
    np.testing.assert_allclose(loss, [want], rtol=1e-5)
  # The missing class's logit gets no gradient, and nothing is NaN.
  g = jax.grad(lambda o: label_skew.calibrated_cross_entropy(
      o, jnp.array([0]), margins[0], present[0])[0])(LOGITS)
  assert np.all(np.isfinite(g)) and g[0, 2] == 0.0
  # d/d o_1 = softmax(z)_1 = e / 4.367003 = 0.622460.
  np.testing.assert_allclose(g[0, 1], 2.718282 / 4.367003, rtol=1e-5)


# ----------------------------------------------------------- KL selector
# K = 5 clients, C = 3 classes. Data amounts: 6, 3, 5, 4, 1, so the visiting order is
# 0, 2, 3, 1, 4.
COUNTS = np.array([[6, 0, 0],
                   [0, 3, 0],
                   [2, 2, 1],
                   [0, 0, 4],
                   [1, 0, 0]])


def test_kl_selection_by_hand():
  # Client 0 is taken whole: v = (6, 0, 0), cap = 6, KL(v || U) = ln 3 = 1.098612.
  # Client 2: rarest class argmin v = 1 (tie 1/2 -> lower); it has 2 of class 1: taken,
  #   share = min(cap - v, n) = min((0, 6, 6), (2, 2, 1)) = (0, 2, 1); v = (6, 2, 1),
  #   KL = 6/9 ln 2 + 2/9 ln(2/3) + 1/9 ln(1/3) = 0.462098 - 0.090103 - 0.122068 = 0.249927.
  # Client 3: rarest class 2 (v_2 = 1); it has 4: share = min((0, 4, 5), (0, 0, 4)) = (0, 0, 4);
  #   v = (6, 2, 5), KL = 0.086281.
  # Client 1: rarest class 1 (2); it has 3: share = min((0, 4, 1), (0, 3, 0)) = (0, 3, 0);
  #   v = (6, 5, 5), KL = 0.003832.
  # Client 4: rarest class 1 (5, tie with class 2 -> 1); it has none: skipped, and a second
  #   pass takes nobody either, so even m = 5 gives 4 clients.
  for v, want in [((6, 0, 0), math.log(3)), ((6, 2, 1), 0.249927), ((6, 2, 5), 0.086281),
                  ((6, 5, 5), 0.003832)]:
    assert abs(sel_ops.kl_to_uniform(v) - want) < 2e-6
  ids, alloc = sel_ops.kl_selection(COUNTS, 3)
  np.testing.assert_array_equal(ids, [0, 2, 3])
  ids, alloc = sel_ops.kl_selection(COUNTS, 5)
  np.testing.assert_array_equal(ids, [0, 2, 3, 1])
  np.testing.assert_array_equal(alloc, [[6, 0, 0], [0, 3, 0], [0, 2, 1], [0, 0, 4], [0, 0, 0]])
  # The threshold stops early: 0.086 < 0.1 after client 3; 0.2499 < 0.3 after client 2.
  np.testing.assert_array_equal(sel_ops.kl_selection(COUNTS, 5, 0.1)[0], [0, 2, 3])
  np.testing.assert_array_equal(sel_ops.kl_selection(COUNTS, 5, 0.3)[0], [0, 2])


def test_kl_selection_is_deterministic_and_ignores_absent_classes():
  # The same counts give the same cohort, whatever the seed or round: no randomness.
  rng = np.random.default_rng(0)
  counts = rng.integers(0, 20, (30, 10)) * (rng.random((30, 10)) < 0.3)
  first = sel_ops.kl_selection(counts, 6)[0]
  for _ in range(3):
    np.testing.assert_array_equal(sel_ops.kl_selection(counts, 6)[0], first)
  # A class no client has does not stall the selection (argmin runs over existing classes).
  padded = np.concatenate([COUNTS, np.zeros((5, 1), int)], axis=1)
  np.testing.assert_array_equal(sel_ops.kl_selection(padded, 5)[0], [0, 2, 3, 1])
  with pytest.raises(ValueError, match='m=0'):
    sel_ops.kl_selection(COUNTS, 0)
  with pytest.raises(ValueError, match='threshold'):
    sel_ops.kl_selection(COUNTS, 2, -1.0)


def test_kl_selector_picks_the_same_cohort_every_round_and_bad_config_is_named():
  spec = spec_of(fe_tiny(selection='kl', rounds=5))
  sel = experiment.build(spec).ctx.selector
  cohorts = [sel.plan(t).order.tolist() for t in range(1, 6)]
  assert all(c == cohorts[0] for c in cohorts) and len(cohorts[0]) <= 5
  want, _ = sel_ops.kl_selection(sel.true_counts, 5)
  assert cohorts[0] == want.tolist()
  desc = sel.description()
  assert desc['method'] == 'kl' and desc['cohort'] == cohorts[0]
  assert len(sel.setup_payloads()) == 1
  with pytest.raises(ConfigError, match='selection.kl_threshold'):
    spec_of(fe_tiny(selection='kl', **{'selection.kl_threshold': -0.5}))
  with pytest.raises(ConfigError, match='fedrs.alpha'):
    spec_of(fe_tiny('fedrs', **{'fedrs.alpha': 1.5}))
  with pytest.raises(ConfigError, match='fedlc.tau'):
    spec_of(fe_tiny('fedlc', **{'fedlc.tau': -1.0}))
  with pytest.raises(ConfigError, match='clients.models'):
    spec_of(fe_tiny('fedlc', **{'clients.models': ['mlp@0.25', 'mlp@0.5']}))


# ------------------------------------------------------------ end to end
def _elements(c):
  exp = experiment.build(spec_of(c))
  return sum(x.size for x in jax.tree.leaves(exp.algorithm.init().server.params))


@pytest.mark.slow
def test_fedrs_with_fedentopt_selection_runs_and_counts_bytes(tmp_path):
  c = fe_tiny('fedrs', selection='fedentopt', rounds=2)
  rows, summary = run(tmp_path, c)
  assert all(r['participants'] == 5 and np.isfinite(r['test_acc']) for r in rows)
  assert all(np.isfinite(r['train_loss']) for r in rows)
  elements = _elements(c)
  # Setup: the initial model multicast + K label-count vectors of C = 10 float32.
  assert summary['setup_bytes'] == elements * 4 + K * 10 * 4
  # A round: FedAvg's bytes (5 uploads + one multicast); the scales never leave a client.
  assert all(r['up_bytes'] == 5 * elements * 4 and r['down_bytes'] == elements * 4
             for r in rows)


@pytest.mark.slow
def test_fedlc_with_the_kl_selector_trains_the_same_cohort(tmp_path):
  c = fe_tiny('fedlc', selection='kl', rounds=2)
  rows, summary = run(tmp_path, c)
  with open(os.path.join(tmp_path, 'run', 'selection.json')) as f:
    desc = json.load(f)
  m = len(desc['cohort'])
  assert desc['method'] == 'kl' and 1 <= m <= 5
  assert all(r['participants'] == m and np.isfinite(r['test_acc']) for r in rows)
  assert rows[0]['label_coverage'] == rows[1]['label_coverage']
  elements = _elements(c)
  assert summary['setup_bytes'] == elements * 4 + K * 10 * 4   # model + label counts, once
  assert all(r['up_bytes'] == m * elements * 4 and r['down_bytes'] == elements * 4
             for r in rows)


@pytest.mark.slow
def test_fedrs_alpha_one_is_fedavg_and_the_defaults_differ():
  def server_after_round(algo, **kw):
    exp = experiment.build(spec_of(fe_tiny(algo, selection='uniform', rounds=1, **kw)))
    st = exp.algorithm.init()
    st, _ = base.play_round(exp.algorithm, st, 1, exp.ctx.selector.plan(1).active)
    return jax.tree.leaves(st.server.params)
  avg = server_after_round('fedavg')
  rs1 = server_after_round('fedrs', **{'fedrs.alpha': 1.0})
  for a, b in zip(avg, rs1):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for algo in ('fedrs', 'fedlc'):     # alpha = 0.5 and tau = 1 change the local updates
    other = server_after_round(algo)
    assert not all(np.allclose(a, b, atol=1e-6) for a, b in zip(avg, other)), algo
