"""kNN-Per (Marfoq et al., ICML 2022) beside its authors' code: omarfoq/knn-per.

O. Marfoq, G. Neglia, R. Vidal, L. Kameni, "Personalized Federated Learning through Local
Memorization". The method is FedAvg training of one global model, then, on each client, a
datastore of the global model's embeddings of its training rows, a Gaussian-kernel kNN over
it, and the interpolation ``lambda p_kNN + (1 - lambda) h_global`` with lambda picked on
held-out rows. Both halves run through their code, unchanged:

* training (``train.py``'s loop, without its data files and loggers): their
  ``CentralizedAggregator.mix()`` (``aggregator.py``: client sampling at rate 1, the
  broadcast ``toggle_client``, each ``Client.step()`` = their ``Learner.fit_epochs``, the
  ``n_k``-weighted ``average_learners``, the copy back to every client), each client's and
  the global ``Learner`` (``learners/learner.py``) built as their ``get_learner`` builds it
  for an image experiment: ``CrossEntropyLoss(reduction='none')``, ``utils.metrics.accuracy``,
  their ``get_optimizer('sgd', ...)`` (SGD, momentum 0, their fixed ``weight_decay=5e-4``)
  and ``get_lr_scheduler('constant')``;
* memorisation, after every round, from a copy of the global learner (their
  ``eval_knnper.py`` loads one checkpoint into one learner): per client their
  ``KNNPerClient`` (``client.py``) with their ``DataStore`` (``datastore.py``, faiss
  ``IndexFlatL2``: ``faiss-cpu`` runs here, no stand-in), ``capacity=-1`` (the whole
  training set), ``k=7``, ``scale=1``; ``compute_features_and_model_outputs`` (their
  ``Learner.compute_embeddings_and_outputs``: a forward hook on ``model.features``),
  ``clear_datastore`` and their ``eval_knnper_grid`` (``eval_knnper.py``: build the store,
  ``gather_knn_outputs``, ``evaluate(weight)`` for each weight of
  ``np.arange(0, 1 + 1e-6, 0.1)``). Lambda is tuned as their ``--validation`` flag does it:
  the client's held-out rows are the ``test_iterator`` (``get_loaders(is_validation=True)``
  reads ``val.pkl`` there), and each client takes the weight with the most correct
  predictions (``np.argmax``: the first, i.e. the smallest, on ties; their script saves the
  grid and leaves the choice to the reader). A second ``KNNPerClient`` with the test rows as
  ``test_iterator`` then gives the personalised accuracy ``evaluate(lambda_k)`` and the
  interpolated predictions ``lambda_k knn_outputs + (1 - lambda_k) model_outputs``.

Around their code the driver supplies:

* the data: loaders that yield ``(x, y, indices)`` (their iterators' triples) with a
  ``.dataset`` (their ``len(iterator.dataset)``); the training loaders yield fedjax_kd's
  minibatches of each client and round (phase ``'train'``), the partial last batch kept
  (their ``get_loader`` sets ``drop_last`` for training loaders, a BatchNorm guard for
  MobileNet: ``drop_last=True`` here measures it); evaluation loaders go through the rows
  in order;
* the model: fedjax_kd's ``mlp@0.1`` (Flatten -> Dense(20) -> ReLU -> Dense(20) -> ReLU ->
  Dense(C)) as a module whose ``features`` (the penultimate ReLU output, fedjax_kd's
  ``embed=True``) and ``classifier`` mirror torchvision's MobileNet, the model their
  ``compute_embeddings_and_outputs`` hooks (``model_name='mobilenet'`` selects the hook
  ``model.features``; ``output.squeeze()`` gives ``[N, 20]``); ``features_dimension=20``;
* ``torchvision`` (imported at module level by their ``models.py``/``datasets.py`` through
  ``utils/utils.py``, never called) as empty modules.

No line of their code is patched. fedjax_kd runs the digits preset's ``knn_per`` defaults
(``k=7``, ``scale=1``, ``lam=-1`` tuned per client on ``data.val_fraction=0.1`` of each
client's rows, ``lambda_step=0.1``, ``tune='val'``) with one change: ``train.weight_decay =
5e-4``, the value their ``get_optimizer`` hard-codes (fedjax_kd's ``add_decayed_weights``
before SGD is torch's coupled L2). Their ``interpolate_logits`` is False (the paper's
probabilities, fedjax_kd's choice; their script's ``default="store_true"`` makes it truthy:
``interpolate_logits=True`` measures it). The common test set is every client's test set
(the tiny setting has no per-client test split).

Measured (seed 0, 3 rounds, :func:`effects`): aligned, every model within 1.2e-7, lambdas,
validation grids and accuracies equal, interpolated predictions within 7e-8. Their
``drop_last``: 7e-2 in the parameters, accuracy 0.509 against 0.544 after round 3.
``interpolate_logits=True``: lambdas 0.3-0.5 instead of 0.1, accuracy 0.542. Lambda on the
test rows (their script's oracle): 0.547. fedjax_kd without their weight decay: 1.4e-3.
"""

from __future__ import annotations

import copy

import numpy as np

from benchmarks.references.authors import common

WEIGHT_DECAY = 5e-4   # their get_optimizer's fixed value
EVAL_BATCH = 64


def config(rounds: int = 3, seed: int = 0, weight_decay: float = WEIGHT_DECAY):
  return common.tiny('knn_per', rounds, seed=seed, **{'train.weight_decay': weight_decay})


def _stubs() -> dict:
  """torchvision, as their ``models.py``/``datasets.py`` import it (never called here)."""
  tv = common.stub('torchvision')
  subs = {}
  for name, attrs in (('models', ()), ('datasets', ('CIFAR10', 'CIFAR100')),
                      ('transforms', ('Compose', 'ToTensor', 'Normalize'))):
    m = common.stub(f'torchvision.{name}')
    for a in attrs:
      setattr(m, a, None)
    setattr(tv, name, m)
    subs[f'torchvision.{name}'] = m
  return {'torchvision': tv, **subs}


class _Set:
  def __init__(self, n: int):
    self.n = n

  def __len__(self):
    return self.n


class Loader:
  """Their iterators as the driver feeds them: ``(x NCHW, y, indices)`` per step.

  ``steps``: one array of row positions a step (fedjax_kd's minibatches for training, set
  every round; the rows in order for evaluation).
  """

  def __init__(self, x: np.ndarray, y: np.ndarray, steps=None):
    import torch  # pylint: disable=g-import-not-at-top
    self.x, self.y = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))
    self.dataset = _Set(len(y))
    n = len(y)
    self.steps = steps if steps is not None else [
        np.arange(i, min(i + EVAL_BATCH, n)) for i in range(0, n, EVAL_BATCH)]

  def __len__(self):
    return len(self.steps)

  def __iter__(self):
    import torch  # pylint: disable=g-import-not-at-top
    for p in self.steps:
      j = torch.from_numpy(np.asarray(p, np.int64))
      yield self.x[j], self.y[j], j


def _ours_knn(run: common.Ours, t: int) -> dict:
  """fedjax_kd's kNN-Per after round ``t``: per-client lambda, validation grid, test accuracy,
  interpolated test probabilities and the features they came from."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import knn_per as mod  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops import knn as knn_ops  # pylint: disable=g-import-not-at-top
  algo, state = run.exp.algorithm, run.states[t]
  o, d = algo.options, algo.ctx.data
  acc, _, lams, _ = algo.personalised_scores(state)
  f_priv, p_priv = algo._embed(state.server, d.x_private)  # pylint: disable=protected-access
  f_test, p_test = algo._embed(state.server, d.x_test)  # pylint: disable=protected-access
  grid = jnp.asarray(mod.lambda_grid(o.lambda_step))
  val_acc, _ = algo._scores(  # pylint: disable=protected-access
      state, f_priv, (d.val_idx, jnp.asarray(d.val_n, jnp.int32)), f_priv, p_priv,
      d.y_private, jnp.broadcast_to(grid, (d.num_clients,) + grid.shape), loo=False)
  preds = []
  for k, rows in enumerate(run.setting.client_rows):
    p, has = knn_ops.knn_probs(f_test, f_priv[rows], d.y_private[rows],
                               jnp.ones(len(rows), bool), k=o.k, scale=o.scale,
                               num_classes=d.num_classes)
    preds.append(np.asarray(knn_ops.interpolate(p, p_test, lams[k], has)))
  return {'lam': np.asarray(lams, np.float64), 'acc': np.asarray(acc, np.float64),
          'val_acc': np.asarray(val_acc, np.float64), 'pred': preds,
          'f_priv': np.asarray(f_priv), 'f_test': np.asarray(f_test),
          'global_acc': float(run.rows[t - 1]['global_acc'])}


def lockstep(path: str, seed: int = 0, rounds: int = 3, drop_last: bool = False,
             interpolate_logits: bool = False, oracle: bool = False,
             ours_run: common.Ours | None = None) -> common.Result:
  """Runs ``rounds`` rounds of fedjax_kd's kNN-Per and of their code; compares every model
  after every round, then the kNN-Per evaluation (lambda per client, interpolated test
  predictions, accuracies) built on each side's global model of the round.

  Args:
    path: the checkout of omarfoq/knn-per.
    seed: fedjax_kd's seed (their aggregator's client-sampling seed too).
    rounds: FedAvg rounds.
    drop_last: their training loaders drop each epoch's partial last batch (their
      ``get_loader``); False: fedjax_kd's batches, all of them.
    interpolate_logits: their flag (True: the global model's logits, not probabilities, are
      interpolated, what their script's ``default="store_true"`` does).
    oracle: lambda picked on the test rows (their released ``eval_knnper.py`` without
      ``--validation``) instead of the validation rows.
    ours_run: a fedjax_kd run of :func:`config` to reuse.

  Returns:
    the result; ``acc_*`` are the mean over clients of the personalised test accuracy
    (fedjax_kd's ``test_acc``). ``result.details`` holds, per round, each side's lambdas,
    per-client accuracies, global accuracies and the largest feature, validation-grid and
    prediction differences.
  """
  torch = common.need_torch()
  nn = torch.nn
  run = ours_run or common.ours(config(rounds, seed))
  s = run.setting
  epochs, batch_size, lr = s.train
  d = run.exp.ctx.data
  n_classes = s.num_classes
  k_clients = len(s.client_rows)
  val_rows = [np.asarray(d.val_idx)[k, :int(d.val_n[k])] for k in range(k_clients)]
  knn_k, scale = run.exp.algorithm.options.k, run.exp.algorithm.options.scale

  class Twin(nn.Module):
    """fedjax_kd's MLP with MobileNet's ``features`` / ``classifier`` split."""

    def __init__(self, variables):
      super().__init__()
      mlp = common.torch_model(run, variables)
      self.features = mlp[:-1]
      self.classifier = mlp[-1]

    def forward(self, x):
      return self.classifier(self.features(x))

  data = [run.client_data(k) for k in range(k_clients)]
  train_loaders = [Loader(x, y) for x, y in data]
  test_loader = Loader(s.x_test, s.y_test)
  dim = int(Twin(run.server(0)).classifier.in_features)

  diffs, details, acc_theirs = [], [], []
  with common.imported_from(path, _stubs()):
    import faiss  # pylint: disable=g-import-not-at-top
    faiss.omp_set_num_threads(1)
    import aggregator as agg_mod  # pylint: disable=g-import-not-at-top
    import client as client_mod  # pylint: disable=g-import-not-at-top
    import eval_knnper  # pylint: disable=g-import-not-at-top
    from learners import learner as learner_mod  # pylint: disable=g-import-not-at-top
    from utils import metrics, optim  # pylint: disable=g-import-not-at-top

    def make_learner(variables):
      model = Twin(variables)
      opt = optim.get_optimizer('sgd', model, lr)
      return learner_mod.Learner(
          model=model, criterion=nn.CrossEntropyLoss(reduction='none'),
          metric=metrics.accuracy, device='cpu', optimizer=opt, model_name='mobilenet',
          lr_scheduler=optim.get_lr_scheduler(opt, 'constant'))

    class Recorded(client_mod.Client):
      """Their Client; its local model kept after ``step()`` (before the copy-back)."""

      def step(self, *args, **kwargs):
        super().step(*args, **kwargs)
        self.local = copy.deepcopy(self.learner.model.state_dict())

    clients = [Recorded(learner=make_learner(run.client(0, k)), train_iterator=train_loaders[k],
                        val_iterator=train_loaders[k], test_iterator=test_loader, logger=None,
                        local_steps=epochs, id_=k) for k in range(k_clients)]
    aggregator = agg_mod.CentralizedAggregator(
        clients=clients, global_learner=make_learner(run.server(0)), log_freq=1,
        global_train_logger=None, global_test_logger=None, sampling_rate=1.0,
        test_clients=None, verbose=0, seed=seed)
    weights_grid = np.arange(0, 1. + 1e-6, 0.1)

    def knn_client(learner, k, test_it):
      return client_mod.KNNPerClient(
          learner=learner, train_iterator=train_loaders[k], val_iterator=None,
          test_iterator=test_it, logger=None, local_steps=None, k=knn_k,
          interpolate_logits=interpolate_logits, features_dimension=dim,
          num_classes=n_classes, capacity=-1, strategy='random',
          rng=np.random.default_rng(seed))

    for t in range(1, len(run.rows) + 1):
      for k, loader in enumerate(train_loaders):
        steps = run.order(t, k, 'train', len(loader.y), epochs, batch_size)
        if drop_last and len(loader.y) > batch_size:
          steps = [p for p in steps if len(p) == batch_size]
        loader.steps = steps
      aggregator.mix()
      d_local = []
      for k, c in enumerate(clients):
        twin = Twin(run.server(0))
        twin.load_state_dict(c.local)
        d_local.append(common.max_diff(twin, run.client(t, k)))
      d_global = common.max_diff(aggregator.global_learner.model, run.server(t))
      diffs.append(max(d_local + [d_global]))

      # ---- their kNN-Per evaluation of this round's global model
      learner = copy.deepcopy(aggregator.global_learner)   # their checkpoint-loaded learner
      ours = _ours_knn(run, t)
      lam, acc, val_grid, preds, f_diff = [], [], [], [], 0.0
      for k in range(k_clients):
        xs, ys = s.x_private[val_rows[k]], s.y_private[val_rows[k]]
        tune_it = test_loader if oracle else Loader(xs, ys)
        tuner = knn_client(learner, k, tune_it)
        tuner.compute_features_and_model_outputs()
        tuner.clear_datastore()
        scores = eval_knnper.eval_knnper_grid(tuner, weights_grid, np.array([1.]))[:, 0]
        val_grid.append(scores / tuner.n_test_samples)
        lam_k = float(weights_grid[int(np.argmax(scores))])
        c = knn_client(learner, k, test_loader)
        c.compute_features_and_model_outputs()
        c.clear_datastore()
        c.build_datastore()
        c.gather_knn_outputs(mode='test', scale=scale)
        acc.append(float(c.evaluate(lam_k)))
        preds.append(lam_k * c.test_knn_outputs + (1 - lam_k) * c.test_model_outputs)
        lam.append(lam_k)
        f_diff = max(f_diff,
                     float(np.abs(c.train_features - ours['f_priv'][s.client_rows[k]]).max()),
                     float(np.abs(c.test_features - ours['f_test']).max()))
      _, g_acc = learner.evaluate_iterator(test_loader)
      row = {
          'lam_ours': ours['lam'].tolist(), 'lam_theirs': lam,
          'acc_ours': ours['acc'].tolist(), 'acc_theirs': acc,
          'global_acc_ours': ours['global_acc'], 'global_acc_theirs': float(g_acc),
          'feature_diff': f_diff,
          'val_grid_diff': float(np.max(np.abs(np.array(val_grid) - ours['val_acc']))),
          'pred_diff': float(max(np.abs(p - q).max() for p, q in zip(preds, ours['pred']))),
          'pred_argmax_agree': float(np.mean([np.mean(p.argmax(1) == q.argmax(1))
                                              for p, q in zip(preds, ours['pred'])])),
      }
      details.append(row)
      acc_theirs.append(float(np.mean(acc)))

  variant = [name for name, on in (('drop_last', drop_last), ('interpolate_logits',
                                   interpolate_logits), ('oracle lambda', oracle)) if on]
  notes = [f'train.weight_decay={WEIGHT_DECAY} (their get_optimizer)',
           f'their side: {", ".join(variant) or "as fedjax_kd (aligned)"}']
  for t, row in enumerate(details, 1):
    notes.append(
        f'round {t}: lambda ours {row["lam_ours"]} theirs {row["lam_theirs"]}; '
        f'feature diff {row["feature_diff"]:.1e}, val-grid diff {row["val_grid_diff"]:.1e}, '
        f'prediction diff {row["pred_diff"]:.1e}; global acc {row["global_acc_ours"]:.4f} / '
        f'{row["global_acc_theirs"]:.4f}')
  res = common.Result(
      baseline='knn_per', repo=common.REPOS['knn_per'], rounds=len(run.rows), param_diff=diffs,
      acc_ours=[r['test_acc'] for r in run.rows], acc_theirs=acc_theirs,
      what=('every local model and the global model after each round; then per client the '
            'lambda tuned on its validation rows, the interpolated test predictions and the '
            'personalised test accuracy (mean over clients)'),
      notes=tuple(notes))
  res.details = details   # pylint: disable=attribute-defined-outside-init
  return res


def effects(path: str, seed: int = 0, rounds: int = 3) -> dict:
  """The measured differences: each run beside the aligned lock-step (max param diff, mean
  personalised accuracy per round, lambdas of the last round)."""
  run = common.ours(config(rounds, seed))
  out = {}
  for name, kw in (('aligned', {}), ('drop_last', {'drop_last': True}),
                   ('interpolate_logits', {'interpolate_logits': True}),
                   ('oracle', {'oracle': True})):
    r = lockstep(path, seed, rounds, ours_run=run, **kw)
    out[name] = {'param_diff': r.param_diff, 'acc_ours': r.acc_ours, 'acc_theirs': r.acc_theirs,
                 'lam_ours': r.details[-1]['lam_ours'], 'lam_theirs': r.details[-1]['lam_theirs']}
  r = lockstep(path, seed, rounds, ours_run=common.ours(config(rounds, seed, weight_decay=0.0)))
  out['fedjax_kd_weight_decay_0'] = {'param_diff': r.param_diff, 'acc_ours': r.acc_ours,
                                     'acc_theirs': r.acc_theirs}
  return out
