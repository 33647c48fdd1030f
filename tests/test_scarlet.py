"""SCARLET and its baselines (CFD, COMET, Selective-FD) end to end, with byte counts by hand."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.algorithms import base
from fedjax_kd.core.federation import SingleModel
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import aggregate, comm
from fedjax_kd.running import experiment
from tests.conftest import shipped_config
from tests.shared import tiny_config
from tests.test_main import read_rows

C = 10      # synthetic data has 10 classes
K = 4
N = 100     # public samples per round


def scarlet_tiny(algorithm='scarlet', rounds=4, **overrides):
  c = tiny_config(algorithm if algorithm != 'scarlet' else 'dsfl', rounds)
  c.algorithm = algorithm
  c.comm.rules = 'scarlet'
  c.cache.duration = 1
  return config_lib.override(c, overrides)


def run(tmp_path, c, name='run'):
  workdir = os.path.join(tmp_path, name)
  runner.run(config_lib.validate(c), workdir, progress=False, log=lambda s: None)
  return read_rows(workdir)


@pytest.mark.parametrize('p,beta,want', [
    ([0.45, 0.55], 2.0, [0.400990, 0.599010]),
    ([0.45, 0.55], 1.25, [0.437617, 0.562383]),
    ([0.1, 0.9], 2.0, [0.012195, 0.987805]),
    ([0.2, 0.3, 0.5], 2.0, [0.105263, 0.236842, 0.657895]),
])
def test_enhanced_era_spec_vectors(p, beta, want):
  np.testing.assert_allclose(aggregate.power_sharpen(jnp.asarray(p), beta), want, atol=1e-6)


def test_enhanced_era_entropy_decreases_in_beta():
  p = jnp.asarray([0.2, 0.3, 0.5])
  h = [float(aggregate.entropy(aggregate.power_sharpen(p, b))) for b in (1.0, 1.25, 1.5, 2, 3)]
  assert all(a > b for a, b in zip(h, h[1:]))


def test_scarlet_bytes_match_the_authors_accounting(tmp_path, monkeypatch):
  monkeypatch.setenv('FEDJAX_KD_DEBUG', '1')   # asserts client caches == server labels
  rows = run(tmp_path, scarlet_tiny(rounds=5))
  assert rows[0]['n_newly_cached'] == N and rows[0]['requested'] == N
  assert any(r['n_cached'] > 0 for r in rows) and any(r['n_expired'] > 0 for r in rows)
  prev_m = None
  for r in rows:
    m = r['requested']
    assert m == r['n_newly_cached'] + r['n_expired']
    assert r['up_bytes'] == K * m * (4 * C + 8)                 # z_k and I_req, int64
    down = 8 * m                                                # I_req^r
    if prev_m is not None:                                      # zhat_req, I^{r-1}, gamma
      down += 4 * C * prev_m + 16 * N
    assert r['down_bytes'] == K * down, r['round']
    assert r['hit_ratio'] == pytest.approx(r['n_cached'] / N)
    prev_m = m
  summary = json.loads(open(os.path.join(tmp_path, 'run', 'summary.json')).read())
  assert summary['setup_bytes'] == 0          # the public-set download is excluded


def test_minimal_rules_use_int32_indices_and_2bit_signals(tmp_path):
  rows = run(tmp_path, scarlet_tiny(rounds=2, **{'comm.rules': 'minimal'}))
  m0, m1 = rows[0]['requested'], rows[1]['requested']
  assert rows[1]['up_bytes'] == K * m1 * (4 * C + 4)
  # multicast counted once: labels, indices, 2-bit signals, request
  assert rows[1]['down_bytes'] == 4 * C * m0 + 4 * N + N // 4 + 4 * m1


@pytest.mark.slow
def test_dsfl_under_scarlet_rules_and_next_round_schedule(tmp_path):
  rows = run(tmp_path, scarlet_tiny('dsfl', rounds=2, **{'dsfl.schedule': 'next_round'}))
  assert rows[0]['down_bytes'] == K * 8 * N                     # first round: I^0 only
  assert rows[1]['down_bytes'] == K * N * (4 * C + 16)          # n(4N + 16) per client
  assert rows[1]['up_bytes'] == K * N * (4 * C + 8)
  assert 'distill_loss' not in rows[0] and 'distill_loss' in rows[1]


@pytest.mark.slow
def test_scarlet_with_huge_duration_requests_only_new_samples(tmp_path):
  rows = run(tmp_path, scarlet_tiny(rounds=3, **{'cache.duration': 1000,
                                                 'distill.public_per_round': 150}))
  # the public set is 150 samples, all drawn each round: cached after round 1
  assert [r['requested'] for r in rows] == [150, 0, 0]
  assert rows[2]['up_bytes'] == 0


@pytest.mark.slow
def test_partial_participation_counts_catch_up(tmp_path, monkeypatch):
  monkeypatch.setenv('FEDJAX_KD_DEBUG', '1')
  c = scarlet_tiny(rounds=6, **{'clients.participation': 0.5, 'cache.duration': 3})
  rows = run(tmp_path, c)
  assert all(r['participants'] == 2 for r in rows)
  catch = [r.get('catch_up_entries', 0) for r in rows]
  assert catch[0] == 0 and sum(catch) > 0
  full = run(tmp_path, scarlet_tiny(rounds=6, **{'cache.duration': 3}), 'full')
  assert 'catch_up_entries' not in full[-1]


@pytest.mark.slow
def test_scarlet_resume_equals_uninterrupted_run(tmp_path):
  c = scarlet_tiny(rounds=4, **{'checkpoint.every': 1})
  straight = run(tmp_path, c, 'straight')
  c2 = scarlet_tiny(rounds=2, **{'checkpoint.every': 1})
  run(tmp_path, c2, 'resumed')
  resumed = run(tmp_path, scarlet_tiny(rounds=4, **{'checkpoint.every': 1}), 'resumed')
  keys = ('test_acc', 'requested', 'n_cached', 'cum_bytes', 'distill_loss')
  assert [[r.get(k) for k in keys] for r in straight] == [[r.get(k) for k in keys]
                                                          for r in resumed]


@pytest.mark.slow
def test_cfd_uploads_hard_labels(tmp_path):
  rows = run(tmp_path, scarlet_tiny('cfd', rounds=2))
  assert rows[1]['up_bytes'] == K * N * 16                      # int64 label + int64 index
  assert rows[1]['down_bytes'] == K * N * (4 * C + 16)
  rows = run(tmp_path, scarlet_tiny('cfd', rounds=2, **{'comm.rules': 'minimal'}), 'min')
  assert rows[1]['up_bytes'] == K * N * 4 + K * N * 4 // 8     # int32 index + 4-bit label


@pytest.mark.slow
def test_cfd_with_cache_halves_uploads(tmp_path):
  rows = run(tmp_path, scarlet_tiny('cfd', rounds=3, **{'cache.mode': 'on',
                                                        'cache.duration': 10,
                                                        'distill.public_per_round': 150}))
  assert [r['requested'] for r in rows] == [150, 0, 0]


@pytest.mark.slow
def test_comet_downlink_counted_like_dsfl_under_full_participation(tmp_path):
  rows = run(tmp_path, scarlet_tiny('comet', rounds=2, **{'comet.clusters': 2,
                                                          'comet.weight': 0.5}))
  assert rows[1]['down_bytes'] == K * N * (4 * C + 16)
  assert np.isfinite(rows[1]['distill_loss'])


@pytest.mark.slow
def test_comet_with_cache_runs(tmp_path):
  rows = run(tmp_path, scarlet_tiny('comet', rounds=3, **{'cache.mode': 'on'}))
  assert rows[-1]['n_cached'] > 0 and np.isfinite(rows[-1]['test_acc'])


@pytest.mark.slow
def test_selective_fd_filters(tmp_path):
  rows = run(tmp_path, scarlet_tiny('selective_fd', rounds=2))
  frac = rows[1]['inlier_fraction']
  assert 0 < frac < 1
  assert rows[1]['up_bytes'] == round(frac * K * N) * (4 * C + 8)
  # a server threshold below any L1 distance keeps nothing: no distillation at all
  rows = run(tmp_path, scarlet_tiny('selective_fd', rounds=2,
                                    **{'selective_fd.tau_server': 1e-6}), 'none')
  assert rows[1]['labelled'] == 0 and rows[1]['server_distill_loss'] is None
  # tau_client = 0 keeps every sample at or above the lowest held-out ratio
  rows = run(tmp_path, scarlet_tiny('selective_fd', rounds=1,
                                    **{'selective_fd.tau_client': 0.0}), 'all')
  assert rows[0]['inlier_fraction'] > frac


def test_centralized_and_individual_run(tmp_path):
  rows = run(tmp_path, scarlet_tiny('centralized', rounds=2), 'c')
  assert rows[-1]['test_acc'] > 0.2 and rows[-1]['cum_bytes'] == 0
  rows = run(tmp_path, scarlet_tiny('individual', rounds=1, **{'data.per_client_test': True}),
             'i')
  assert rows[-1]['cum_bytes'] == 0


@pytest.mark.parametrize('field,value', [
    ('scarlet.beta', 0.0), ('scarlet.beta', -1.0), ('cache.duration', -1),
    ('cache.mode', 'sometimes'), ('distill.public_per_round', 151),
    ('comet.clusters', 0), ('selective_fd.tau_client', 1.5)])
def test_bad_scarlet_input(field, value):
  algorithm = field.split('.')[0] if field.split('.')[0] in ('comet', 'selective_fd') \
      else 'scarlet'
  c = scarlet_tiny(algorithm, **{field: value})
  with pytest.raises(ConfigError, match=field.replace('.', r'\.')):
    config_lib.validate(c)


def test_label_payload_bits():
  p = comm.Payload('hard', comm.UP, 'label', 100, classes=10)
  assert comm.payload_bytes(p, comm.RULES['scarlet']) == 800
  assert comm.payload_bytes(p, comm.RULES['minimal']) == 50
  p = comm.Payload('hard', comm.UP, 'label', 100, classes=100)
  assert comm.payload_bytes(p, comm.RULES['minimal']) == 88     # 7 bits


def test_every_shipped_config_validates():
  configs = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'configs')
  names = sorted(f[:-3] for f in os.listdir(configs)
                 if f.endswith('.py') and not f.startswith('_'))   # not the package's __init__
  assert 'scarlet_cifar10' in names and 'scarlet_digits' in names
  for name in names:
    config_lib.validate(shipped_config(name).get_config())


@pytest.mark.parametrize('alpha,beta,rounds', [('0.05', 2.0, 2000), ('0.3', 1.0, 3000)])
def test_scarlet_cifar10_is_the_papers_setting(alpha, beta, rounds):
  spec = config_lib.validate(shipped_config('scarlet_cifar10').get_config(alpha))
  assert spec.options.beta == beta and spec.rounds == rounds
  assert spec.options.cache.enabled and spec.options.cache.duration == 50
  assert (spec.clients.num_clients, spec.distill.public_per_round, spec.data.num_public) == (100, 1000, 10_000)
  assert set(spec.clients.models) == {'resnet20@1'} and spec.data.public_source == 'tfds:cifar100'
  assert spec.data.partition == 'client_dirichlet' and spec.data.alpha == float(alpha)
  assert (spec.train.epochs, spec.distill.epochs, spec.train.batch_size) == (5, 5, 100)
  assert spec.train.learning_rate == 0.1 and spec.clients.shared_init
  c100 = config_lib.validate(shipped_config('scarlet_cifar100').get_config())
  assert c100.options.beta == 1.25 and set(c100.clients.models) == {'resnet32@1'}


def test_shared_init_starts_every_client_and_the_server_from_one_model():
  """clients.shared_init: the authors' code builds one model and copies it to every client
  and to the server; without it each starts from its own draw."""
  for shared in (True, False):
    c = scarlet_tiny(rounds=1, **{'clients.models': ['mlp@0.25'], 'server.model': 'mlp@0.25',
                                  'clients.shared_init': shared})
    state = experiment.build(config_lib.validate(c)).algorithm.init()
    clients = jax.tree.leaves(state.clients[0].params)
    server = jax.tree.leaves(state.server.params)
    same_clients = all(np.array_equal(a[0], a[k]) for a in clients for k in range(1, K))
    same_server = all(np.array_equal(a[0], b[0]) for a, b in zip(clients, server))
    assert same_clients is shared and same_server is shared


def test_prediction_augmentation_is_per_client_and_optional():
  """Clients augment the public images they predict on with their own keys (as SCARLET's code)."""

  c = scarlet_tiny(rounds=1, **{'clients.models': ['mlp@0.25'], 'clients.shared_init': True,
                                'data.augment': 'flip_crop'})
  algo = experiment.build(config_lib.validate(c)).algorithm
  state = algo.init()
  x = algo.ctx.data.x_public[:20]
  active = np.ones(K, bool)
  r = base.round_input(algo, algo.ctx.fed, 1, active)
  aug = np.asarray(algo.predict_clients(state, r, x))
  assert not np.allclose(aug[0], aug[1])          # same weights, different augmentations
  np.testing.assert_array_equal(aug, np.asarray(algo.predict_clients(state, r, x)))
  algo.predict_augment = None
  clean = np.asarray(algo.predict_clients(state, r, x))
  np.testing.assert_allclose(clean[0], clean[1], atol=1e-6)
  assert not np.allclose(aug[0], clean[0])


def test_server_top5_accuracy_by_hand():
  class Identity(nn.Module):
    @nn.compact
    def __call__(self, x, train=False, mask=None):
      eye = lambda key, shape, dtype=jnp.float32: jnp.eye(*shape, dtype=dtype)
      return nn.Dense(6, use_bias=False, kernel_init=eye)(x)   # logits = x

  model = SingleModel(Identity(), {'train': optax.sgd(0.1)}, (6,))
  state = model.init(jax.random.PRNGKey(0))
  x = jnp.tile(jnp.asarray([[6., 5., 4., 3., 2., 1.]]), (3, 1))
  y = jnp.asarray([0, 4, 5])            # ranks 1, 5 and 6
  acc, _, acc5 = model.evaluate(state, x, y, chunk=2)
  assert acc == pytest.approx(1 / 3) and acc5 == pytest.approx(2 / 3)
