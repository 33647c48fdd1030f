"""SCDPFL (spectral co-distillation) and FedDF (ensemble distillation for model fusion).

Quick tier: the weight spectra, the spectral KL and SCDPFL's objective on 2x2 / 3x2 /
1x2 matrices worked out by hand; FedDF's ensemble target, its tempered KD loss and the
per-group average on tiny arrays. Slow tier: 2-round runs with the bytes computed by hand,
and SCDPFL with both spectral weights at 0 against FedAvg.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import base
from fedjax_kd.core.state import num_elements
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import fusion, spectral
from fedjax_kd.running import experiment
from tests.shared import tiny_config
from tests.test_fedcache2 import run

R3 = math.sqrt(3.0)


def dense(w):
  """A one-layer parameter tree with a Flax Dense kernel ``[in, out]`` and a bias."""
  w = jnp.asarray(w, jnp.float32)
  return {'Dense_0': {'kernel': w, 'bias': jnp.full((w.shape[1],), 7.0)}}


# ------------------------------------------------------------ the spectra
def test_spectrum_of_a_2x2_kernel_by_hand():
  # Flax kernel [[1, 2], [3, 4]] ([in, out]) is PyTorch's [[1, 3], [2, 4]] ([out, in]).
  # 2-D DFT of [[a, b], [c, d]]: [[a+b+c+d, a-b+c-d], [a+b-c-d, a-b-c+d]]
  #   = [[10, 1-3+2-4], [1+3-2-4, 1-3-2+4]] = [[10, -4], [-2, 0]]; magnitudes row-major:
  s = spectral.weight_spectrum(dense([[1, 2], [3, 4]]))
  np.testing.assert_allclose(s, [10, 4, 2, 0], atol=1e-5)      # the bias (7s) is not a weight
  # ratio 0.5 keeps floor(0.5 * 4) = 2 entries.
  np.testing.assert_allclose(spectral.weight_spectrum(dense([[1, 2], [3, 4]]), 0.5), [10, 4],
                             atol=1e-5)


def test_spectrum_of_a_3x2_kernel_by_hand():
  # PyTorch layout [out=3, in=2] = [[1, 0], [2, 0], [0, 0]] (Flax kernel: its transpose).
  # Axis 0, column 0 = [1, 2, 0]: X_k = 1 + 2 w^k, w = exp(-2 pi i / 3):
  #   X_0 = 3, X_1 = 1 + 2(-1/2 - i sqrt3/2) = -i sqrt3, X_2 = +i sqrt3; column 1 is 0.
  # Axis 1 (length 2) of [X_k, 0] is [X_k, X_k]: magnitudes [[3, 3], [r3, r3], [r3, r3]].
  torch_layout = np.array([[1, 0], [2, 0], [0, 0]], np.float32)
  s = spectral.weight_spectrum(dense(torch_layout.T))
  np.testing.assert_allclose(s, [3, 3, R3, R3, R3, R3], atol=1e-5)
  # ratio 0.5 keeps floor(3) = 3; ratio 0.3 keeps floor(1.8) = 1; 0.3 * 10 stays 3.
  np.testing.assert_allclose(spectral.weight_spectrum(dense(torch_layout.T), 0.5), [3, 3, R3],
                             atol=1e-5)
  np.testing.assert_allclose(spectral.weight_spectrum(dense(torch_layout.T), 0.3), [3],
                             atol=1e-5)
  assert spectral.keep_count(10, 0.3) == 3 and spectral.keep_count(2, 0.1) == 1


def test_conv_kernel_and_norm_scale_layouts():
  # Conv kernel [kh=1, kw=2, in=1, out=1] = [1, 2] along kw: PyTorch [1, 1, 1, 2] -> the
  # matrix [[1, 2]]; 2-D DFT [[3, -1]] -> [3, 1]. A BatchNorm scale [1, 1] -> 1-D DFT [2, 0].
  # Tree order: BatchNorm_0 before Conv_0; BN bias and conv bias are not weights.
  params = {'Conv_0': {'kernel': jnp.asarray([1.0, 2.0]).reshape(1, 2, 1, 1),
                       'bias': jnp.ones((1,))},
            'BatchNorm_0': {'scale': jnp.ones((2,)), 'bias': jnp.full((2,), 3.0)}}
  np.testing.assert_allclose(spectral.weight_spectrum(params), [2, 0, 3, 1], atol=1e-5)


def test_spectral_kl_by_hand_and_its_gradient():
  teacher = dense([[1, 2], [3, 4]])     # |F| = [10, 4, 2, 0] -> q = [.625, .25, .125, 0]
  student = dense([[2, 0], [0, 0]])     # |F| = [2, 2, 2, 2]  -> p = [.25] * 4
  # KL(q || p) = .625 ln(2.5) + .25 ln(1) + .125 ln(.5) + 0 = 0.572682 - 0.086643
  expected = 0.625 * math.log(2.5) + 0.125 * math.log(0.5)
  assert abs(expected - 0.486039) < 1e-6
  np.testing.assert_allclose(spectral.spectral_distance(student, teacher), expected, atol=1e-5)
  q = spectral.spectral_distribution(teacher)
  np.testing.assert_allclose(q, [0.625, 0.25, 0.125, 0], atol=1e-6)
  np.testing.assert_allclose(spectral.spectral_kl(q, student), expected, atol=1e-5)
  # Scale-free: a teacher twice the student has the same spectrum shape, KL 0.
  np.testing.assert_allclose(
      spectral.spectral_distance(student, dense([[4, 0], [0, 0]])), 0.0, atol=1e-6)
  # Gradients reach the student (finite, not zero), also at its zero DFT coefficient.
  g = jax.grad(lambda p: spectral.spectral_kl(q, p))(dense([[1, 0], [0, 1]]))
  k = np.asarray(g['Dense_0']['kernel'])
  assert np.all(np.isfinite(k)) and np.abs(k).sum() > 1e-3
  np.testing.assert_array_equal(g['Dense_0']['bias'], 0)


def test_stacked_distributions_match_one_by_one():
  a, b = dense([[1, 2], [3, 4]]), dense([[2, 0], [0, 0]])
  stacked = jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)
  rows = spectral.stacked_distributions(stacked, 0.5)   # keeps [F00, F01], renormalised
  np.testing.assert_allclose(rows, [[10 / 14, 4 / 14], [0.5, 0.5]], atol=1e-6)


def test_scdpfl_objective_on_tiny_arrays():
  from fedjax_kd.algorithms.scdpfl import spectral_objective
  logits = jnp.asarray([[0.0, 0.0], [math.log(3.0), 0.0]])
  y = jnp.asarray([0, 1])
  # CE: sample 1 ln 2 = 0.693147; sample 2 softmax [.75, .25] -> -ln .25 = 1.386294;
  # mean 1.039721. Spectral term 0.4 * 0.486039 (previous test) = 0.194416.
  q = spectral.spectral_distribution(dense([[1, 2], [3, 4]]))
  got = spectral_objective(logits, y, dense([[2, 0], [0, 0]]), q, 0.4, 1.0)
  np.testing.assert_allclose(got, 1.039721 + 0.4 * 0.486039, atol=1e-5)
  # lambda = 0 is plain cross-entropy.
  np.testing.assert_allclose(spectral_objective(logits, y, dense([[2, 0], [0, 0]]), q, 0.0, 1.0),
                             1.039721, atol=1e-5)


# ------------------------------------------------------------------- FedDF
def test_feddf_ensemble_target_two_clients_two_samples():
  # Client 0 logits [[1, 0], [0, 2]], client 1 [[3, 0], [0, 0]], client 2 inactive (ignored).
  # Mean over the two active: [[2, 0], [0, 1]].
  z = jnp.asarray([[[1.0, 0], [0, 2]], [[3.0, 0], [0, 0]], [[100.0, 0], [0, 100]]])
  t = fusion.ensemble_logits(z, jnp.asarray([True, True, False]))
  np.testing.assert_allclose(t, [[2, 0], [0, 1]], atol=1e-6)
  # Log-probabilities instead of logits give the same softmax target.
  tl = fusion.ensemble_logits(jax.nn.log_softmax(z, -1), jnp.asarray([True, True, False]))
  np.testing.assert_allclose(jax.nn.softmax(tl, -1), jax.nn.softmax(t, -1), atol=1e-6)


def test_feddf_tempered_kd_loss_by_hand():
  # Teacher logits [2, 0] at T = 2: q = softmax([1, 0]) = [e/(e+1), 1/(e+1)] = [.731059, .268941].
  # Student logits [0, 0]: p = [.5, .5]. KL = .731059 ln(1.462117) + .268941 ln(.537883)
  #   = .731059 * .379885 - .268941 * .620115 = .277719 - .166774 = .110944; times T^2 = 4:
  #   .443776.
  e = math.e
  q = np.array([e / (e + 1), 1 / (e + 1)])
  kl = float(np.sum(q * np.log(q / 0.5)))
  assert abs(kl - 0.110944) < 1e-5
  loss = fusion.TemperedKD(2.0)(jnp.zeros((1, 2)), {'t': jnp.asarray([[2.0, 0.0]])}, {})
  np.testing.assert_allclose(loss, [0.443776], atol=1e-5)
  # Zero when the student matches the teacher.
  np.testing.assert_allclose(fusion.kd_loss(jnp.asarray([[2.0, 0]]), jnp.asarray([[2.0, 0]]), 1.0),
                             [0.0], atol=1e-6)


def test_feddf_per_group_average():
  # Group A: rows [1, 1] and [3, 5] with n = 10, 30, both active -> (10*[1,1] + 30*[3,5]) / 40
  #   = [2.5, 4]. Group B (another shape): rows 2, 4, 8 with n = 5, 5, 5, the middle one
  # inactive -> (2 + 8) / 2 = 5.
  a = {'w': jnp.asarray([[1.0, 1.0], [3.0, 5.0]])}
  b = {'w': jnp.asarray([[[2.0]], [[4.0]], [[8.0]]])}
  ga = fusion.group_average(a, jnp.asarray([10.0, 30.0]))
  gb = fusion.group_average(b, jnp.asarray([5.0, 0.0, 5.0]))
  np.testing.assert_allclose(ga['w'], [[2.5, 4.0]])
  np.testing.assert_allclose(gb['w'], [[[5.0]]])


def test_scdpfl_refuses_two_architectures_and_feddf_options_are_checked():
  c = tiny_config('scdpfl', rounds=1)   # two MLP widths
  with pytest.raises(ConfigError) as e:
    config_lib.validate(c)
  assert str(e.value).startswith('clients.models=')
  with pytest.raises(ConfigError) as e:
    config_lib.validate(tiny_config('scdpfl', rounds=1, **{'clients.models': ['mlp@0.25'],
                                                           'scdpfl.ratio': 0.0}))
  assert str(e.value).startswith('scdpfl.ratio=')
  with pytest.raises(ConfigError) as e:
    config_lib.validate(tiny_config('feddf', rounds=1, **{'feddf.temperature': 0.0}))
  assert str(e.value).startswith('feddf.temperature=')


# ---------------------------------------------------------------- end to end
def _scdpfl_tiny(rounds=2, **kw):
  return tiny_config('scdpfl', rounds=rounds, **{'clients.models': ['mlp@0.25'],
                                                 'data.per_client_test': True,
                                                 'checkpoint.every': 0, **kw})


@pytest.mark.slow
def test_scdpfl_two_rounds_bytes_by_hand(tmp_path):
  c = _scdpfl_tiny()
  rows, summary = run(tmp_path, c)
  exp = experiment.build(config_lib.validate(c))
  server = exp.algorithm.init().server
  e = num_elements(server.params) + num_elements(server.batch_stats)   # one GM copy
  k = 4                                                                # all active
  # fedcache2 rules (App. D: float32 models; a multicast counted once): the initial GM once,
  # then per round K uploads of the GM copy and one multicast of the average.
  assert summary['comm_rules'] == 'fedcache2'
  assert summary['setup_bytes'] == e * 4
  for r in rows:
    assert r['up_bytes'] == k * e * 4 and r['down_bytes'] == e * 4
    assert 0 <= r['test_acc'] <= 1 and 0 <= r['global_acc'] <= 1 and 0 <= r['server_ua'] <= 1
    assert np.isfinite(r['train_loss']) and np.isfinite(r['pm_train_loss'])
  assert summary['cum_bytes'] == e * 4 + 2 * (k + 1) * e * 4


@pytest.mark.slow
def test_scdpfl_without_spectral_terms_trains_the_gm_as_fedavg():
  # lambda_g = lambda_l = 0 and a fresh optimizer: the GM step is FedAvg's round exactly
  # (same keys, the same training program, run through SCDPFL's own training path).
  kw = {'scdpfl.lambda_g': 0.0, 'scdpfl.lambda_l': 0.0, 'train.fresh_optimizer': True}

  def after_one_round(algo, **extra):
    c = _scdpfl_tiny(rounds=1, **{**kw, **extra})
    c.algorithm = algo
    exp = experiment.build(config_lib.validate(c))
    st = exp.algorithm.init()
    st, _ = base.play_round(exp.algorithm, st, 1, np.ones(4, bool))
    return st

  avg = after_one_round('fedavg')
  sc = after_one_round('scdpfl')
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6),
               avg.server.params, sc.server.params)
  # With lambda_g > 0 the GM moves differently.
  sc2 = after_one_round('scdpfl', **{'scdpfl.lambda_g': 5.0})
  assert not np.allclose(jax.tree.leaves(sc2.server.params)[0],
                         jax.tree.leaves(sc.server.params)[0], atol=1e-6)


@pytest.mark.slow
def test_feddf_two_architectures_two_rounds_bytes_by_hand(tmp_path):
  models = ['mlp@0.25', 'mlp@0.5']
  c = tiny_config('feddf', rounds=2, **{'clients.models': models,
                                        'data.per_client_test': True,
                                        'checkpoint.every': 0})
  rows, summary = run(tmp_path, c)
  exp = experiment.build(config_lib.validate(c))
  st = exp.algorithm.init()
  sizes = [num_elements(m.params) + num_elements(m.batch_stats) for m in st.extra.models]
  assert sizes[0] < sizes[1]
  members = [int(np.sum(np.asarray(exp.ctx.fed.client_models) == m)) for m in models]
  assert sum(members) == 4 and min(members) >= 1
  # acepfl rules: float32, every receiver counted; the server keeps the public set.
  per_round = sum(n * s * 4 for n, s in zip(members, sizes))
  assert summary['comm_rules'] == 'acepfl' and summary['setup_bytes'] == 0
  for r in rows:
    assert r['up_bytes'] == per_round and r['down_bytes'] == per_round
    assert 0 <= r['test_acc'] <= 1 and np.isfinite(r['distill_loss'])
    assert {'global_acc_0', 'global_acc_1', 'global_acc'} <= set(r)
  assert summary['cum_bytes'] == 2 * 2 * per_round
