"""Client selection for every algorithm (FedEntOpt, uniform, Power-of-Choice), dropout and
stragglers, and the parameter-exchange baselines FedProx, SCAFFOLD and FedNova end to end.

The selection math itself (Algorithm 1 against a literal transcription, the reference
entropy table) is in test_selection.py; the local-training rules in test_local_rules.py.
"""

import json
import os

import jax
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import selection as sel_ops
from fedjax_kd.algorithms import base
from fedjax_kd.config import presets
from fedjax_kd.errors import ConfigError
from fedjax_kd.running import experiment
from tests.test_fedcache2 import load_config, run

K = 20


def fe_tiny(algorithm='fedavg', selection='fedentopt', rounds=3, **overrides):
  c = presets.fedentopt_cpu('c2', 'digits', algorithm, selection)
  c.rounds = rounds
  c.clients.num_clients = K
  c.clients.participation = 0.25            # M = 5
  c.clients.models = ['mlp@0.25']
  c.server.model = 'mlp@0.25'
  c.data.num_public = 40
  c.distill.public_per_round = 40
  c.train.epochs = 2
  c.train.batch_size = 16
  c.checkpoint.every = 0
  return config_lib.override(c, overrides)


def spec_of(c):
  return config_lib.validate(c)


# ------------------------------------------------------------- bad input
@pytest.mark.parametrize('field,value,message', [
    ('clients.participation', 0.0, 'clients.participation'),
    ('clients.participation', 1.2, 'clients.participation'),
    ('selection.buffer', 1.0, 'selection.buffer'),
    ('selection.buffer', 0.8, 'K - M = 20 - 5 = 15'),      # Q = 16 > K - M
    ('selection.epsilon', 0.0, 'selection.epsilon'),
    ('selection.epsilon', -0.5, 'selection.epsilon'),
    ('selection.method', 'oort', "'uniform', 'fedentopt', 'power_of_choice'"),
    ('selection.dropout', 1.0, 'selection.dropout'),
    ('selection.stragglers', 1.5, 'selection.stragglers'),
    ('selection.straggler_min_epochs', 3, 'train.epochs = 2'),
    ('selection.tie_break', 'highest', 'selection.tie_break'),
    ('train.lr_decay', 0.0, 'train.lr_decay'),
    ('data.label_key', 'coarse_label', 'data.label_key'),
])
def test_bad_selection_input_names_the_field(field, value, message):
  with pytest.raises(ConfigError) as e:
    spec_of(fe_tiny(**{field: value}))
  assert message in str(e.value)


def test_power_of_choice_candidates_at_least_m_and_sgd_only_baselines():
  with pytest.raises(ConfigError, match=r'selection.candidates.*\[5, 20\]'):
    spec_of(fe_tiny(selection='power_of_choice', **{'selection.candidates': 3}))
  for algo in ('scaffold', 'fednova'):
    with pytest.raises(ConfigError, match='train.optimizer'):
      spec_of(fe_tiny(algo, **{'train.optimizer': 'adam'}))
  assert spec_of(fe_tiny(selection='power_of_choice')).selection.candidates == 10   # 2M


def test_q_and_m_follow_the_paper_rules():
  s = spec_of(fe_tiny(**{'selection.buffer': 0.75}))   # floor(0.75 * 20) = 15 = K - M: ok
  assert (s.selection.m, s.selection.q) == (5, 15)
  for arg, q, m in [('dir0.1', 50, 10), ('c2', 70, 10), ('c3', 70, 4)]:
    s = spec_of(load_config('fedentopt_cifar10.py', arg))
    assert (s.selection.q, s.selection.m, s.clients.num_clients, s.rounds) == (q, m, 100, 500)
    assert s.train.lr_decay == 0.98 and s.train.fresh_optimizer and s.train.batch_size == 64
    assert set(s.clients.models) == {'lenet5@1'} and s.data.num_public == 0
  s = spec_of(load_config('fedentopt_cifar100.py', 'c3'))
  assert s.data.label_key == 'coarse_label' and s.selection.m == 8
  s = spec_of(load_config('fedentopt_cifar10.py', 'c2,scaffold,fedentopt_dp'))
  assert s.algorithm == 'scaffold' and s.selection.dp and s.selection.epsilon == 0.5


# ------------------------------------------------------------- the layer
def test_fedentopt_schedule_is_precomputed_on_true_or_noisy_counts():
  exp = experiment.build(spec_of(fe_tiny(rounds=6)))
  sel = exp.ctx.selector
  counts = exp.ctx.data.client_labels()
  want = sel_ops.fedentopt_schedule(counts.astype(float), 6, 5, 14, 0)   # Q = 0.7 K
  np.testing.assert_array_equal(sel.method.schedule, want)
  for t in range(1, 7):
    np.testing.assert_array_equal(np.flatnonzero(sel.plan(t).active), np.sort(want[t - 1]))
  dp = experiment.build(spec_of(fe_tiny(rounds=6, **{'selection.dp': True}))).ctx.selector
  assert (dp.method.counts >= 0).all() and not np.array_equal(dp.method.counts, counts)
  np.testing.assert_array_equal(dp.true_counts, counts)
  # Coverage is reported on the true counts.
  plan = sel.plan(1)
  m = sel.round_metrics(plan)
  assert m['label_coverage'] == int((counts[plan.active].sum(0) > 0).sum())


def test_dropout_exact_and_bernoulli_keep_the_schedule():
  sel = experiment.build(spec_of(fe_tiny(rounds=20, **{'selection.dropout': 0.3}))).ctx.selector
  for t in range(1, 21):
    p = sel.plan(t)
    np.testing.assert_array_equal(np.sort(p.order), np.sort(sel.method.schedule[t - 1]))
    assert p.selected.sum() == 5 and p.active.sum() == 5 - round(0.3 * 5)   # 2 drop
    assert not (p.active & ~p.selected).any()
  bern = experiment.build(spec_of(fe_tiny(rounds=200, **{
      'selection.dropout': 0.3, 'selection.dropout_mode': 'bernoulli'}))).ctx.selector
  dropped = [5 - bern.plan(t).active.sum() for t in range(1, 201)]
  assert len(set(dropped)) > 2 and abs(np.mean(dropped) / 5 - 0.3) < 0.05


def test_stragglers_fixed_set_and_epoch_draws():
  sel = experiment.build(spec_of(fe_tiny(**{'selection.stragglers': 0.5,
                                            'train.epochs': 5}))).ctx.selector
  assert sel.stragglers.sum() == 10
  draws = np.stack([sel.local_epochs(t, 5) for t in range(1, 101)])
  assert (draws[:, ~sel.stragglers] == 5).all()
  s = draws[:, sel.stragglers]
  assert s.min() == 1 and s.max() == 5 and len(np.unique(s)) == 5
  assert sel.local_epochs(1, 5) is not None
  none = experiment.build(spec_of(fe_tiny())).ctx.selector
  assert none.local_epochs(1, 5) is None


def test_power_of_choice_takes_the_highest_loss_candidates():
  sel = experiment.build(spec_of(fe_tiny(selection='power_of_choice'))).ctx.selector
  seen = []
  p = sel.plan(1, lambda mask: (seen.append(mask.copy()), np.arange(K, dtype=float))[1])
  cands = np.flatnonzero(seen[0])
  assert len(cands) == 10 and set(p.candidates) == set(cands)
  np.testing.assert_array_equal(np.flatnonzero(p.active), np.sort(cands)[-5:])


def test_uniform_matches_the_old_sampler():
  spec = spec_of(fe_tiny(selection='uniform'))
  sel = experiment.build(spec).ctx.selector
  for t in (1, 2, 7):
    np.testing.assert_array_equal(sel.plan(t).active, experiment.participants(spec, t))


# ------------------------------------------------------------ end to end
@pytest.mark.slow
def test_fedentopt_run_logs_coverage_and_counts_the_label_upload(tmp_path):
  c = fe_tiny(rounds=3)
  rows, summary = run(tmp_path, c)
  assert all(r['participants'] == 5 and r['selected'] == 5 for r in rows)
  assert all(1 <= r['label_coverage'] <= 10 and 0 < r['cohort_entropy'] <= np.log2(10) + 1e-9
             for r in rows)
  with open(os.path.join(tmp_path, 'run', 'selection.json')) as f:
    desc = json.load(f)
  assert desc['method'] == 'fedentopt' and len(desc['schedule']) == 3 and desc['q'] == 14
  exp = experiment.build(spec_of(c))
  elements = sum(x.size for x in jax.tree.leaves(exp.algorithm.init().server.params))
  # Setup: the initial model multicast (once) + K label-count vectors of C float32.
  assert summary['setup_bytes'] == elements * 4 + K * 10 * 4
  # A round: 5 uploads + one multicast of the model.
  assert rows[0]['up_bytes'] == 5 * elements * 4 and rows[0]['down_bytes'] == elements * 4


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_everybody_dropped_leaves_the_model_unchanged(tmp_path):
  c = fe_tiny(selection='uniform', rounds=3, **{'clients.participation': 0.05,
                                                'selection.dropout': 0.9})
  rows, _ = run(tmp_path, c)       # M = 1, round(0.9) = 1 drops
  assert all(r['participants'] == 0 and r['dropped'] == 1 for r in rows)
  assert len({r['test_acc'] for r in rows}) == 1 and rows[-1]['cum_bytes'] == rows[0]['cum_bytes']


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_fedprox_zero_mu_is_fedavg_and_positive_mu_stays_closer(tmp_path):
  avg, _ = run(tmp_path, fe_tiny('fedavg', rounds=2), 'avg')
  prox0, _ = run(tmp_path, fe_tiny('fedprox', rounds=2, **{'fedprox.mu': 0.0}), 'p0')
  assert [r['test_acc'] for r in avg] == [r['test_acc'] for r in prox0]

  def moved(algo, **kw):
    exp = experiment.build(spec_of(fe_tiny(algo, rounds=1, **kw)))
    st = exp.algorithm.init()
    start = jax.tree.map(np.asarray, st.server.params)
    st, _ = base.play_round(exp.algorithm, st, 1, exp.ctx.selector.plan(1).active)
    return sum(float(np.sum((np.asarray(a) - b) ** 2))
               for a, b in zip(jax.tree.leaves(st.server.params), jax.tree.leaves(start)))
  assert moved('fedprox', **{'fedprox.mu': 5.0}) < 0.7 * moved('fedavg')


@pytest.mark.slow
def test_fednova_equals_fedavg_for_equal_steps_and_differs_otherwise():
  def server_after_round(algo, **kw):
    exp = experiment.build(spec_of(fe_tiny(algo, rounds=1, **{'train.momentum': 0.0,
                                                              'selection.method': 'uniform',
                                                              **kw})))
    st = exp.algorithm.init()
    active = exp.ctx.selector.plan(1).active
    tau = exp.algorithm.local_steps(base.round_input(exp.algorithm, exp.ctx.fed, 1, active))
    st, _ = base.play_round(exp.algorithm, st, 1, active)
    return st.server.params, tau[active]
  iid = {'data.partition': 'iid'}      # equal n_k: equal tau, FedNova = FedAvg
  a, tau = server_after_round('fedavg', **iid)
  b, _ = server_after_round('fednova', **iid)
  assert len(set(tau)) == 1
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6), a, b)
  a, tau = server_after_round('fedavg')
  b, _ = server_after_round('fednova')
  assert len(set(tau)) > 1
  assert not np.allclose(jax.tree.leaves(a)[0], jax.tree.leaves(b)[0])


@pytest.mark.slow
def test_scaffold_control_variates_after_one_round():
  exp = experiment.build(spec_of(fe_tiny('scaffold', rounds=1, **{'selection.stragglers': 0.5})))
  algo = exp.algorithm
  st = algo.init()
  start = st.server.params
  active = exp.ctx.selector.plan(1).active
  tau = algo.local_steps(base.round_input(algo, exp.ctx.fed, 1, active))
  st, out = base.play_round(algo, st, 1, active)
  lr = exp.spec.train.learning_rate
  k = int(np.flatnonzero(active)[0])
  y = jax.tree.map(lambda a: np.asarray(a[k]), st.clients[0].params)
  want = jax.tree.map(lambda s, yy: (np.asarray(s[0]) - yy) / (tau[k] * lr), start, y)
  got = jax.tree.map(lambda a: np.asarray(a[k]), st.table.c_k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), got, want)
  off = int(np.flatnonzero(~active)[0])
  assert all(np.all(np.asarray(a[off]) == 0) for a in jax.tree.leaves(st.table.c_k))
  c_sum = jax.tree.map(lambda a: np.asarray(a).sum(0) / K, st.table.c_k)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a[0]), b, rtol=1e-5,
                                                       atol=1e-7), st.extra.c, c_sum)
  elements = sum(x.size for x in jax.tree.leaves(start))
  up = sum(p.elements * p.copies for p in out.payloads if p.direction == 'up')
  assert up == 2 * active.sum() * elements            # model + control variate


@pytest.mark.slow
def test_scaffold_with_stragglers_and_dropout_resumes_exactly(tmp_path):
  kw = {'selection.stragglers': 0.5, 'selection.dropout': 0.2}
  full, _ = run(tmp_path, fe_tiny('scaffold', rounds=4, **kw), 'full')
  c = fe_tiny('scaffold', rounds=2, **kw)
  c.checkpoint.every = 1
  run(tmp_path, c, 'resumed')
  c = fe_tiny('scaffold', rounds=4, **kw)
  c.checkpoint.every = 1
  resumed, _ = run(tmp_path, c, 'resumed')
  assert [r['test_acc'] for r in resumed] == [r['test_acc'] for r in full]
  assert [r['participants'] for r in resumed] == [r['participants'] for r in full]


@pytest.mark.parametrize('algo', ['dsfl', 'fedcache2'])
@pytest.mark.slow
def test_distillation_algorithms_take_the_selection_layer(tmp_path, algo):
  rows, _ = run(tmp_path, fe_tiny(algo, rounds=2, **{'selection.stragglers': 0.5,
                                                     'selection.dropout': 0.2,
                                                     'distill.batch_size': 40}))
  assert all(r['participants'] == 4 and r['label_coverage'] >= 1 for r in rows)
  assert rows[-1]['test_acc'] is not None


@pytest.mark.slow
def test_power_of_choice_scores_the_global_model_on_each_candidate(tmp_path):
  exp = experiment.build(spec_of(fe_tiny(selection='power_of_choice', rounds=2)))
  algo, d = exp.algorithm, exp.ctx.data
  st = algo.init()
  cands = np.zeros(K, bool)
  cands[[2, 7, 11]] = True
  losses = algo.selection_losses(st, cands)
  assert np.isnan(losses[~cands]).all()
  for k in (2, 7, 11):
    rows = np.asarray(d.client_idx)[k, :d.client_n[k]]
    _, want, _ = algo.server_model.evaluate(st.server, np.asarray(d.x_private)[rows],
                                            np.asarray(d.y_private)[rows])
    assert abs(losses[k] - want) < 1e-5 * max(1.0, want)
  rows, _ = run(tmp_path, fe_tiny(selection='power_of_choice', rounds=2))
  assert all(r['participants'] == 5 for r in rows)


@pytest.mark.parametrize('algo', ['fedavg', 'scaffold'])
def test_fedavg_setup_payloads_need_no_init(algo):
  """The initial broadcast is counted from the model's shapes, on an algorithm whose init
  never ran, and equals the global model's size (SCAFFOLD's rounds double it, not setup)."""
  exp = experiment.build(spec_of(fe_tiny(algo, selection='uniform', rounds=1)))
  fresh = type(exp.algorithm)(exp.ctx)   # nothing but the constructor has run
  (setup,) = fresh.setup_payloads()
  server = fresh.init().server
  elements = sum(x.size for x in jax.tree.leaves((server.params, server.batch_stats)))
  assert (setup.name, setup.direction, setup.kind) == ('params', 'down', 'float')
  assert setup.elements == elements and isinstance(setup.elements, int)
  assert setup.copies == K and setup.multicast
  up = [p for p in fresh.payloads(np.ones(K, bool)) if p.direction == 'up']
  assert sum(p.elements * p.copies for p in up) == (2 if algo == 'scaffold' else 1) * K * elements
