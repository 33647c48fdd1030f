"""FedALA and KT-pFL (ACE-pFL's baselines): the ALA mixing and weight step, the top-layer
choice and the round's initialisation; KT-pFL's personalised targets, the projected step on
the knowledge coefficient matrix and the distillation loss, by hand or against literal NumPy
transcriptions; end-to-end runs with their bytes (slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.algorithms import fedala, kt_pfl
from fedjax_kd.core.state import ModelState
from fedjax_kd.errors import ConfigError
from fedjax_kd.models import registry
from fedjax_kd.ops import ala, knowledge_coeff
from fedjax_kd.running import experiment
from tests.shared import tiny_config
from tests.test_main import read_rows


# ------------------------------------------------------------------- FedALA
def test_ala_mix_by_hand():
  # theta + (theta_g - theta) * W: 1 + (0 - 1) * 0.5 = 0.5; 0 + (2 - 0) * 0.25 = 0.5;
  # 3 + (3 - 3) * 0.7 = 3.
  (out,) = ala.mix((jnp.array([1.0, 0.0, 3.0]),), (jnp.array([0.0, 2.0, 3.0]),),
                   (jnp.array([0.5, 0.25, 0.7]),))
  np.testing.assert_allclose(out, [0.5, 0.5, 3.0])


def test_ala_weight_step_on_a_linear_model_by_hand():
  # logits = x @ theta_hat, x = [1], label 0; theta = [[1, 0]], theta_g = [[0, 2]],
  # W = [[0.5, 0.5]]: theta_hat = [[0.5, 1.0]], p = softmax([0.5, 1]) = [0.377541, 0.622459],
  # L = -log 0.377541 = 0.974077; dL/dtheta_hat = x (p - e_0) = [[-0.622459, 0.622459]];
  # theta_g - theta = [[-1, 2]], so dL/dW = [[0.622459, 1.244918]];
  # eta = 0.5: W = clip([[0.5 - 0.311230, 0.5 - 0.622459]], 0, 1) = [[0.188770, 0]].
  x = jnp.array([[1.0]])
  loss = lambda th: -jax.nn.log_softmax(x @ th[0])[0, 0]
  w, value = ala.step(loss, (jnp.array([[0.5, 0.5]]),), (jnp.array([[1.0, 0.0]]),),
                      (jnp.array([[0.0, 2.0]]),), 0.5)
  np.testing.assert_allclose(value, 0.974077, atol=1e-6)
  np.testing.assert_allclose(w[0], [[0.188770, 0.0]], atol=1e-6)
  # The same step from the parameter gradient (Eq. 5 as printed).
  (w2,) = ala.weight_step((jnp.array([[0.5, 0.5]]),), (jnp.array([[-0.622459, 0.622459]]),),
                          (jnp.array([[1.0, 0.0]]),), (jnp.array([[0.0, 2.0]]),), 0.5)
  np.testing.assert_allclose(w2, [[0.188770, 0.0]], atol=1e-6)


def test_ala_stop_rule():
  flat = jnp.full((10,), 1.0)
  assert not bool(ala.converged(flat, 10, 10, 0.1))      # needs more than `window` losses
  assert bool(ala.converged(flat, 11, 10, 0.1))
  spread = jnp.array([1.0, 1.5] * 5)                     # population std 0.25
  assert not bool(ala.converged(spread, 30, 10, 0.1))
  assert bool(ala.converged(spread, 30, 10, 0.3))


def test_top_layers_are_the_head_then_the_layer_below():
  module = registry.get_model('mlp@0.25', num_classes=10, input_shape=(8, 8, 1))
  x = jnp.zeros((1, 8, 8, 1))
  params = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), x))['params']
  paths = ala.leaf_paths(params)
  one = ala.top_layers(module, x, params, 1)
  two = ala.top_layers(module, x, params, 2)
  assert sorted(paths[i] for i in one) == [('Dense_2', 'bias'), ('Dense_2', 'kernel')]
  assert sorted(paths[i][0] for i in two) == ['Dense_1', 'Dense_1', 'Dense_2', 'Dense_2']


def test_round_initialisation_mixes_top_takes_global_below_keeps_the_rest():
  # Three clients, a two-leaf "model": leaf 0 is a lower layer, leaf 1 the top layer.
  cohort = ModelState(params={'a': jnp.array([[1.0], [2.0], [3.0]]),
                              'b': jnp.array([[10.0], [20.0], [30.0]])},
                      batch_stats={'m': jnp.array([[7.0], [8.0], [9.0]])}, opt_state={})
  server = ModelState(params={'a': jnp.array([[0.0]]), 'b': jnp.array([[0.0]])},
                      batch_stats={'m': jnp.array([[-1.0]])}, opt_state={})
  top = (1,)                                           # leaves: a (0), b (1)
  mixed = (jnp.array([[11.0], [22.0], [33.0]]),)
  use_ala = jnp.array([True, False, False])
  fresh = jnp.array([False, True, False])
  out = fedala._initialise(cohort, server, use_ala, fresh, mixed, top=top)
  np.testing.assert_array_equal(out.params['a'][:, 0], [0.0, 0.0, 3.0])    # lower: global
  np.testing.assert_array_equal(out.params['b'][:, 0], [11.0, 0.0, 30.0])  # top: ALA / global
  np.testing.assert_array_equal(out.batch_stats['m'][:, 0], [7.0, -1.0, 9.0])


# ------------------------------------------------------------------- KT-pFL
C3 = np.array([[0.5, 0.3, 0.2], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]], np.float32)
S3 = np.array([[[0.9, 0.1]], [[0.2, 0.8]], [[0.5, 0.5]]], np.float32)   # [3 clients, 1, 2]


def test_personalised_targets_by_hand():
  # t_0 = 0.5 [.9 .1] + 0.3 [.2 .8] + 0.2 [.5 .5] = [0.61, 0.39]
  # t_1 = 0.1 [.9 .1] + 0.8 [.2 .8] + 0.1 [.5 .5] = [0.30, 0.70]
  # t_2 = 0.2 [.9 .1] + 0.2 [.2 .8] + 0.6 [.5 .5] = [0.52, 0.48]
  t = knowledge_coeff.personalised_targets(C3, S3, jnp.ones(3, bool))
  np.testing.assert_allclose(t[:, 0], [[0.61, 0.39], [0.30, 0.70], [0.52, 0.48]], atol=1e-6)
  # Client 1 absent: rows renormalised over {0, 2}: t_0 = (0.5 s_0 + 0.2 s_2) / 0.7
  # = [0.55, 0.15] / 0.7; t_2 = (0.2 s_0 + 0.6 s_2) / 0.8 = [0.48, 0.32] / 0.8; t_1 = 0.
  t = knowledge_coeff.personalised_targets(C3, S3, jnp.array([True, False, True]))
  np.testing.assert_allclose(t[:, 0], [[0.55 / 0.7, 0.15 / 0.7], [0, 0], [0.6, 0.4]],
                             atol=1e-6)


def test_simplex_projection_by_hand():
  # v = [0.6, 0.6, -0.2] onto {x >= 0, sum 1}: support {0, 1}, tau = (1.2 - 1) / 2 = 0.1.
  v = jnp.array([[0.6, 0.6, -0.2], [0.3, 9.0, 0.3]])
  mask = jnp.array([[True, True, True], [True, False, True]])
  out = knowledge_coeff.project_simplex(v, mask, jnp.array([1.0, 0.5]))
  np.testing.assert_allclose(out, [[0.5, 0.5, 0.0], [0.25, 9.0, 0.25]], atol=1e-6)


def _np_project(v, z):
  """Duchi et al. (2008), Fig. 1: projection of v onto {x >= 0, sum x = z}."""
  u = np.sort(v)[::-1]
  css = np.cumsum(u)
  rho = max(j for j in range(1, len(u) + 1) if u[j - 1] - (css[j - 1] - z) / j > 0)
  return np.maximum(v - (css[rho - 1] - z) / rho, 0.0)


def _np_grad(c_row, s, i, lam, rho, population, paper=True):
  """The gradient of row i of lam sum_n mean_x KL(t_n || s_n) + rho ||c - 1/N||^2, with
  t_n = sum_m c_nm s_m / mass_n. The paper's (``paper``), the row's mass held fixed:
  lam mean_x sum_j s_mj (log t_nj + 1 - log s_nj) / mass_n + 2 rho (c_nm - 1/N). Through the
  renormalisation as well: s_mj becomes s_mj - t_nj, the same less a constant over m."""
  mass = c_row.sum()
  t = np.einsum('m,mxc->xc', c_row, s) / mass
  return np.array([lam * np.mean(np.sum((s[m] - (0 if paper else t))
                                        * (np.log(t) + 1 - np.log(s[i])), -1)) / mass
                   + 2 * rho * (c_row[m] - 1.0 / population) for m in range(len(c_row))])


def _np_step(c, s, lam, rho, lr, normalize, paper=True):
  """The step of c, transcribed, on the gradient of :func:`_np_grad`."""
  c = c.astype(np.float64)
  s = s.astype(np.float64)
  n = c.shape[0]
  new = np.zeros_like(c)
  for i in range(n):
    mass = c[i].sum()
    g = _np_grad(c[i], s, i, lam, rho, n, paper)
    g = g - g.mean()   # along the row's constraint sum_m c_nm = mass
    if normalize:
      g = g / np.abs(g).sum()
    new[i] = _np_project(c[i] - lr * g, mass)
  return new


@pytest.mark.parametrize('normalize,lr', [(False, 0.3), (True, 0.1)])
def test_coefficient_step_matches_a_numpy_transcription(normalize, lr):
  s = np.random.default_rng(0).dirichlet(np.ones(4), size=(3, 5)).astype(np.float32)
  new, value = knowledge_coeff.coefficient_step(C3, s, jnp.ones(3, bool), 2.0, 0.7, lr, 3,
                                                normalize=normalize)
  want = _np_step(C3, s, 2.0, 0.7, lr, normalize)
  np.testing.assert_allclose(new, want, atol=2e-6)
  np.testing.assert_allclose(np.asarray(new).sum(1), 1.0, atol=1e-6)
  t = np.einsum('nm,mxc->nxc', C3.astype(np.float64), s)
  kl = np.sum(t * (np.log(t) - np.log(s)), -1).mean(-1).sum()
  np.testing.assert_allclose(value, 2.0 * kl + 0.7 * np.sum((C3 - 1 / 3) ** 2), rtol=1e-5)
  assert not np.allclose(new, C3)
  # The gradient through the renormalisation differs from the paper's by a constant per row,
  # which the centring removes: both give the same step, plain or normalised.
  other = _np_step(C3, s, 2.0, 0.7, lr, normalize, paper=False)
  np.testing.assert_allclose(other, want, atol=1e-9)
  # Normalised, a row moves by lr in L1 (no entry clipped at 0 here), whatever the size of
  # the constant the KL term's gradient carries in every entry (lam (1 + ...)).
  if normalize:
    np.testing.assert_allclose(np.abs(np.asarray(new, np.float64) - C3).sum(1), lr, rtol=1e-4)
    uncentred = np.stack([_np_project(C3[i] - lr * (lambda g: g / np.abs(g).sum())(
        _np_grad(C3[i].astype(np.float64), s.astype(np.float64), i, 2.0, 0.7, 3)), 1.0)
        for i in range(3)])
    assert np.abs(uncentred - C3).sum(1).max() < 0.5 * lr   # the step it used to take


def test_coefficient_step_leaves_absent_clients_and_keeps_row_mass():
  s = np.random.default_rng(1).dirichlet(np.ones(2), size=(3, 4)).astype(np.float32)
  mask = jnp.array([True, False, True])
  new, _ = knowledge_coeff.coefficient_step(C3, s, mask, 1.0, 0.7, 0.2, 3, normalize=True)
  new = np.asarray(new)
  np.testing.assert_array_equal(new[1], C3[1])           # the absent receiver's row
  np.testing.assert_array_equal(new[[0, 2], 1], C3[[0, 2], 1])   # the absent sender's column
  np.testing.assert_allclose(new[[0, 2]][:, [0, 2]].sum(1), C3[[0, 2]][:, [0, 2]].sum(1),
                             atol=1e-6)
  # On the block, the same step as the 2 x 2 problem with its rows' masses.
  block = C3[np.ix_([0, 2], [0, 2])]
  # (the regulariser's 1/N is the population's, 3, not the block's 2)
  want = np.stack([_np_project(
      block[i] - 0.2 * _grad_n3(block, s[[0, 2]], i), block[i].sum()) for i in range(2)])
  np.testing.assert_allclose(new[np.ix_([0, 2], [0, 2])], want, atol=2e-6)


def _grad_n3(block, s, i):
  g = _np_grad(block[i], s, i, 1.0, 0.7, 3)
  g = g - g.mean()
  return g / np.abs(g).sum()


def test_kd_loss_is_lambda_kl_at_temperature_by_hand():
  # z = [2, 0], T = 2: q = softmax([1, 0]) = [0.731059, 0.268941]; t = [0.5, 0.5]:
  # KL = 0.5 ln(0.5 / 0.731059) + 0.5 ln(0.5 / 0.268941) = 0.120114; lam = 3: 0.360342.
  out = kt_pfl._kd_loss(jnp.array([[2.0, 0.0]]), {'_pos': jnp.array([0])},
                        {'t': jnp.array([[0.5, 0.5]]), 'T': 2.0, 'lam': 3.0})
  np.testing.assert_allclose(out, [0.360342], atol=1e-5)


# --------------------------------------------------------------- end to end
@pytest.mark.slow   # builds an experiment
def test_bad_options_name_their_field():
  with pytest.raises(ConfigError, match=r'^fedala\.layers=9 .*\[1, 3\]'):
    experiment.build(config_lib.validate(tiny_config('fedala', rounds=1, **{
        'clients.models': ['mlp@0.25'], 'fedala.layers': 9})))
  with pytest.raises(ConfigError, match=r'^fedala\.percent='):
    config_lib.validate(tiny_config('fedala', rounds=1, **{'clients.models': ['mlp@0.25'],
                                                            'fedala.percent': 0}))
  with pytest.raises(ConfigError, match=r'^kt_pfl\.c_step='):
    config_lib.validate(tiny_config('kt_pfl', rounds=1, **{'kt_pfl.c_step': 'adam'}))
  with pytest.raises(ConfigError, match=r'num_public'):
    config_lib.validate(tiny_config('kt_pfl', rounds=1, **{'data.num_public': 0,
                                                            'distill.public_per_round': 1}))


def _run(tmp_path, c):
  workdir = str(tmp_path / 'run')
  summary = runner.run(config_lib.validate(c), workdir, progress=False, log=lambda s: None)
  return read_rows(workdir), summary


@pytest.mark.slow
def test_fedala_two_rounds_bytes_and_ala(tmp_path):
  c = tiny_config('fedala', rounds=2, **{'clients.models': ['mlp@0.25'],
                                         'data.per_client_test': True,
                                         'fedala.max_start_epochs': 15})
  exp = experiment.build(config_lib.validate(c))
  server = exp.algorithm.init().server
  elements = sum(x.size for x in jax.tree.leaves((server.params, server.batch_stats)))
  rows, summary = _run(tmp_path, c)
  k = 4
  # ACE-pFL's rules: float32, every receiver's copy counted. Setup: the initial model to all.
  assert summary['setup_bytes'] == k * elements * 4
  for r in rows:     # every client every round: K uploads, K downloads of the model
    assert r['up_bytes'] == k * elements * 4 and r['down_bytes'] == k * elements * 4
    assert 0.0 <= r['test_acc'] <= 1.0 and 0.0 <= r['global_test_acc'] <= 1.0
  assert rows[0]['ala_clients'] == 0                     # no local model yet: global init
  assert rows[1]['ala_clients'] == k
  assert 11 <= rows[1]['ala_epochs'] <= 15               # the first ALA call: to the stop rule


@pytest.mark.slow
def test_kt_pfl_two_rounds_two_architectures_bytes(tmp_path):
  c = tiny_config('kt_pfl', rounds=2, **{'data.per_client_test': True})
  assert len(set(c.clients.models)) == 2
  rows, summary = _run(tmp_path, c)
  k, m, classes = 4, 100, 10
  assert summary['setup_bytes'] == 0                     # acepfl rules: D0 not counted
  for r in rows:
    assert r['up_bytes'] == k * m * classes * 4          # C floats a public sample, each client
    assert r['down_bytes'] == k * m * classes * 4        # its own targets, each client
    assert 0.0 <= r['test_acc'] <= 1.0 and np.isfinite(r['c_loss'])
    assert 0.0 < r['c_self'] <= 1.0
