"""FedConcat (Diao, Li, He, AAAI 2024): the clustering, the per-cluster FedAvg, the
concatenated classifier's forward pass, its local step and FedAvg, checked by hand; and one
end-to-end run (2 encoder rounds + 1 classifier round) with its bytes counted by hand."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import fedconcat
from fedjax_kd.core.kernels import CohortKernels
from fedjax_kd.core.program import Rows
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import model_concat
from fedjax_kd.ops import param_aggregate


# ------------------------------------------------------------ clustering
def test_clusters_label_distributions_not_counts():
  # Distributions: [1,0,0] x2, [0,.5,.5] x2, [.1,0,.9] and [0,0,1]. In raw counts rows 4 and 5
  # (10 vs 30 samples) are far apart and rows 0 and 1 differ by 10; as distributions the three
  # pairs are the three clusters.
  counts = np.array([[10, 0, 0], [20, 0, 0], [0, 5, 5], [0, 8, 8], [1, 0, 9], [0, 0, 30]])
  labels = model_concat.cluster_label_distributions(counts, 3, seed=0)
  np.testing.assert_array_equal(labels, [0, 0, 1, 1, 2, 2])   # canonical: client 0 -> 0
  for seed in (1, 7):   # the optimum does not depend on the seed here
    np.testing.assert_array_equal(
        model_concat.cluster_label_distributions(counts, 3, seed=seed), labels)
  # Two clusters, by hand: {0, 1} | {2, 3, 4, 5} has SSE 0 + 0.465 (the second group around
  # its mean [.025, .25, .725]: 2 * 0.11375 + 0.09875 + 0.13875); the next best split,
  # {0, 1, 2} | {3, 4, 5}, costs 1.313.
  two = model_concat.cluster_label_distributions(counts, 2, seed=0)
  np.testing.assert_array_equal(two, [0, 0, 1, 1, 1, 1])
  # More clusters than distinct distributions: one cluster per distinct row.
  np.testing.assert_array_equal(
      model_concat.cluster_label_distributions(counts[:4], 4, seed=0), [0, 0, 1, 1])


# ------------------------------------------------------ per-cluster FedAvg
def test_gather_cluster_rows_puts_each_active_clients_cluster_model():
  stacked = {'a': jnp.arange(8.0).reshape(4, 2)}
  models = {'a': jnp.array([[100.0, 101.0], [200.0, 201.0]])}
  out = model_concat.gather_cluster_rows(stacked, models, jnp.array([1, 0, 1, 0]),
                                         jnp.array([True, True, False, True]))
  np.testing.assert_array_equal(out['a'], [[200, 201], [100, 101], [4, 5], [100, 101]])


def test_segment_weighted_average_by_hand():
  x = np.array([[1.0, 2.0], [5.0, 6.0], [-3.0, 4.0], [9.0, 9.0]])
  stacked = {'w': jnp.asarray(x), 'b': {'v': jnp.asarray(x[:, :1, None] * np.ones((4, 1, 3)))}}
  previous = {'w': jnp.array([[0.0, 0.0], [7.0, 8.0], [0.0, 0.0]]),
              'b': {'v': jnp.full((3, 1, 3), -1.0)}}
  weights = jnp.array([1.0, 3.0, 2.0, 0.0])   # client 3 inactive
  segments = jnp.array([0, 0, 2, 1])
  out = model_concat.segment_weighted_average(stacked, weights, segments, 3, previous)
  # cluster 0: (1 * [1, 2] + 3 * [5, 6]) / 4 = [4, 5]; cluster 1: no weight -> keeps [7, 8];
  # cluster 2: client 2 alone.
  np.testing.assert_allclose(out['w'], [[4.0, 5.0], [7.0, 8.0], [-3.0, 4.0]])
  np.testing.assert_allclose(out['b']['v'][:, 0, :], [[4.0] * 3, [-1.0] * 3, [-3.0] * 3])


# ------------------------------------------------- concatenated classifier
def test_concat_forward_by_hand():
  # C = 2 clusters, B = 1 sample, d = 2 features each; n = 2 classes.
  feats = jnp.array([[[1.0, 2.0]], [[3.0, -1.0]]])        # h_1 = [1, 2], h_2 = [3, -1]
  clf = {'w': jnp.array([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [1.0, -1.0]]),
         'b': jnp.array([0.5, -0.5])}
  # [1, 2, 3, -1] @ W = [1 + 0 + 6 - 1, 0 + 2 + 3 + 1] = [6, 6]; + b = [6.5, 5.5].
  np.testing.assert_allclose(model_concat.concat_logits(feats, clf), [[6.5, 5.5]])


def test_stacked_heads_give_the_sum_of_the_cluster_logits():
  rs = np.random.default_rng(0)
  kernels = rs.normal(size=(3, 4, 5)).astype(np.float32)    # C = 3, d = 4, n = 5
  biases = rs.normal(size=(3, 5)).astype(np.float32)
  feats = rs.normal(size=(3, 6, 4)).astype(np.float32)      # [C, B, d]
  clf = model_concat.stack_heads(kernels, biases)
  want = sum(np.asarray(feats[c]) @ np.asarray(kernels[c]) + np.asarray(biases[c])
             for c in range(3))
  np.testing.assert_allclose(model_concat.concat_logits(feats, clf), want, rtol=1e-5,
                             atol=1e-5)


def test_torch_linear_init_bounds():
  clf = model_concat.torch_linear_init(jax.random.PRNGKey(1), 16, 3)
  assert clf['w'].shape == (16, 3) and clf['b'].shape == (3,)
  for a in (clf['w'], clf['b']):
    assert float(jnp.max(jnp.abs(a))) <= 0.25 and float(jnp.std(a)) > 0.05   # 1/sqrt(16)


class _LinearEncoder(nn.Module):
  """A cluster model whose features are ``x @ params['m']`` (``m`` ``[3, width]``)."""
  width: int

  @nn.compact
  def __call__(self, x, train=False, mask=None, embed=False):
    del train, mask, embed   # (the features are the whole model)
    return x @ self.param('m', nn.initializers.zeros, (x.shape[-1], self.width))


def _train_classifier(encoders, clf, idx, n, keys, x, y, scale, *, lr, steps, batch_size):
  """Every client's run of the classifier program (the engine's kernel): ``(classifiers
  [S, ...], mean losses [S])``."""
  s = idx.shape[0]
  kernels = CohortKernels(_LinearEncoder(encoders.params['m'].shape[-1]),
                          {'train': optax.sgd(lr)})
  state = kernels.init(keys, (x.shape[-1],))
  _, out, loss = kernels.run(
      fedconcat.ClassifierTraining(steps, batch_size), state, jnp.arange(s, dtype=jnp.int32),
      jnp.ones(s, bool), keys, Rows({'x': x, 'y': y}, idx, n),
      shared={'encoders': encoders, 'classifier': clf, 'lr_scale': scale})
  return out, loss


def _softmax(z):
  e = np.exp(z - z.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_classifier_local_step_and_fedavg_by_hand():
  rs = np.random.default_rng(0)
  x = rs.normal(size=(7, 3)).astype(np.float32)      # 7 pooled samples of 3 inputs
  y = np.array([0, 1, 1, 0, 1, 0, 0])
  m = rs.normal(size=(2, 3, 2)).astype(np.float32)    # C = 2 encoders 3 -> 2
  encoders = fedconcat.ModelState(params={'m': jnp.asarray(m)}, batch_stats={}, opt_state=())
  clf = {'w': jnp.asarray(rs.normal(size=(4, 2)), jnp.float32),
         'b': jnp.asarray([0.1, -0.2], jnp.float32)}
  idx = np.array([[0, 1, 2, 0], [3, 4, 5, 6]], np.int32)   # client 0: 3 rows, client 1: 4
  n = np.array([3, 4], np.int32)
  lr, scale = 0.1, 0.5
  train = functools.partial(_train_classifier, lr=lr, steps=3, batch_size=4)
  local, loss = train(
      encoders, clf, jnp.asarray(idx), jnp.asarray(n), jax.random.split(jax.random.PRNGKey(2)),
      jnp.asarray(x), jnp.asarray(y), jnp.float32(scale))
  # One full batch per client (batch 4 >= n_k): one step of plain SGD at lr * scale on the
  # mean CE of the concatenated features [x m_1, x m_2].
  want_w, want_loss = [], []
  for k in range(2):
    rows = idx[k, :n[k]]
    f = np.concatenate([x[rows] @ m[0], x[rows] @ m[1]], axis=1)     # [n_k, 4]
    p = _softmax(f @ np.asarray(clf['w']) + np.asarray(clf['b']))
    onehot = np.eye(2)[y[rows]]
    want_loss.append(-np.mean(np.log(p[np.arange(len(rows)), y[rows]])))
    g = (p - onehot) / len(rows)
    want_w.append({'w': np.asarray(clf['w']) - lr * scale * f.T @ g,
                   'b': np.asarray(clf['b']) - lr * scale * g.sum(0)})
  for k in range(2):
    np.testing.assert_allclose(local['w'][k], want_w[k]['w'], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(local['b'][k], want_w[k]['b'], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  # FedAvg of the classifier with n_k weights: (3 w_0 + 4 w_1) / 7.
  avg = param_aggregate.weighted_average(local, jnp.asarray(n, jnp.float32))
  np.testing.assert_allclose(avg['w'][0], (3 * want_w[0]['w'] + 4 * want_w[1]['w']) / 7,
                             rtol=1e-5, atol=1e-6)


def test_classifier_steps_stop_at_the_end_of_the_epoch():
  x = jnp.eye(3, dtype=jnp.float32)
  encoders = fedconcat.ModelState(params={'m': jnp.ones((1, 3, 1))}, batch_stats={},
                                  opt_state=())
  clf = {'w': jnp.zeros((1, 2)), 'b': jnp.zeros((2,))}
  # Three clients on the same 3 rows holding 3, 2 and 0 of them; 5 steps of batch 1 asked.
  train = functools.partial(_train_classifier, lr=1.0, steps=5, batch_size=1)
  local, _ = train(encoders, clf, jnp.array([[0, 1, 2]] * 3), jnp.array([3, 2, 0]),
                   jax.random.split(jax.random.PRNGKey(0), 3), x, jnp.array([0, 0, 0]),
                   jnp.float32(1.0))
  # Every sample has the feature 1 and the label 0, so a step of SGD (lr 1) moves both w and
  # b by -(softmax(w + b) - e_0); the epoch holds n_k real batches: 3, 2 and no steps.
  def by_hand(steps):
    b = np.zeros(2)
    for _ in range(steps):
      b = b - (_softmax(2 * b) - np.array([1.0, 0.0]))
    return b
  for k, steps in enumerate((3, 2, 0)):
    np.testing.assert_allclose(local['b'][k], by_hand(steps), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(local['w'][k, 0], by_hand(steps), rtol=1e-5, atol=1e-6)
  assert by_hand(3)[0] == pytest.approx(0.6966, abs=1e-3)   # 0.5, 0.6192, 0.6966


# --------------------------------------------------------------- options
def _tiny(rounds=3, **overrides):
  from tests.test_fedentopt import fe_tiny   # pylint: disable=g-import-not-at-top
  return fe_tiny('fedconcat', selection='uniform', rounds=rounds, **overrides)


def test_options_resolve_and_bad_values_name_the_field():
  o = fedconcat.FedConcatOptions()
  # FedEntOpt's 480 encoder rounds, then 500 classifier rounds; 60 rounds: 29.4 -> 29.
  assert (o.clusters, o.resolved_encoder_rounds(980)) == (5, 480)
  assert [o.resolved_encoder_rounds(r) for r in (1, 2, 3, 25, 60)] == [1, 1, 1, 12, 29]
  assert dataclasses.replace(o, encoder_rounds=7).resolved_encoder_rounds(500) == 7
  for field, value in (('fedconcat.clusters', 0), ('fedconcat.encoder_rounds', 4),
                       ('fedconcat.classifier_init', 'normal'),
                       ('fedconcat.encoder_share', 0.0)):
    with pytest.raises(ConfigError) as e:
      config_lib.validate(_tiny(**{field: value}))
    assert str(e.value).startswith(f'{field}=')
  with pytest.raises(ConfigError, match='clients.models'):
    config_lib.validate(_tiny(**{'clients.models': ['mlp@0.25', 'mlp@0.5']}))


# ------------------------------------------------------------ end to end
@pytest.mark.slow
def test_two_encoder_rounds_then_one_classifier_round(tmp_path):
  from fedjax_kd.running import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import base   # pylint: disable=g-import-not-at-top
  from tests.test_fedcache2 import run   # pylint: disable=g-import-not-at-top
  k, classes = 20, 10
  c = _tiny(rounds=3, **{'fedconcat.encoder_rounds': 2, 'fedconcat.clusters': 3})
  spec = config_lib.validate(c)
  exp = experiment.build(spec)
  algo = exp.algorithm
  assign = algo.assign
  np.testing.assert_array_equal(assign, model_concat.cluster_label_distributions(
      exp.ctx.data.client_labels(), 3, spec.seed))
  # Model sizes by hand: mlp@0.25 on 8x8 digits is 64 -> 50 -> 50 -> 10.
  model = (64 * 50 + 50) + (50 * 50 + 50) + (50 * 10 + 10)
  encoder, d = model - (50 * 10 + 10), 50
  assert (algo.model_elements, algo.encoder_elements, algo.feature_dim) == (model, encoder, d)
  clf = (3 * d + 1) * classes

  # Round 1 by hand: every cluster model is the n_k-weighted mean of its active clients'.
  st = algo.init()
  active = exp.ctx.selector.plan(1).active
  st1, out = base.play_round(algo, st, 1, active)
  n = exp.ctx.data.client_n
  for cl in range(3):
    members = np.flatnonzero(active & (assign == cl))
    for got, before, trained in zip(jax.tree.leaves(st1.extra.models.params),
                                    jax.tree.leaves(st.extra.models.params),
                                    jax.tree.leaves(st1.clients[0].params)):
      want = (np.asarray(before[cl]) if not len(members) else
              np.tensordot(n[members] / n[members].sum(), np.asarray(trained)[members], 1))
      np.testing.assert_allclose(got[cl], want, rtol=1e-5, atol=1e-6)

  rows, summary = run(tmp_path, c)
  assert [r['scored_model'] for r in rows] == [0, 0, 1]
  assert all(r['participants'] == 5 for r in rows)
  assert summary['setup_bytes'] == model * 4 + k * classes * 4   # initial model + counts
  for t in (1, 2):
    act = exp.ctx.selector.plan(t).active
    clusters = len(set(assign[act]))
    assert rows[t - 1]['clusters_trained'] == clusters
    assert rows[t - 1]['up_bytes'] == 5 * model * 4
    assert rows[t - 1]['down_bytes'] == clusters * model * 4   # one multicast per cluster
    assert rows[t - 1]['test_acc'] == pytest.approx(rows[t - 1]['cluster_acc_mean'])
  r3 = rows[2]
  assert r3['up_bytes'] == 5 * clf * 4
  assert r3['down_bytes'] == clf * 4 + 3 * encoder * 4     # + the frozen encoders, once
  assert 0.0 <= r3['test_acc'] <= 1.0 and np.isfinite(r3['train_loss'])
  assert r3['cluster_acc_mean'] == pytest.approx(rows[1]['cluster_acc_mean'])   # frozen


@pytest.mark.slow
def test_host_store_and_resume_give_the_device_run(tmp_path):
  from fedjax_kd import runner   # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from tests.test_store import _rows_close, _spec   # pylint: disable=g-import-not-at-top
  over = {'fedconcat.encoder_rounds': 2, 'fedconcat.clusters': 3}
  rows = {}
  for store in ('device', 'host'):
    wd = str(tmp_path / store)
    runner.run(_spec('fedconcat', store, **over), wd, resume=False, progress=False)
    rows[store] = workdir_lib.read_metrics(wd)
  _rows_close(rows['device'], rows['host'])
  # Stopped after the encoder phase and resumed: the same classifier round.
  wd = str(tmp_path / 'resumed')
  runner.run(_spec('fedconcat', 'device', rounds=2, **over, **{'checkpoint.every': 1}), wd,
             resume=False, progress=False)
  runner.run(_spec('fedconcat', 'device', rounds=3, **over, **{'checkpoint.every': 1}), wd,
             resume=True, progress=False)
  _rows_close(rows['device'], workdir_lib.read_metrics(wd))


@pytest.mark.slow
def test_label_counts_are_uploaded_once_with_fedentopt_selection():
  from fedjax_kd.running import experiment  # pylint: disable=g-import-not-at-top
  from tests.test_fedentopt import fe_tiny   # pylint: disable=g-import-not-at-top
  for selection in ('fedentopt', 'uniform'):
    exp = experiment.build(config_lib.validate(fe_tiny('fedconcat', selection=selection)))
    payloads = exp.algorithm.setup_payloads() + exp.ctx.selector.setup_payloads()
    assert [p.name for p in payloads].count('label_counts') == 1, selection
