"""FedConcat (Diao, Li and He, AAAI 2024) beside its authors' code: sjtudyq/FedConcat's
``experiments.py``.

Their script runs as written: the ``elif args.alg == 'fedconcat':`` branch of its ``__main__``
block (the model lists, the k-means call, the per-cluster rounds with their ``n_k``-weighted
FedAvg of encoder and classifier, ``CombineAllModel``, the wide ``SimpleClassifier``, the
classifier rounds with their uniform average, ``CombineModel`` and ``compute_accuracy``) is
read from their file and executed in their module's namespace, and it calls their
``local_train_net_encoder_classifier`` / ``train_net_encoder_classifier`` (the encoder phase)
and ``local_train_net_classifier`` / ``train_net_classifier`` (the classifier phase: one
fresh SGD per call, 3 minibatches, ``if batch_idx == 2: break``) unchanged. Around it the
driver supplies, as names in their module:

* the data: ``get_dataloader`` returns a loader (:class:`common.Batches`) yielding fedjax_kd's
  minibatches of the client and round: phase ``'train'`` (``train.epochs`` epochs) in the
  encoder rounds, phase ``'custom'`` (one epoch, of which their break keeps the first 3
  steps, as fedjax_kd's ``classifier_steps = 3``) in the classifier rounds; the test set as
  one batch; ``net_dataidx_map`` (client rows) and ``client_distribution`` (``counts_k /
  n_k``) from fedjax_kd's partition;
* the clustering: ``KMeans`` returns fedjax_kd's assignment (its ``labels_``); sklearn's
  ``KMeans(n_clusters=C)``, their call, is run on the same ``client_distribution`` beside and
  checked to give the same partition (its numbering may differ; fedjax_kd's numbering is
  used on both sides, so the concatenation order is the same);
* the models: ``SimpleEncoder`` (their LeNet body; called only to build the per-client
  encoders) returns fedjax_kd's MLP less its head (a ``torch.nn.Sequential`` holding
  fedjax_kd's initial weights); ``SimpleClassifier`` is their class, built at fedjax_kd's
  sizes (``hidden_dim = 84``, their hard-coded ``num_ftrs``, becomes the MLP's ``d = 20``;
  ``84 C`` becomes ``C d``) and filled with fedjax_kd's initial head, resp. fedjax_kd's
  initial concatenated classifier (``fedconcat.classifier_init = 'random'``, their
  ``start_from_classifier_weight = False`` outside CIFAR-100/Tiny-ImageNet);
* the args: fedjax_kd's learning rate, batch size, local epochs, momentum (``rho``) and weight
  decay (``reg``); ``dataset = 'mnist'`` (the branch building ``SimpleEncoder`` /
  ``SimpleClassifier(num_ftrs, 10)``, without noise and Laplace ``eps``), ``sample = 1``,
  ``n_clusters = C``, ``encoder_round = E``, ``classifier_round = rounds - E``;
* ``logger``: a stand-in whose ``info('in comm round:...')`` advances the round counter (and
  records the cluster models after each encoder round); ``local_train_net_encoder_classifier``
  and ``compute_accuracy`` are wrapped (the originals called unchanged) to record every local
  model after its training and the global model after each classifier round;
* stubs for what is imported but never called: ``torchvision`` (which fails to import beside
  this torch), ``torchvision.transforms``, ``torchvision.utils`` and their ``datasets.py``
  (which subclasses ``torchvision.datasets`` classes), as empty modules with the names the
  imports ask for.

One run-time patch of their code, on by default (``share_fix=True``) and measured off:
``encoder_global_para = [encoder_list[0].state_dict() for i in range(num_K)]`` (and the same
for the classifiers) gives every cluster the *same tensors* as client 0's model
(``state_dict()`` detaches, sharing storage). Client 0 trains in place before the clusters
after its own have loaded their start, so in round 1 those clusters start from client 0's
locally trained model instead of the common initial model (the paper: all clusters start
from one initialisation). The patch wraps both lists in ``copy.deepcopy``. (Whom it reaches
depends on the k-means numbering: a cluster numbered below client 0's starts clean. With
fedjax_kd's numbering client 0's cluster is 0, so every other cluster is reached; sklearn's
numbering of this data is ``[0, 0, 1]`` or ``[1, 1, 0]`` by seed.)

fedjax_kd runs its defaults but for ``fedconcat.clusters = 2`` (3 clients; their sklearn call
needs ``C <= K``, and 2 clusters put two clients in one, so the within-cluster FedAvg is
exercised) and ``fedconcat.classifier_weighting = 'uniform'`` (their classifier average,
"we move 3 steps for all clients"; fedjax_kd's default ``'samples'`` is FedEntOpt's rule;
the tiny setting's clients hold 165 rows each, so the two coincide here).
With ``rounds = 4`` the default ``encoder_share`` (480/980) gives 2 encoder and 2 classifier
rounds. Accuracies: fedjax_kd's ``test_acc``: in the encoder rounds the mean over clusters of
the cluster models' test accuracies (their script scores none there: the driver scores their
cluster models the same way), then the concatenated model's, against their
``compute_accuracy`` of ``CombineModel``.
"""

from __future__ import annotations

import copy
import os
import textwrap

import numpy as np

from benchmarks.references.authors import common

CLUSTERS = 2
BRANCH = "    elif args.alg == 'fedconcat':"
BRANCH_END = "    elif args.alg == 'local_training':"
ALIASED = ('encoder_global_para = [encoder_list[0].state_dict() for i in range(num_K)]',
           'classifier_global_para = [classifier_list[0].state_dict() for i in range(num_K)]')
NUM_FTRS = 84   # their hard-coded feature width (LeNet's fc2)
# The names their utils.py imports from their datasets.py (never called here).
_DATASETS = ('MNIST_truncated', 'CIFAR10_truncated', 'CIFAR100_truncated', 'ImageFolder_custom',
             'SVHN_custom', 'FashionMNIST_truncated', 'CustomTensorDataset', 'CelebA_custom',
             'FEMNIST', 'Generated', 'genData', 'Criteo')


def config(rounds: int = 4, seed: int = 0):
  return common.tiny('fedconcat', rounds, seed=seed,
                     **{'fedconcat.clusters': CLUSTERS,
                        'fedconcat.classifier_weighting': 'uniform'})


def _stubs() -> dict:
  names = ('torchvision', 'torchvision.transforms', 'torchvision.utils', 'datasets')
  stubs = {name: common.stub(name) for name in names}
  stubs['torchvision'].transforms = stubs['torchvision.transforms']
  stubs['torchvision'].utils = stubs['torchvision.utils']
  for name in _DATASETS:
    setattr(stubs['datasets'], name, None)
  return stubs


def _branch_source(path: str, share_fix: bool) -> tuple[str, str]:
  """Their ``fedconcat`` branch of ``__main__``, dedented to module level (line numbers kept),
  and the file it came from."""
  f = os.path.join(path, 'experiments.py')
  with open(f, encoding='utf-8') as fh:
    lines = fh.read().split('\n')
  start = lines.index(BRANCH)
  end = lines.index(BRANCH_END, start)
  body = textwrap.dedent('\n'.join(lines[start + 1:end]))
  if share_fix:
    for line in ALIASED:
      assert body.count(line) == 1, line
      lhs, rhs = line.split(' = ', 1)
      body = body.replace(line, f'{lhs} = copy.deepcopy({rhs})')
  return '\n' * (start + 1) + body, f


def kmeans_partition(dist: np.ndarray, clusters: int, seed: int = 0) -> np.ndarray:
  """Their clustering call, ``KMeans(n_clusters=C).fit(dist).labels_``, after their
  ``np.random.seed(seed)`` (sklearn's default ``random_state`` draws from it)."""
  from sklearn.cluster import KMeans  # pylint: disable=g-import-not-at-top
  np.random.seed(seed)
  return np.asarray(KMeans(n_clusters=clusters).fit(dist).labels_)


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
  """Whether two labelings group the clients alike (up to the numbering)."""
  groups = lambda lab: sorted(tuple(np.flatnonzero(lab == c)) for c in np.unique(lab))
  return groups(np.asarray(a)) == groups(np.asarray(b))


def lockstep(path: str, seed: int = 0, rounds: int = 4, share_fix: bool = True,
             ours_run: common.Ours | None = None) -> common.Result:
  """Runs ``rounds`` rounds of fedjax_kd's FedConcat and of their script, comparing every
  local model, every cluster model and the global classifier after every round.

  Args:
    path: their checkout.
    seed: the experiment's seed.
    rounds: rounds in all (``E`` encoder rounds by fedjax_kd's ``encoder_share``, the rest
      classifier rounds; both at least 1).
    share_fix: copy the clusters' initial state (the patch above); False runs their line as
      written.
    ours_run: a finished fedjax_kd run of :func:`config` to reuse.
  """
  torch = common.need_torch()
  nn = torch.nn
  run = ours_run or common.ours(config(rounds, seed))
  s = run.setting
  spec = s.spec
  algo = run.exp.algorithm
  epochs, batch_size, lr = s.train
  assign = np.asarray(algo.assign, np.int64)
  c_num, e_rounds, d = int(algo.num_clusters), int(algo.encoder_rounds), int(algo.feature_dim)
  n_cls = int(s.num_classes)
  total = len(run.rows)
  assert 1 <= e_rounds < total, (e_rounds, total)
  k_clients = len(s.client_rows)
  data = [run.client_data(k) for k in range(k_clients)]

  # ---------------------------------------------------------- fedjax_kd's models as torch
  def cluster_vars(t: int, c: int):
    import jax  # pylint: disable=g-import-not-at-top
    m = run.states[t].extra.models
    take = lambda tree: jax.tree.map(lambda x: np.asarray(x[c]), tree or {})
    return take(m.params), take(m.batch_stats)

  def twin(variables) -> nn.Sequential:
    return common.torch_model(run, variables)

  def classifier_of(t: int):
    clf = run.states[t].extra.classifier
    return np.asarray(clf['w']).T, np.asarray(clf['b'])

  def sd_diff(got: dict, want: dict) -> float:
    assert set(got) == set(want), (sorted(got), sorted(want))
    return max(float((got[k].detach().float() - want[k].detach().float()).abs().max())
               for k in want)

  def head_sd(seq) -> dict:
    return {'fc.weight': seq[-1].weight, 'fc.bias': seq[-1].bias}

  init = twin(cluster_vars(0, 0))
  w0, b0 = classifier_of(0)

  # ---------------------------------------------------------- what their script is given
  def make_encoder(input_dim=None, hidden_dims=None, output_dim=10):
    del input_dim, hidden_dims, output_dim
    return copy.deepcopy(init[:-1])

  class Plain:
    """A test loader: the whole set as one batch."""

    def __init__(self, x, y):
      self.x, self.y = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))

    def __iter__(self):
      return iter([(self.x, self.y)])

    def __len__(self):
      return 1

  test_dl = Plain(s.x_test, s.y_test)
  dataidx = {k: np.asarray(s.client_rows[k]) for k in range(k_clients)}
  dist = np.stack([np.bincount(data[k][1], minlength=n_cls) / len(data[k][1])
                   for k in range(k_clients)])
  clock = {'t': 0}
  diffs = [0.0] * (total + 1)
  acc_theirs = [0.0] * (total + 1)
  local = {}   # (t, k) -> (encoder state, classifier state) after k's training in round t

  def get_dataloader(dataset, datadir, train_bs, test_bs, dataidxs=None, noise_level=0,
                     net_id=None, total_parties=0):
    del dataset, datadir, train_bs, test_bs, net_id, total_parties
    assert not noise_level
    if dataidxs is None:
      return None, test_dl, None, None
    (k,) = [k for k, v in dataidx.items() if v is dataidxs]
    x, y = data[k]
    t = clock['t']
    phase, ep = ('train', epochs) if t <= e_rounds else ('custom', 1)
    b = common.Batches(x, y, -(-len(y) // batch_size))
    b.steps = run.order(t, k, phase, len(y), ep, batch_size)
    return b, None, None, None

  class Clock:
    """Their ``logger``: ``'in comm round:'`` starts a round (and closes the one before)."""

    def info(self, msg, *a, **kw):
      del a, kw
      if isinstance(msg, str) and msg.startswith('in comm round:'):
        t = clock['t']
        if 1 <= t <= e_rounds:
          encoder_round_done(t)
        clock['t'] = t + 1

    def debug(self, *a, **kw):
      del a, kw

    warning = debug

  stubs = _stubs()
  import logging  # pylint: disable=g-import-not-at-top
  root_logger = logging.getLogger()
  saved_log = (root_logger.level, list(root_logger.handlers))
  with common.imported_from(path, stubs):
    try:
      import experiments as mod  # pylint: disable=g-import-not-at-top
    finally:
      root_logger.setLevel(saved_log[0])
      root_logger.handlers[:] = saved_log[1]
    g = mod.__dict__
    orig_classifier = mod.SimpleClassifier

    def make_classifier(hidden_dim, output_dim=10):
      assert output_dim == n_cls, output_dim
      if hidden_dim == NUM_FTRS:
        m = orig_classifier(hidden_dim=d, output_dim=output_dim)
        m.load_state_dict({k: v.detach().clone() for k, v in head_sd(init).items()})
      elif hidden_dim == NUM_FTRS * c_num:
        m = orig_classifier(hidden_dim=d * c_num, output_dim=output_dim)
        m.load_state_dict({'fc.weight': torch.tensor(w0.copy()),
                           'fc.bias': torch.tensor(b0.copy())})
      else:
        raise ValueError(f'SimpleClassifier(hidden_dim={hidden_dim})')
      return m

    class FixedKMeans:
      """Their ``KMeans(n_clusters=C)``: fit gives fedjax_kd's assignment."""

      def __init__(self, n_clusters):
        assert n_clusters == c_num, n_clusters
        self.labels_ = None

      def fit(self, x):
        assert np.allclose(x, dist)
        self.labels_ = assign.copy()
        return self

    orig_local_enc = mod.local_train_net_encoder_classifier
    orig_accuracy = mod.compute_accuracy

    def local_train_net_encoder_classifier(encoder_list, classifier_list, selected, *a, **kw):
      out = orig_local_enc(encoder_list, classifier_list, selected, *a, **kw)
      for k in selected:
        local[(clock['t'], int(k))] = (copy.deepcopy(encoder_list[k].state_dict()),
                                       copy.deepcopy(classifier_list[k].state_dict()))
      return out

    def encoder_round_done(t: int):
      """After encoder round ``t``: every local model and every cluster model."""
      d_t, accs = [], []
      for k in range(k_clients):
        ref = twin(run.client(t, k))
        enc, clf = local[(t, k)]
        d_t += [sd_diff(enc, ref[:-1].state_dict()), sd_diff(clf, head_sd(ref))]
      for c in range(c_num):
        ref = twin(cluster_vars(t, c))
        d_t += [sd_diff(g['encoder_global_para'][c], ref[:-1].state_dict()),
                sd_diff(g['classifier_global_para'][c], head_sd(ref))]
        theirs = copy.deepcopy(init)
        theirs[:-1].load_state_dict(g['encoder_global_para'][c])
        theirs[-1].load_state_dict({'weight': g['classifier_global_para'][c]['fc.weight'],
                                    'bias': g['classifier_global_para'][c]['fc.bias']})
        accs.append(common.accuracy(theirs, s.x_test, s.y_test))
      diffs[t] = max(d_t)
      acc_theirs[t] = float(np.mean(accs))

    def compute_accuracy(model, dataloader, *a, **kw):
      """Their ``compute_accuracy`` of the global model, after classifier round ``t``."""
      acc = orig_accuracy(model, dataloader, *a, **kw)
      t = clock['t']
      w, b = classifier_of(t)
      d_t = [float(np.max(np.abs(model.net2.fc.weight.detach().numpy() - w))),
             float(np.max(np.abs(model.net2.fc.bias.detach().numpy() - b)))]
      for c in range(c_num):
        d_t.append(sd_diff(model.net1.nets[c].state_dict(),
                           twin(cluster_vars(t, c))[:-1].state_dict()))
      diffs[t] = max(d_t)
      acc_theirs[t] = float(acc)
      return acc

    args = common.namespace(
        model='simple-cnn', dataset='mnist', partition='shards', batch_size=batch_size, lr=lr,
        epochs=epochs, n_parties=k_clients, alg='fedconcat', comm_round=total,
        init_seed=seed, dropout_p=0.0, datadir='', reg=spec.train.weight_decay,
        device='cpu', optimizer='sgd', noise=0, noise_type='level',
        rho=spec.train.momentum, sample=1.0, n_clusters=c_num, encoder_round=e_rounds,
        classifier_round=total - e_rounds, eps=0)
    g.update(args=args, logger=Clock(), device=torch.device('cpu'), net_dataidx_map=dataidx,
             client_distribution=dist, get_dataloader=get_dataloader, KMeans=FixedKMeans,
             SimpleEncoder=make_encoder, SimpleClassifier=make_classifier,
             local_train_net_encoder_classifier=local_train_net_encoder_classifier,
             compute_accuracy=compute_accuracy)
    src, fname = _branch_source(path, share_fix)
    np.random.seed(seed)
    torch.manual_seed(seed)
    exec(compile(src, fname, 'exec'), g)  # pylint: disable=exec-used
    assert clock['t'] == total, clock

  theirs_km = kmeans_partition(dist, c_num, seed)
  km_same = same_partition(theirs_km, assign)
  return common.Result(
      baseline='fedconcat', repo=common.REPOS['fedconcat'], rounds=total,
      param_diff=diffs[1:], acc_ours=[r['test_acc'] for r in run.rows],
      acc_theirs=acc_theirs[1:],
      what=(f'{e_rounds} encoder rounds: every local model and the {c_num} cluster models '
            '(encoder and head); then the concatenated encoders and the global classifier '
            'after each classifier round; test accuracy (the mean cluster model\'s, then the '
            'concatenated model\'s)'),
      notes=(f'clusters {assign.tolist()} (fedjax_kd) on both sides; their sklearn KMeans '
             f'gives {theirs_km.tolist()}: {"the same" if km_same else "another"} partition',
             'fedconcat.classifier_weighting=uniform (their average)',
             'their shared initial state_dict ' + ('copied (share_fix)' if share_fix else
                                                   'run as written (aliased to client 0)')))


def aliasing_effect(path: str, seed: int = 0, rounds: int = 4) -> tuple[common.Result,
                                                                         common.Result]:
  """The lock-step with their shared initial ``state_dict`` copied, and as written."""
  run = common.ours(config(rounds, seed))
  return (lockstep(path, seed, rounds, True, ours_run=run),
          lockstep(path, seed, rounds, False, ours_run=run))
