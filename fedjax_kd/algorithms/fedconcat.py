"""FedConcat: per-cluster FedAvg, then a linear classifier on the concatenated encoders.

Y. Diao, Q. Li, B. He, "Exploiting Label Skews in Federated Learning with Model
Concatenation", AAAI 2024 (code: github.com/sjtudyq/FedConcat, ``experiments.py``,
``alg == 'fedconcat'``); a baseline of FedEntOpt (Lutz et al., arXiv 2411.01240v2, §V-A:
"5 clusters, 480 rounds to train the encoder and 500 rounds to train the linear
classifier").

1. Clustering, once before training: every client uploads its label counts; the server
   runs k-means with ``fedconcat.clusters`` clusters on the label distributions
   ``counts_k / n_k`` (:func:`fedjax_kd.ops.model_concat.cluster_label_distributions`);
   ``C`` is at most the number of distinct distributions (so at most K): more clusters than
   that are not an error, they are fewer.
2. Encoder phase, rounds ``1..E``: one full model ``w_c`` per cluster (all start from the
   one initial draw FedAvg's global model starts from, as the authors copy one model). Each
   active client downloads its cluster's model, trains ``train.epochs`` epochs as in FedAvg,
   and uploads it; the server sets ``w_c = sum_{k in S_c} (n_k / n_{S_c}) w_k`` over the
   cluster's active clients (a cluster without one keeps its model).
3. Classifier phase, rounds ``E+1..R``: the cluster models are frozen; their penultimate
   features ``h_c(x)`` (``module.apply(..., embed=True)``, inference mode) are concatenated
   into ``[h_1(x), ..., h_C(x)]`` (``C d`` features) and a linear classifier ``(W, b)``
   on them is trained by FedAvg: every active client runs ``fedconcat.classifier_steps``
   minibatches of its private data (the authors' code: 3) from the global classifier and the
   server averages. The global model is the concatenated encoders plus the classifier.

Choices the paper leaves open, or that the engine needs:

* Round budget. The engine has one ``rounds``: the first ``E`` are the encoder phase and the
  rest the classifier phase, ``E = fedconcat.encoder_rounds`` or, when it is 0,
  ``round(fedconcat.encoder_share * rounds)`` clipped to ``[1, rounds - 1]``. FedEntOpt
  trains the encoders 480 rounds and then the classifier 500, so the default share is
  480 / 980 (a 60-round budget: 29 encoder rounds, then 31 classifier rounds) and
  ``rounds = 980`` is its literal budget. (Read as 480 of 500, a share of 0.96, the
  classifier of a 60-round run would get 2 rounds of 3 minibatches from its random start.)
* Participation. The round's participants (any selection) train their own cluster's model
  in the encoder phase (the authors sample the participants once over all clients, then
  run FedAvg inside each cluster on those it holds); all participants train the classifier.
* Weighting. Inside a cluster by ``n_k`` (FedEntOpt weights every baseline by data size).
  For the classifier the authors average uniformly ("we move 3 steps for all clients"):
  ``fedconcat.classifier_weighting`` (default ``'samples'``, FedEntOpt's rule).
* Classifier optimiser. The clients' ``train`` optimizer (SGD, momentum, coupled weight
  decay), a fresh state every round (the authors build a new optimiser each call), at
  ``fedconcat.classifier_lr`` (0: ``train.learning_rate``) times ``train.lr_decay ** (j - 1)``
  in the ``j``-th classifier round (the decay restarts with the phase; the authors use no
  decay). Minibatches of ``train.batch_size`` from one reshuffled epoch (fewer steps if the
  client has fewer batches); ``data.augment`` applies.
* Classifier start (``fedconcat.classifier_init``): ``'random'`` (default; the authors'
  fresh ``nn.Linear(C d, n)``: ``U(-1/sqrt(C d), 1/sqrt(C d))``), ``'zeros'``, or ``'concat'``
  (the authors' CIFAR-100 start: the clusters' final layers stacked, biases summed, so the
  first global model's logits are the sum of the cluster models').
* Frozen encoders run in inference mode (BatchNorm running statistics, no dropout).
* Not implemented: the authors' capacity-constrained k-means for CIFAR-100 and their
  Laplace noise on the label distributions (``--eps``).
* Evaluation. ``test_acc`` is the global model's accuracy in the classifier phase; in the
  encoder phase (no classifier yet) it is the mean over clusters of the cluster models'
  test accuracies. ``scored_model`` (:data:`fedjax_kd.metric_names.SCORED_MODEL`) says which a
  round scored (0: the cluster models, 1: the concatenated model);
  ``cluster_acc_{mean,min,max}`` are logged throughout. Summaries over rounds (best,
  last-10, rounds and bytes to a threshold) read only the concatenated model's rounds once
  it is scored, however short the classifier phase.

Bytes (4-byte floats under every rule set):

* setup: the initial model multicast to the K clients (one copy: every cluster starts from
  it) and K label-count vectors of ``num_classes`` floats up (not again when
  the client selection uploads the same vectors already, ``selection.method = 'fedentopt'``
  or ``'kl'``);
* encoder round: every participant uploads its model; each cluster with participants
  multicasts its model to them (one copy per cluster under ``multicast_once`` rules);
* the first classifier round: the ``C`` frozen encoders (the model less its final Dense
  layer) multicast once to all K clients;
* classifier round: the classifier (``C d n + n`` floats) down (multicast) and up per
  participant.

Requires one model spec for all clients (parameter averaging).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd import options
from fedjax_kd.metric_names import SCORED_MODEL
from fedjax_kd.algorithms import base
from fedjax_kd.core import rng
from fedjax_kd.core.program import Batches, Program, over_rows
from fedjax_kd.core.state import ModelState, num_elements
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm
from fedjax_kd.ops import model_concat
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops.losses import cross_entropy, masked_mean

Array = jax.Array
WEIGHTINGS = ('samples', 'uniform')
CLASSIFIER_INITS = ('random', 'zeros', 'concat')


# FedEntOpt's budget: "480 rounds to train the encoder and 500 rounds to train the linear
# classifier", two phases one after the other, so the encoders take 480 of 980 rounds.
PAPER_ENCODER_SHARE = 480 / (480 + 500)


@dataclasses.dataclass(frozen=True)
class FedConcatOptions:
  """``fedconcat.*``."""
  group: ClassVar[str] = 'fedconcat'
  clusters: int = options.option(5, 'k-means clusters of the label distributions '
                                 '(FedEntOpt: 5)', ge=1)
  encoder_rounds: int = options.option(0, 'rounds of the encoder phase; 0: '
                                       'round(encoder_share * rounds)', ge=0)
  encoder_share: float = options.option(PAPER_ENCODER_SHARE, 'the encoder phase share of the '
                                        'rounds when encoder_rounds is 0 (FedEntOpt: 480 '
                                        'encoder + 500 classifier rounds)', gt=0, le=1)
  classifier_lr: float = options.option(0.0, "the classifier's learning rate; 0: "
                                        'train.learning_rate', ge=0)
  classifier_steps: int = options.option(3, 'minibatches per participant per classifier '
                                         "round (the authors' code)", ge=1)
  classifier_weighting: str = options.option(
      'samples', "classifier FedAvg weights: 'samples' (n_k, FedEntOpt) or 'uniform' "
      "(the authors' code)", choices=WEIGHTINGS)
  classifier_init: str = options.option(
      'random', "the classifier's start: 'random' (nn.Linear's), 'zeros' or 'concat' (the "
      "clusters' heads stacked)", choices=CLASSIFIER_INITS)
  kmeans_init: int = options.option(10, 'k-means++ restarts of the clustering', ge=1)

  def validate(self, spec, algorithm) -> None:
    del algorithm
    if self.encoder_rounds > spec.rounds:
      raise ConfigError(f'{self.group}.encoder_rounds', self.encoder_rounds,
                        f'an integer in [0, {spec.rounds}] (at most rounds)')

  def resolved_encoder_rounds(self, rounds: int) -> int:
    """E: the explicit ``encoder_rounds``, or ``encoder_share`` of ``rounds`` in
    ``[1, rounds - 1]`` (``1`` when ``rounds`` is 1)."""
    if self.encoder_rounds:
      return int(self.encoder_rounds)
    return int(min(max(round(self.encoder_share * rounds), 1), max(rounds - 1, 1)))


@flax.struct.dataclass
class FedConcatServer:
  """The server's state.

  Attributes:
    models: the ``C`` cluster models (``ModelState`` with leaves ``[C, ...]``, no optimizer
      state).
    classifier: ``{'w': [C d, n], 'b': [n]}``, the global linear classifier.
    switched: bool scalar: the classifier phase has started (encoders frozen and sent).
  """
  models: ModelState
  classifier: Any
  switched: Any


def _embed(kernels):
  """One model's inference-mode penultimate features (the compute dtype)."""
  return lambda p, s, x: kernels.apply_model(p, s, x, train=False, embed=True)


@dataclasses.dataclass(frozen=True)
class ClassifierTraining(Program):
  """A participant's local training of the global classifier on the frozen clusters'
  concatenated features: the first ``steps`` minibatches of one reshuffled epoch of its
  private rows, from ``shared['classifier']`` with a fresh optimizer state, the updates
  times ``shared['lr_scale']``. ``shared['encoders']`` are the cluster models. Outputs the
  classifier; the stored models are not read."""
  steps: int
  batch_size: int
  augment: Any = None
  writes = False

  @property
  def batches(self):
    return Batches(1, self.batch_size, steps=self.steps, augment=self.augment)

  def init(self, c, row, shared):
    clf = shared['classifier']
    return clf, c.kernels.optimizers['train'].init(clf)

  def step(self, c, carry, batch, row, shared):
    w, opt = carry
    feats = model_concat.concat_features(model_concat.cluster_features(
        _embed(c.kernels), shared['encoders'], batch.data['x']))

    def loss(w):
      return masked_mean(cross_entropy(model_concat.linear(w, feats), batch.data['y']),
                         batch.valid)

    value, grads = jax.value_and_grad(loss)(w)
    updates, opt = c.kernels.optimizers['train'].update(grads, opt, w)
    scale = shared['lr_scale']
    updates = jax.tree.map(lambda u: u * scale.astype(u.dtype), updates)
    return (optax.apply_updates(w, updates), opt), value

  def final(self, c, carry, row, shared):
    return None, carry[0]


def _global_logits(encoders, classifier, x, *, kernels, chunk: int):
  """``[N, n]`` logits of the concatenated model on stored inputs ``x``, ``chunk`` at a time."""
  def logits(rows, i):
    del i
    feats = model_concat.cluster_features(_embed(kernels), encoders, kernels.inputs(x[rows]))
    return model_concat.concat_logits(feats, classifier)

  return over_rows(logits, jnp.arange(x.shape[0], dtype=jnp.int32), chunk)


@jax.jit
def _accuracy_and_nll(logits: Array, y: Array) -> tuple[Array, Array, Array]:
  return (jnp.mean(jnp.argmax(logits, -1) == y), jnp.mean(cross_entropy(logits, y)),
          jax.nn.softmax(logits, -1))


class FedConcat(base.Algorithm):
  name = 'fedconcat'
  uses_public = False
  one_architecture = True   # parameter averaging inside clusters: one model spec
  options_class = FedConcatOptions

  def __init__(self, ctx):
    super().__init__(ctx)
    o = self.options
    data = ctx.fed.data
    self.kernels = ctx.fed.cohorts[0].kernels
    self.num_classes = int(data.num_classes)
    # The one-time clustering on the uploaded label counts (fixed for the run).
    self.assign = model_concat.cluster_label_distributions(
        data.client_labels(), o.clusters, self.spec.seed, n_init=o.kmeans_init)
    self.num_clusters = int(self.assign.max()) + 1
    self.encoder_rounds = o.resolved_encoder_rounds(self.spec.rounds)
    shapes = jax.eval_shape(self._init_model, ctx.root)
    self.model_elements = num_elements(shapes.params) + num_elements(shapes.batch_stats)
    dummy = jax.ShapeDtypeStruct((1,) + tuple(data.input_shape), data.model_input_dtype)
    feats = jax.eval_shape(
        lambda p, s, x: self.kernels.apply_model(p, s, x, train=False, embed=True),
        jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), shapes.params),
        jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), shapes.batch_stats),
        dummy)
    self.feature_dim = int(feats.shape[-1])
    # The encoder is the model less its final Dense layer (d n weights and n biases).
    self.encoder_elements = self.model_elements - (self.feature_dim + 1) * self.num_classes
    self.classifier_elements = (self.num_clusters * self.feature_dim + 1) * self.num_classes
    if o.classifier_init == 'concat':
      self._head(shapes.params)   # raises now if the model has no final Dense head
    self.classifier = ClassifierTraining(o.classifier_steps, self.spec.train.batch_size,
                                         self.augment)
    self._logits = jax.jit(functools.partial(_global_logits, kernels=self.kernels),
                           static_argnames=('chunk',))

  def _init_model(self, root):
    """FedAvg's initial global model (``[1, ...]``), from the server's init key."""
    return self.kernels.init(rng.server_key(root, 0, 'init')[None], self.ctx.data.input_shape,
                             self.ctx.data.model_input_dtype)

  def _head(self, params):
    """``(kernel [C, d, n], bias [C, n])`` of the clusters' final Dense layer (the last
    top-level submodule, created last in every model of the zoo)."""
    head = params[list(params.keys())[-1]]
    ok = (isinstance(head, dict) and set(head) == {'kernel', 'bias'}
          and tuple(head['kernel'].shape[-2:]) == (self.feature_dim, self.num_classes)
          and tuple(head['bias'].shape[-1:]) == (self.num_classes,))
    if not ok:
      raise ConfigError('fedconcat.classifier_init', 'concat',
                        "'random' or 'zeros' for this model (its last layer is not a Dense "
                        f'[{self.feature_dim}, {self.num_classes}] head)')
    return head['kernel'], head['bias']

  # ------------------------------------------------------------ lifecycle
  def init(self):
    state = super().init()
    one = self._init_model(self.ctx.root)
    c = self.num_clusters
    rep = lambda tree: jax.tree.map(lambda a: jnp.repeat(a, c, axis=0), tree)
    models = ModelState(params=rep(one.params), batch_stats=rep(one.batch_stats), opt_state=())
    fan_in = c * self.feature_dim
    if self.options.classifier_init == 'random':
      clf = model_concat.torch_linear_init(rng.server_key(self.ctx.root, 0, 'server'), fan_in,
                                           self.num_classes)
    else:   # 'zeros'; 'concat' is filled in at the switch
      clf = {'w': jnp.zeros((fan_in, self.num_classes), jnp.float32),
             'b': jnp.zeros((self.num_classes,), jnp.float32)}
    return state.replace(extra=FedConcatServer(models=models, classifier=clf,
                                               switched=jnp.asarray(False)))

  def setup_payloads(self):
    k = self.num_clients
    out = [comm.Payload('params', comm.DOWN, 'float', self.model_elements, k, multicast=True)]
    sel = self.ctx.selector   # FedEntOpt's (and KL's) selection uploads the same vectors
    if sel is None or not any(p.name == 'label_counts' for p in sel.setup_payloads()):
      out.append(comm.Payload('label_counts', comm.UP, 'float', self.num_classes, k))
    return out

  def _classifier_shared(self, encoders, classifier, t: int) -> dict:
    """The classifier program's inputs in round ``t``: the frozen cluster models, the global
    classifier and the learning-rate factor of the phase's round."""
    o, tr = self.options, self.spec.train
    j = t - self.encoder_rounds
    lr_scale = (o.classifier_lr or tr.learning_rate) / tr.learning_rate * tr.lr_decay ** (j - 1)
    return {'encoders': encoders, 'classifier': classifier, 'lr_scale': jnp.float32(lr_scale)}

  def programs(self, shapes):
    ex = shapes.extra
    return (self.planned_training(),
            base.planned(self.classifier, self.private_rows(), None,
                         self._classifier_shared(ex.models, ex.classifier,
                                                 self.encoder_rounds + 1)))

  # ------------------------------------------------------------ rounds
  def round(self, state, r):
    if r.t <= self.encoder_rounds:
      return self._encoder_round(state, r)
    return self._classifier_round(state, r)

  def _encoder_round(self, state, r):
    (cohort,) = state.clients
    extra = state.extra
    cluster_np = self.assign[r.ids]
    cluster = jnp.asarray(cluster_np, jnp.int32)
    mask = jnp.asarray(r.active)
    cohort = cohort.replace(
        params=model_concat.gather_cluster_rows(cohort.params, extra.models.params, cluster,
                                                mask),
        batch_stats=model_concat.gather_cluster_rows(cohort.batch_stats,
                                                     extra.models.batch_stats, cluster, mask))
    state, loss = self.train_clients(state.replace(clients=(cohort,)), r)
    trained = state.clients[0]
    weights = jnp.asarray(r.fed.data.client_n * r.active, jnp.float32)
    c = self.num_clusters
    models = extra.models.replace(
        params=model_concat.segment_weighted_average(trained.params, weights, cluster, c,
                                                     extra.models.params),
        batch_stats=model_concat.segment_weighted_average(trained.batch_stats, weights,
                                                          cluster, c,
                                                          extra.models.batch_stats))
    state = state.replace(extra=extra.replace(models=models))
    per_cluster = np.bincount(cluster_np[r.active], minlength=c)
    payloads = [comm.Payload('params', comm.UP, 'float', self.model_elements,
                             int(r.active.sum()))]
    payloads += [comm.Payload('cluster_params', comm.DOWN, 'float', self.model_elements,
                              int(n), multicast=True) for n in per_cluster if n]
    return state, base.RoundOutput({'train_loss': loss,
                                    'clusters_trained': int(np.sum(per_cluster > 0))}, payloads)

  def _classifier_round(self, state, r):
    o = self.options
    extra = state.extra
    clf = extra.classifier
    if o.classifier_init == 'concat':   # the first classifier round starts from the heads
      heads = model_concat.stack_heads(*self._head(extra.models.params))
      clf = jax.tree.map(lambda a, b: jnp.where(extra.switched, a, b), clf, heads)
    n_act = int(np.sum(r.active))
    if not n_act:   # nobody to train (the runner skips such rounds)
      return state, base.RoundOutput({}, [])
    ran = r.fed.run(self.classifier, state.clients, self.ctx.root, r.t, 'custom',
                    data=self.private_rows(r.fed), active=r.active,
                    shared=self._classifier_shared(extra.models, clf, r.t))
    d = r.fed.data
    weights = r.active * (np.asarray(d.client_n) if o.classifier_weighting == 'samples' else 1)
    new = param_aggregate.weighted_average(ran.out, jnp.asarray(weights, jnp.float32))
    new = jax.tree.map(lambda a: a[0], new)
    state = state.replace(extra=extra.replace(classifier=new, switched=jnp.asarray(True)))
    loss = base.nanmean(ran.metrics)
    payloads = [
        # The frozen encoders, once, to every client (0 elements after the switch).
        comm.Payload('encoders', comm.DOWN, 'float',
                     jnp.where(extra.switched, 0, 1).astype(jnp.int32), r.population,
                     multicast=True, scale=self.num_clusters * self.encoder_elements),
        comm.Payload('classifier', comm.UP, 'float', self.classifier_elements, n_act),
        comm.Payload('classifier', comm.DOWN, 'float', self.classifier_elements, n_act,
                     multicast=True)]
    return state, base.RoundOutput({'train_loss': loss}, payloads)

  # ------------------------------------------------------------ evaluation
  def global_logits(self, state, x: Array) -> Array:
    """``[N, n]`` logits of the global model (concatenated encoders + classifier) on ``x``."""
    chunk = max(1, min(self.spec.eval.chunk, int(x.shape[0])))
    return self._logits(state.extra.models, state.extra.classifier, x, chunk=chunk)

  def evaluate(self, state):
    """The cluster models' scores, and the scored model's: the concatenated model once the
    classifier phase has begun, else the cluster models' mean. Both are computed on the
    device and the host picks after the round's one read (:class:`base.Later`)."""
    d = self.ctx.data
    models = state.extra.models
    c = self.num_clusters
    acc, nll, _ = self.kernels.evaluate(models, jnp.arange(c, dtype=jnp.int32), d.x_test,
                                        d.y_test, chunk=self.spec.eval.chunk)
    g_acc, g_nll, probs = _accuracy_and_nll(self.global_logits(state, d.x_test), d.y_test)
    switched = state.extra.switched

    def scored(global_value, cluster_values):
      return base.Later((switched, global_value, cluster_values),
                        lambda v: float(v[1]) if v[0] else float(np.mean(v[2])))

    out = {'cluster_acc_mean': base.Later(acc, lambda a: float(np.mean(a))),
           'cluster_acc_min': base.Later(acc, lambda a: float(np.min(a))),
           'cluster_acc_max': base.Later(acc, lambda a: float(np.max(a))),
           SCORED_MODEL: base.Later(switched, lambda s: int(bool(s))),
           'test_acc': scored(g_acc, acc), 'test_loss': scored(g_nll, nll)}
    if self.spec.data.per_client_test and d.test_idx is not None:
      ua = base.split_mean_accuracy(probs, d.y_test, d.test_idx, jnp.asarray(d.test_n))
      out['server_ua'] = base.Later((switched, ua), lambda v: float(v[1]) if v[0] else None)
    out.update(self.client_metrics(state))
    return out
