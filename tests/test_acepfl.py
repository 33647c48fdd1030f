"""ACE-pFL end to end: Eq. 4 by hand, top-K completion, bytes by hand, history and best model,
ablation switches, bad input, resume. The clustering, temperature and noise ops have their own
test files (test_label_cluster, test_temperature, test_privacy)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import acepfl, base
from fedjax_kd.config import presets
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import aggregate, losses
from fedjax_kd.running import experiment
from fedjax_kd.running import results
from tests.test_fedcache2 import load_config, run

K = 4
C = 10
M = 40          # public samples


def ace_tiny(rounds=2, **overrides):
  c = presets.acepfl_cpu('synthetic:600')
  c.rounds = rounds
  c.data.num_public = M
  c.data.num_private = -1
  c.data.min_size = 5
  c.clients.num_clients = K
  c.clients.models = ['mlp@0.25']          # one cohort: one compile per kernel
  c.server.model = 'mlp@0.25'
  c.train.epochs = 1
  c.train.batch_size = 32
  c.distill.batch_size = 20
  c.distill.public_per_round = M
  c.acepfl.clusters = 2
  c.checkpoint.every = 0
  return config_lib.override(c, overrides)


def build(c):
  return experiment.build(config_lib.validate(c))


# ------------------------------------------------------------------ math
def test_triple_loss_matches_hand_computation():
  logits = jnp.asarray([[2.0, 0.0, -1.0]])
  y = jnp.asarray([0])
  s = jnp.asarray([[0.5, 0.5, 0.0]])           # a top-2 teacher with a zero
  best_logp = jnp.log(jnp.asarray([[0.2, 0.3, 0.5]]))
  hist = jnp.asarray([[1 / 3, 1 / 3, 1 / 3]])
  t = 2.0
  w = jnp.asarray([0.4, 0.3, 0.2, 0.1])
  got = float(losses.triple_distillation_loss(logits, y, s, best_logp, hist, t, w)[0])

  def np_softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()

  z = np.asarray([2.0, 0.0, -1.0])
  q = np_softmax(z / t)
  ce = -np.log(np_softmax(z)[0])
  sd_t = np_softmax(np.log([0.2, 0.3, 0.5]) / t)

  def kl(p, q):
    return sum(pi * np.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)

  want = 0.4 * ce + t * t * (0.3 * kl([0.5, 0.5, 0.0], q) + 0.2 * kl(sd_t, q)
                             + 0.1 * kl([1 / 3] * 3, q))
  assert got == pytest.approx(want, rel=1e-5)


def test_kl_directions():
  log_q = jax.nn.log_softmax(jnp.asarray([[1.0, 0.0, 0.0]]))
  teacher = jnp.exp(log_q)
  for d in losses.KL_DIRECTIONS:
    assert float(losses.tempered_kl(log_q, teacher, d)[0]) == pytest.approx(0.0, abs=1e-5)
  zero_teacher = jnp.asarray([[1.0, 0.0, 0.0]])
  ts = float(losses.tempered_kl(log_q, zero_teacher)[0])
  assert ts == pytest.approx(-float(log_q[0, 0]), rel=1e-6)        # KL(t||q) = -log q_0
  st = float(losses.tempered_kl(log_q, zero_teacher, 'student_teacher')[0])
  q = np.exp(np.asarray(log_q[0], np.float64))
  t = (np.asarray([1.0, 0.0, 0.0]) + 1e-8) / (1 + 3e-8)     # the epsilon-smoothed teacher
  assert st == pytest.approx(float(np.sum(q * np.log(q / t))), rel=1e-5)   # ~ 6.83, finite


def test_switched_off_terms_contribute_nothing_even_if_huge():
  logits = jnp.asarray([[50.0, -50.0]])
  bad = jnp.asarray([[0.0, 1.0]])           # KL = 100 T
  w = jnp.asarray([0.0, 1.0, 0.0, 0.0])
  a = losses.triple_distillation_loss(logits, jnp.asarray([0]), jnp.asarray([[1.0, 0.0]]),
                                      jnp.log(bad + 1e-30), bad, 1.0, w)
  assert float(a[0]) == pytest.approx(0.0, abs=1e-4)


def test_top_k_filter_and_completions():
  p = jnp.asarray([[0.1, 0.6, 0.05, 0.25], [0.25, 0.25, 0.25, 0.25]])
  f, kept = aggregate.top_k_filter(p, 2)
  np.testing.assert_array_equal(np.asarray(kept),
                                [[False, True, False, True], [True, True, False, False]])
  np.testing.assert_allclose(np.asarray(f)[0], [0, 0.6 / 0.85, 0, 0.25 / 0.85], rtol=1e-6)
  raw, kept = aggregate.top_k_filter(p, 2, renormalize=False)
  fill = np.asarray(aggregate.complete_top_k(raw, kept, 'fill'))
  np.testing.assert_allclose(fill[0], [0.075, 0.6, 0.075, 0.25], rtol=1e-6)
  np.testing.assert_allclose(fill[1], [0.25] * 4, rtol=1e-6)     # nothing lost: exact
  np.testing.assert_allclose(np.asarray(aggregate.complete_top_k(raw, kept, 'none')), raw)
  with pytest.raises(ValueError, match='1 <= k <= 4'):
    aggregate.top_k_filter(p, 5)


def test_cluster_means_by_hand():
  probs = jnp.asarray([[[1.0, 0.0]], [[0.0, 1.0]], [[0.5, 0.5]]])
  means = np.asarray(aggregate.cluster_means(probs, jnp.asarray([0, 0, 1]),
                                             jnp.asarray([1.0, 1.0, 1.0]), 3))
  np.testing.assert_allclose(means[0, 0], [0.5, 0.5])
  np.testing.assert_allclose(means[1, 0], [0.5, 0.5])
  np.testing.assert_allclose(means[2, 0], [0.5, 0.5])            # empty: uniform
  means = np.asarray(aggregate.cluster_means(probs, jnp.asarray([0, 0, 1]),
                                             jnp.asarray([1.0, 0.0, 1.0]), 2))
  np.testing.assert_allclose(means[0, 0], [1.0, 0.0])             # client 1 absent


# ----------------------------------------------------------- end to end
@pytest.mark.slow
def test_bytes_by_hand(tmp_path):
  rows, summary = run(tmp_path, ace_tiny(rounds=2))
  # Setup: R_z to K-1 clients, K distances, K cluster ids, K data sizes (Eq. 3); D0 not counted.
  assert summary['setup_bytes'] == (K - 1) * C * 4 + K * 4 + K * 4 + K * 4
  for r in rows:
    assert r['up_bytes'] == K * M * 5 * (4 + 4)        # top-5 values + int32 indices
    assert r['down_bytes'] == K * M * C * 4            # the dense aggregate, per client
    assert r['participants'] == K and r['round_time_s'] > 0


@pytest.mark.slow
def test_one_cluster_has_no_clustering_traffic(tmp_path):
  _, summary = run(tmp_path, ace_tiny(rounds=1, **{'acepfl.clustering': False}))
  assert summary['setup_bytes'] == 0


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_history_is_mean_of_aggregates_and_best_model_is_tracked(tmp_path, monkeypatch):
  seen, accs = [], []
  orig_agg = acepfl.ACEPFL.aggregate_uploads
  orig_acc = acepfl.ACEPFL.selection_accuracy

  def record_agg(self, up, *args):
    teachers, fresh = orig_agg(self, up, *args)
    seen.append(np.asarray(teachers))
    return teachers, fresh

  def record_acc(self, state, r):
    acc = orig_acc(self, state, r)
    accs.append(acc)
    return acc

  monkeypatch.setattr(acepfl.ACEPFL, 'aggregate_uploads', record_agg)
  monkeypatch.setattr(acepfl.ACEPFL, 'selection_accuracy', record_acc)
  exp = build(ace_tiny(rounds=3))
  algo = exp.algorithm
  state = algo.init()
  for t in (1, 2, 3):
    state, out = base.play_round(algo, state, t, np.ones(K, bool))
  np.testing.assert_allclose(np.asarray(state.extra.hist), np.mean(seen, axis=0), atol=1e-6)
  assert int(state.extra.hist_count[0]) == 3
  np.testing.assert_allclose(np.asarray(state.table.best_acc), np.max(accs, axis=0))
  assert out.metrics['temperature'] == pytest.approx(algo.temperature(3))
  # Eq. 3 with equal weights inside clusters: the teacher is a convex mix of the rows.
  np.testing.assert_allclose(seen[0].sum(-1), 1.0, atol=1e-5)
  # UA is the unweighted mean of per-client accuracies; the weighted mean uses test sizes.
  ev = algo.scores(state)
  acc, _ = algo.ctx.fed.evaluate(state.clients, per_client_test=True)
  n = np.asarray(exp.ctx.data.test_n, float)
  assert ev['test_acc'] == pytest.approx(float(np.mean(acc)))
  assert ev['test_acc_weighted'] == pytest.approx(float(np.sum(acc * n) / n.sum()))


@pytest.mark.slow
def test_sd_and_gd_start_in_round_two(tmp_path):
  def params_by_round(distillation):
    exp = build(ace_tiny(rounds=2, **{'acepfl.distillation': distillation}))
    state, out = exp.algorithm.init(), []
    for t in (1, 2):
      state, _ = base.play_round(exp.algorithm, state, t, np.ones(K, bool))
      out.append([np.asarray(a) for a in jax.tree.leaves(state.clients)])
    return out

  triple, single = params_by_round('triple'), params_by_round('single')
  for a, b in zip(triple[0], single[0]):      # round 1: no best model, no history yet
    np.testing.assert_array_equal(a, b)
  assert max(float(np.max(np.abs(a - b))) for a, b in zip(triple[1], single[1])) > 0


@pytest.mark.slow
def test_literal_gd_gives_no_gradient(tmp_path):
  def final(**kw):
    exp = build(ace_tiny(rounds=2, **kw))
    state = exp.algorithm.init()
    metrics = {}
    for t in (1, 2):
      state, out = base.play_round(exp.algorithm, state, t, np.ones(K, bool))
      metrics = out.metrics
    return jax.tree.leaves(state.clients), metrics

  lit, m = final(**{'acepfl.gd_mode': 'literal'})
  off, _ = final(**{'acepfl.weights': [0.4, 0.3, 0.2, 0.0]})
  for a, b in zip(lit, off):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert m['gd_literal'] >= 0            # logged, but it never touches the models


def test_per_cluster_teachers_and_fedmd_mean(tmp_path):
  exp = build(ace_tiny(rounds=1, **{'acepfl.aggregation': 'per_cluster'}))
  algo = exp.algorithm
  rows = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(0), (K, M, C)))
  labels = np.asarray(algo.clustering.labels)
  sizes = np.asarray(exp.ctx.data.client_n)
  teachers, fresh = algo.aggregate_uploads(rows, np.ones(K, bool), labels, sizes)
  assert teachers.shape[0] == algo.num_clusters and bool(jnp.all(fresh))
  for v in range(algo.num_clusters):
    np.testing.assert_allclose(np.asarray(teachers[v]),
                               np.asarray(rows)[labels == v].mean(0), atol=1e-6)
  md = build(ace_tiny(rounds=1, algorithm='fedmd')).algorithm
  teachers, _ = md.aggregate_uploads(rows, np.asarray([True, True, False, True]), labels, sizes)
  np.testing.assert_allclose(np.asarray(teachers[0]), np.asarray(rows)[[0, 1, 3]].mean(0),
                             atol=1e-6)
  assert md.k_top == C and md.options.curve == 'fixed'


def test_ablation_switches_map_to_options():
  o = config_lib.validate(ace_tiny(**{'acepfl.clustering': False,
                                      'acepfl.dynamic_temperature': False,
                                      'acepfl.distillation': 'double'})).options
  assert o.clusters == 1 and o.curve == 'fixed' and o.weights == (0.4, 0.3, 0.2, 0.0)
  o = config_lib.validate(ace_tiny(**{'acepfl.distillation': 'single'})).options
  assert o.weights == (0.4, 0.3, 0.0, 0.0)


@pytest.mark.slow
def test_partial_participation_and_noise_run(tmp_path):
  rows, _ = run(tmp_path, ace_tiny(rounds=2, **{
      'clients.participation': 0.5, 'acepfl.noise': 'laplace', 'acepfl.noise_scale': 0.01,
      'acepfl.hist_epsilon': 1.0, 'acepfl.aggregation': 'per_cluster'}))
  for r in rows:
    assert r['participants'] == 2
    assert r['up_bytes'] == 2 * M * 5 * 8
    assert np.isfinite(r['test_acc'])


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
  full, _ = run(tmp_path, ace_tiny(rounds=3, **{'checkpoint.every': 1}), 'full')
  c = ace_tiny(rounds=2, **{'checkpoint.every': 1})
  run(tmp_path, c, 'resumed')
  c.rounds = 3
  resumed, _ = run(tmp_path, c, 'resumed')
  assert len(resumed) == 3
  for a, b in zip(full, resumed):
    assert a['test_acc'] == pytest.approx(b['test_acc'], abs=1e-6)
    assert a['cum_bytes'] == b['cum_bytes']


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize('field,value,match', [
    ('acepfl.clusters', 5, r'acepfl\.clusters.*\[1, 4\]'),
    ('acepfl.t0', 0.0, r'acepfl\.t0'),
    ('acepfl.t0', -3.0, r'acepfl\.t0'),
    ('acepfl.weights', [0.4, 0.3], r'acepfl\.weights'),
    ('acepfl.distillation', 'quadruple', r'acepfl\.distillation'),
    ('acepfl.noise', 'gaussian', r'acepfl\.noise_scale'),
    ('data.val_fraction', 0.0, r'data\.val_fraction'),
    ('data.val_fraction', 1.0, r'data\.val_fraction'),
    ('acepfl.curve', 'f9', r'acepfl\.curve'),
])
def test_bad_config_names_the_field(field, value, match):
  with pytest.raises(ConfigError, match=match):
    config_lib.validate(ace_tiny(**{field: value}))


def test_top_k_larger_than_classes_fails_before_compute():
  with pytest.raises(ConfigError, match=r'acepfl\.top_k.*\[0, 10\]'):
    build(ace_tiny(**{'acepfl.top_k': 11}))


def test_public_labels_from_another_data_set_are_refused():
  with pytest.raises(ConfigError, match=r'data\.public_source'):
    config_lib.validate(ace_tiny(**{'data.public_source': 'digits'}))


def test_paper_config_validates_for_every_setting():
  for setting in ('dir0.1', 'dir1.0', 'dir10', 'pat2', 'pat5', 'pat7'):
    spec = config_lib.validate(load_config('acepfl_cifar10.py', setting))
    assert spec.clients.num_clients == 20 and spec.rounds == 300
    assert spec.options.top_k == 5 and spec.options.clusters == 3
    assert spec.options.weights == (0.4, 0.3, 0.2, 0.1)
    assert spec.clients.models[:4] == ('googlenet@1', 'vgg16@1', 'resnet34@1', 'resnet50@1')
  assert config_lib.validate(load_config('acepfl_cifar10.py', 'pat2')).data.classes_per_client == 2


def test_scarce_setting_is_the_cpu_setting_with_small_clients():
  base = config_lib.validate(load_config('acepfl_mnist_cpu.py', ''))
  spec = config_lib.validate(load_config('acepfl_mnist_cpu.py', 'scarce'))
  assert (spec.data.num_private, spec.data.alpha, spec.train.epochs) == (1000, 1.0, 5)
  assert (spec.rounds, spec.options.r0) == (21, 7)     # three temperature stages of 7 rounds
  assert (base.data.num_private, base.data.alpha, base.train.epochs) == (5400, 0.1, 1)
  # Everything else is the CPU setting's: models, D0, loss, clients.
  assert spec.clients == base.clients
  assert spec.data.num_public == base.data.num_public == 600
  assert spec.options.weights == base.options.weights
  with pytest.raises(ValueError, match="expected no argument or ':scarce'"):
    load_config('acepfl_mnist_cpu.py', 'scarse')


def test_scarce_digits_setting_gives_each_client_about_ten_digits():
  base = config_lib.validate(load_config('acepfl_digits.py', ''))
  spec = config_lib.validate(load_config('acepfl_digits.py', 'scarce'))
  assert (spec.data.num_private, spec.data.alpha, spec.train.epochs) == (100, 1.0, 5)
  assert (spec.rounds, spec.options.r0, spec.train.batch_size) == (21, 7, 8)
  assert spec.clients == base.clients and spec.data.num_public == base.data.num_public == 180
  with pytest.raises(ValueError, match="expected no argument, ':scarce'"):
    load_config('acepfl_digits.py', 'small')
  # :baselines is the same clients on one architecture, for the parameter-exchange baselines.
  b = config_lib.validate(load_config('acepfl_digits.py', 'baselines'))
  assert b.data == spec.data and set(b.clients.models) == {'cnn@1'} and b.rounds == spec.rounds


def test_convergence_round_by_hand():
  accs = [0.5, 0.6, 0.7, 0.7005] + [0.7] * 25
  rows = [{'round': i + 1, 'val_acc': a, 'test_acc': a - 0.1, 'cum_bytes': 10 * (i + 1),
           'round_time_s': 1.0} for i, a in enumerate(accs)]
  out = results.convergence(rows)
  assert out['converged_round'] == 3 and out['converged_by'] == 'val_acc'
  assert out['converged_bytes'] == 30 and out['converged_time_s'] == 3.0
  assert out['converged_acc'] == pytest.approx(0.6)
  assert results.convergence(rows[:15])['converged_round'] == 15   # not yet: patience 20
