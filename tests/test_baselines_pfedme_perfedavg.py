"""pFedMe and Per-FedAvg: their update rules on hand-worked quadratics, their local loops
against a literal transcription on a tiny MLP, and two-round runs with the bytes by hand.

The quick tier is the pure math (:mod:`fedjax_kd.ops.personal`); the loops and the runs
compile kernels and are marked slow.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.algorithms import per_fedavg as pfa
from fedjax_kd.algorithms import pfedme
from fedjax_kd.core import rng
from fedjax_kd.core.program import Rows, epoch_positions, random_batch
from fedjax_kd.ops import losses
from fedjax_kd.ops import personal
from tests.shared import tiny_config


def quadratic(a, b):
  """``grad_fn`` of ``f(w) = 1/2 w^T A w - b^T w`` on ``{'w': w}`` (gradient ``A w - b``,
  Hessian ``A``); ``aux`` counts the gradient evaluations."""
  a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  return lambda p, aux: ({'w': a @ p['w'] - b}, aux + 1)


def tree(*v):
  return {'w': jnp.asarray(v, jnp.float32)}


# ------------------------------------------------------------------ pFedMe
def test_pfedme_inner_solve_local_step_and_server_mix_by_hand():
  # f(theta) = theta^2 - theta (A = 2, b = 1); w = theta_0 = 1, lam = 1, lr = 0.1, K = 2.
  g = quadratic([[2.0]], [1.0])
  theta, calls = personal.pfedme_personalize(g, tree(1.0), tree(1.0), 0, lam=1.0, lr=0.1,
                                             steps=2)
  # step 1: grad = 2 - 1 = 1, prox = 0 -> 1 - 0.1 * 1 = 0.9
  # step 2: grad = 1.8 - 1 = 0.8, prox = 0.9 - 1 = -0.1 -> 0.9 - 0.1 * 0.7 = 0.83
  np.testing.assert_allclose(theta['w'], [0.83], rtol=1e-6)
  assert int(calls) == 2
  # w <- w - eta lam (w - theta) = 1 - 0.5 * 1 * 0.17 = 0.915
  w = personal.pfedme_local_update(tree(1.0), theta, lam=1.0, eta=0.5)
  np.testing.assert_allclose(w['w'], [0.915], rtol=1e-6)
  # lam pulls theta towards w: lam = 15, lr = 0.01 (lr lam = 0.15), K = 1 from theta = 0, w = 2:
  # grad f(0) = -1 -> 0 - 0.01 (-1 + 15 (0 - 2)) = 0.31
  theta, _ = personal.pfedme_personalize(g, tree(0.0), tree(2.0), 0, lam=15.0, lr=0.01, steps=1)
  np.testing.assert_allclose(theta['w'], [0.31], rtol=1e-6)
  # Server: w = 1, participants 0.915 and 0.5 (mean 0.7075).
  mean = tree(0.7075)
  np.testing.assert_allclose(personal.pfedme_server_update(tree(1.0), mean, 1.0)['w'], [0.7075])
  # beta = 2: (1 - 2) * 1 + 2 * 0.7075 = 0.415
  np.testing.assert_allclose(personal.pfedme_server_update(tree(1.0), mean, 2.0)['w'], [0.415],
                             rtol=1e-6)


def test_pfedme_server_step_takes_the_plain_or_weighted_mean_of_participants():
  from fedjax_kd.core.state import ModelState
  server = ModelState(params=tree([1.0]), batch_stats={}, opt_state={})
  w_all = {'w': jnp.array([[0.915], [0.5], [9.0]])}        # client 2 did not take part
  out = pfedme._mix_server(server, w_all, {}, jnp.array([1.0, 1.0, 0.0]), jnp.float32(2.0))
  np.testing.assert_allclose(out.params['w'], [[0.415]], rtol=1e-6)
  # n_k weights 3 : 1 -> mean 0.81125; beta = 1 -> 0.81125
  out = pfedme._mix_server(server, w_all, {}, jnp.array([3.0, 1.0, 0.0]), jnp.float32(1.0))
  np.testing.assert_allclose(out.params['w'], [[0.81125]], rtol=1e-6)


# -------------------------------------------------------------- Per-FedAvg
A_D, B_D = [[2.0, 0.0], [0.0, 2.0]], [1.0, 0.0]       # batch D
A_D2, B_D2 = [[4.0, 0.0], [0.0, 1.0]], [2.0, 1.0]     # batch D'
A_D3 = [[3.0, 1.0], [1.0, 2.0]]                        # batch D'' (Hessian of the HF pass)


def test_perfedavg_first_order_step_by_hand():
  fns = (quadratic(A_D, B_D), quadratic(A_D2, B_D2))
  w, calls = personal.perfedavg_step(fns, tree(1.0, 0.0), 0, alpha=0.1, beta=0.5,
                                     hessian_free=False)
  # grad f(w; D) = [2 - 1, 0] = [1, 0]; w' = [0.9, 0]
  # grad f(w'; D') = [3.6 - 2, 0 - 1] = [1.6, -1]; w = [1, 0] - 0.5 [1.6, -1] = [0.2, 0.5]
  np.testing.assert_allclose(w['w'], [0.2, 0.5], rtol=1e-6)
  assert int(calls) == 2


def test_perfedavg_hessian_free_step_by_hand():
  fns = (quadratic(A_D, B_D), quadratic(A_D2, B_D2), quadratic(A_D3, [5.0, -7.0]))
  w, calls = personal.perfedavg_step(fns, tree(1.0, 0.0), 0, alpha=0.1, beta=0.5,
                                     hessian_free=True)
  # g = [1.6, -1] as above; H(D'') g = [[3, 1], [1, 2]] [1.6, -1] = [3.8, -0.4]
  # (I - 0.1 H) g = [1.6 - 0.38, -1 + 0.04] = [1.22, -0.96]  (b of D'' does not matter)
  # w = [1, 0] - 0.5 [1.22, -0.96] = [0.39, 0.48]
  np.testing.assert_allclose(w['w'], [0.39, 0.48], rtol=1e-6)
  assert int(calls) == 2           # the Hessian pass leaves aux alone


def test_personalisation_sgd_steps_by_hand():
  w, _ = personal.sgd_steps((quadratic(A_D, B_D),) * 2, tree(1.0, 0.0), 0, lr=0.1)
  # [1, 0] -> [0.9, 0] -> 0.9 - 0.1 (1.8 - 1) = 0.82
  np.testing.assert_allclose(w['w'], [0.82, 0.0], rtol=1e-6)


def test_random_batch_draws_distinct_real_positions_then_padding():
  key = jax.random.PRNGKey(3)
  p = np.asarray(random_batch(key, 10, jnp.int32(4), 6))
  assert sorted(p[:4]) == [0, 1, 2, 3] and list(p[4:]) == [10, 10]
  p = np.asarray(random_batch(key, 3, jnp.int32(2), 5))      # n_max < batch size
  assert sorted(p[:2]) == [0, 1] and list(p[2:]) == [3, 3, 3]


# ------------------------------------------------- the loops on a tiny MLP
def _tiny_fed():
  from tests.test_engine import make_data, make_fed
  data = make_data([9, 14, 20])
  fed = make_fed(data)
  return fed, data, fed.init(jax.random.PRNGKey(0))


def _client(data, k):
  rows = np.asarray(data.client_idx)[k, :int(data.client_n[k])]
  return np.asarray(data.x_private)[rows], np.asarray(data.y_private)[rows]


def _ce_grad(fed, x, y):
  module = fed.cohorts[0].kernels.module
  return jax.grad(lambda p: jnp.mean(losses.cross_entropy(module.apply({'params': p}, x), y)))


@pytest.mark.slow
def test_pfedme_local_matches_a_transcription_of_algorithm_1():
  """One full-batch local step (B >= n, one epoch): K prox steps from theta = w, then w."""
  fed, data, states = _tiny_fed()
  g = jax.tree.map(lambda a: a[0], states[0].params)     # client 0's initial model as w
  lam, plr, eta, k_steps = 15.0, 0.01, 0.05, 3
  active = np.array([False, True, True])
  start = jax.tree.map(jnp.copy, states[0].params)   # the program writes its input back
  ran = fed.run(
      pfedme.PFedMeLocal(1, 64, k_steps), states, jax.random.PRNGKey(1), 1, 'train',
      active=active, data=Rows({'x': data.x_private, 'y': data.y_private}, data.client_idx,
                               data.client_n),
      shared={'w': g, 'batch_stats': {}, 'steps': tuple(jnp.float32(v) for v in (lam, plr, eta))})
  w_all, theta, loss = ran.out, ran.states[0].params, ran.metrics
  for k in (1, 2):
    grad = _ce_grad(fed, *_client(data, k))
    th = g
    for _ in range(k_steps):
      gr = grad(th)
      th = jax.tree.map(lambda t, d, w: t - plr * (d + lam * (t - w)), th, gr, g)
    w = jax.tree.map(lambda a, t: a - eta * lam * (a - t), g, th)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[k], b, rtol=2e-5, atol=1e-6),
                 theta, th)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a[k], b, rtol=2e-5, atol=1e-6),
                 w_all, w)
  assert np.isnan(loss[0]) and np.isfinite(loss[1:]).all()   # client 0 did not take part
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[0], b[0]), theta, start)


@pytest.mark.parametrize('hf', [False, True])
@pytest.mark.slow
def test_perfedavg_local_matches_a_transcription_on_interleaved_parts(hf):
  """One step (B >= n): D = even positions of the shuffled batch, D' odd (thirds for HF)."""
  fed, data, states = _tiny_fed()
  alpha, beta = 0.3, 0.2
  root, t, k = jax.random.PRNGKey(2), 1, 2
  parts = 3 if hf else 2
  w0 = jax.tree.map(lambda a: a[k], states[0].params)   # the program writes its input back
  ran = fed.run(
      pfa.PerFedAvgLocal(1, 32, hf), states, root, t, 'train',
      active=np.array([False, False, True]),
      data=Rows({'x': data.x_private, 'y': data.y_private}, data.client_idx, data.client_n),
      shared={'steps': (jnp.float32(alpha), jnp.float32(beta))})
  w_all = ran.states[0].params
  n = int(data.client_n[k])
  key = rng.client_keys(root, t, np.array([k]), 'train')[0]
  pos = np.asarray(epoch_positions(key, data.client_idx.shape[1], jnp.int32(n), 1, 32)[0][0])
  rows = np.asarray(data.client_idx)[k]
  x, y = np.asarray(data.x_private), np.asarray(data.y_private)
  def part(j):
    p = pos[j::parts]
    r = rows[p[p < n]]
    return _ce_grad(fed, x[r], y[r])
  g1 = part(0)(w0)
  adapted = jax.tree.map(lambda a, d: a - alpha * d, w0, g1)
  g2 = part(1)(adapted)
  if hf:
    hvp = jax.jvp(part(2), (w0,), (g2,))[1]
    g2 = jax.tree.map(lambda a, h: a - alpha * h, g2, hvp)
  want = jax.tree.map(lambda a, d: a - beta * d, w0, g2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a[k], b, rtol=2e-5, atol=1e-6),
               w_all, want)


# ------------------------------------------------------------ end to end


def tiny(algorithm, **overrides):
  return tiny_config(algorithm, rounds=2, **{
      'clients.models': ['mlp@0.25'], 'server.model': 'mlp@0.25', 'checkpoint.every': 0,
      'clients.participation': 0.5, 'data.per_client_test': True, 'train.batch_size': 20,
      **overrides})


def run(tmp_path, c, name):
  workdir = os.path.join(tmp_path, name)
  summary = runner.run(config_lib.validate(c), workdir, progress=False, log=lambda s: None)
  rows = [json.loads(line) for line in open(os.path.join(workdir, 'metrics.jsonl'))]
  return rows, summary


def check_rows(rows, summary, elements):
  assert summary['setup_bytes'] == elements * 4                    # the initial global model
  for r in rows:
    m = r['participants']
    assert m == 2
    assert r['up_bytes'] == m * elements * 4 and r['down_bytes'] == elements * 4
    assert np.isfinite(r['train_loss'])
    assert 0.0 <= r['test_acc'] <= 1.0 and 0.0 <= r['global_acc'] <= 1.0
    assert 'client_acc' not in r and 'client_acc_min' in r         # test_acc is the clients' UA
    assert 'server_ua' in r


def model_elements(c):
  from fedjax_kd.running import experiment
  algo = experiment.build(config_lib.validate(c)).algorithm
  return algo.model_elements


@pytest.mark.slow
def test_pfedme_two_rounds_bytes_and_personal_models(tmp_path):
  c = tiny('pfedme', **{'pfedme.personal_lr': 0.05, 'pfedme.lr': 0.05})
  rows, summary = run(tmp_path, c, 'pfedme')
  check_rows(rows, summary, model_elements(c))


@pytest.mark.parametrize('variant', ['fo', 'hf'])
@pytest.mark.slow
def test_perfedavg_two_rounds_bytes(tmp_path, variant):
  c = tiny('perfedavg', **{'perfedavg.variant': variant, 'perfedavg.beta': 0.05})
  rows, summary = run(tmp_path, c, variant)
  check_rows(rows, summary, model_elements(c))


@pytest.mark.slow
def test_perfedavg_zero_eval_steps_scores_the_global_model(tmp_path):
  rows, _ = run(tmp_path, tiny('perfedavg', **{'perfedavg.eval_steps': 0,
                                               'data.per_client_test': False}), 'zero')
  for r in rows:   # every client evaluates the global model on the server's test set
    assert r['client_acc_min'] == r['client_acc_max'] == pytest.approx(r['global_acc'])


@pytest.mark.parametrize('algorithm', ['pfedme', 'perfedavg'])
@pytest.mark.slow
def test_host_store_gives_the_device_rounds(tmp_path, algorithm):
  """Partial participation with the clients in host memory: the same rounds (theta_k rows
  and the local models travel through the store's gather / scatter)."""
  got = {s: run(tmp_path, tiny(algorithm, **{'clients.store': s}), s)[0]
         for s in ('device', 'host')}
  drop = lambda rows: [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]
  assert drop(got['device']) == drop(got['host'])


@pytest.mark.slow
def test_existing_fedavg_round_is_unchanged(tmp_path):
  """The recorded tiny FedAvg rounds still come out (the engine's fit is untouched)."""
  from tests.test_golden import _check
  _check('tiny/fedavg', tmp_path)
