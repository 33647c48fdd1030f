"""FedCache (Wu et al., IEEE TMC 2024) beside its authors' code: wuzhiyuan2000/FedCache.

Their ``FedCache_standalone_API.do_fedcache_stand_alone`` (``FedCache.py``) runs, its own loop
included: the one-time hashing of every private sample, ``KnowledgeCache`` (one HNSW index per
class from ``hnswlib``, ``build_relation``, ``fetch_knowledge_single`` /
``set_knowledge_single``), ``knowledge_avg_single`` (the R-mean), ``utils.KL_Loss`` (T = 3,
``T^2``, batch mean, the teacher's ``+1e-7``), ``CE + alpha * KL``, a fresh
``torch.optim.SGD(momentum=0.9)`` per client and round, and their per-client test. Around it
the driver supplies:

* the encoder: ``torchvision`` is not installed here; its stub's ``mobilenet_v3_small`` is a
  module whose first child is fedjax_kd's hash (the flattened normalised input times
  fedjax_kd's fixed random projection, ``fedcache.hash_dim`` = 576, drawn from the run's
  key as ``FedCache.build_cache`` draws it) in place of their ImageNet MobileNetV3 (nothing
  pretrained offline; fedjax_kd's choice, docs/papers.md), and ``transforms.Compose`` is the
  identity (their ``Resize(224)`` feeds only the encoder);
* the models: fedjax_kd's MLP twins (``common.torch_model``) with fedjax_kd's initial weights,
  in place of their ResNets;
* the data: per client a loader of fedjax_kd's minibatches (their code enumerates it once
  and keys each sample by its position in that sequence); one test loader per client holding
  the server's test set (fedjax_kd's ``test_acc`` without ``data.per_client_test``);
* the args: ``lr`` 0.1, ``wd`` 0, ``alpha`` 1.5 (= ``fedcache.beta``), ``R`` 16, ``T`` 1
  (their teacher scale; ``KL_Loss``'s own T = 3 is ``fedcache.temperature``),
  ``interval = sel = 1`` (every client tested every round);
* run-time patches to run at all: ``Tensor.cuda`` / ``Module.cuda`` return ``self`` (CPU);
  their module's ``print`` records the accuracies it prints.

fedjax_kd runs ``train.momentum = 0.9`` and ``train.fresh_optimizer = True`` (their hard-coded
optimizer, rebuilt every round); everything else is fedjax_kd's default (``fedcache.*`` are
their values).

Their code and fedjax_kd's differ in four documented ways. Each is a switch of ``align``;
an aligned switch makes their run do what fedjax_kd does (a run-time patch, named here), an
unaligned one leaves their code as it is:

* ``'order'``: their README demands ``shuffle=False``: one fixed minibatch order every round
  (their cache keys a sample by its position). fedjax_kd reshuffles every round. Aligned:
  the loader's setup order is the identity, each round's batch tensors are refilled in place
  with fedjax_kd's round order, and a ``KnowledgeCache`` subclass maps their position key to
  the sample. Unaligned: fedjax_kd's round-1 order every round.
* ``'partial'``: their README demands ``drop_last=True``: a client's last ``n mod B`` samples
  are never trained on nor cached (nor related). fedjax_kd keeps the partial last batch.
  Aligned: the loader keeps it. Unaligned: it is dropped.
* ``'reads'``: their clients run in sequence and write each sample's logits as they go, so a
  later sample (of this or a later client of the round) reads fresh ones. fedjax_kd's clients
  read the cache as the round began. Aligned: the subclass holds writes until the round ends.
* ``'uploads'``: they write the training forward pass's logits (before the step). fedjax_kd
  uploads inference-mode logits of the trained model after training. Aligned: training-pass
  writes are dropped; after each client (with live reads) or at the round's end its
  ``model.eval()`` logits of every sample go in through their ``set_knowledge``.
* ``'kl_eps'``: their ``KL_Loss`` adds ``1e-7`` to the teacher; fedjax_kd drops it. Aligned:
  ``utils.KL_Loss.forward`` without it (not aligned by default: float-rounding sized).

:func:`effects` measures each. The relation (their HNSW neighbours vs fedjax_kd's exact
top-R) and, in the aligned run, the cache rows are compared as well (``Result.notes``).
The aligning patches are run-time only: ``FedCache.KnowledgeCache`` is replaced by a subclass
(``fetch_knowledge_single`` / ``set_knowledge_single`` wrapped, their bodies run), and the
driver writes uploads through the base class's ``set_knowledge_single``.

Measured (seed 0, 3 rounds, 3 clients of 165 samples): aligned, every client parameter
within 5.4e-7 (1.8e-7 with ``kl_eps`` too), the same accuracies, the same relation. Each
difference left as theirs moves the parameters by 0.15-0.2 in 3 rounds and the accuracy by
up to 5 points (``effects``); all left as theirs: 0.29.

Needs ``hnswlib`` (their cache's index; the ``authors`` extra).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

from benchmarks.references.authors import common

SWITCHES = ('order', 'partial', 'reads', 'uploads', 'kl_eps')
# What the lock-step aligns: fedjax_kd's documented schedule; their loss as it is.
ALIGN = ('order', 'partial', 'reads', 'uploads')


def config(rounds: int = 3, seed: int = 0):
  """The tiny FedCache setting with their optimizer: SGD, momentum 0.9, new every round."""
  return common.tiny('fedcache', rounds, seed=seed,
                     **{'train.momentum': 0.9, 'train.fresh_optimizer': True})


@contextlib.contextmanager
def _on_cpu(starts: dict):
  """``.cuda()`` is the identity; a model's ``.cuda()`` also calls ``starts[id(model)]``
  (their loop calls it as each client starts training)."""
  import torch  # pylint: disable=g-import-not-at-top
  saved = torch.Tensor.cuda, torch.nn.Module.cuda

  def module_cuda(self, *a, **k):
    del a, k
    if id(self) in starts:
      starts[id(self)]()
    return self

  torch.Tensor.cuda = lambda self, *a, **k: self
  torch.nn.Module.cuda = module_cuda
  try:
    yield
  finally:
    torch.Tensor.cuda, torch.nn.Module.cuda = saved


def _projection(run: common.Ours) -> np.ndarray | None:
  """fedjax_kd's hash projection, as ``FedCache.build_cache`` draws it."""
  import math  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import rng  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops import related_knowledge as rk  # pylint: disable=g-import-not-at-top
  o = run.setting.spec.options
  hash_dim = o.hash_dim
  if not hash_dim:
    return None
  d_in = math.prod(run.setting.x_private.shape[1:])
  return np.asarray(rk.projection(rng.server_key(run.exp.ctx.root, 0, 'custom'), d_in,
                                  hash_dim))


def lockstep(path: str, seed: int = 0, rounds: int = 3, align=ALIGN,
             ours_run: common.Ours | None = None) -> common.Result:
  """Runs ``rounds`` rounds of their FedCache beside fedjax_kd's (``align``: the switches of
  the module docstring that make their run follow fedjax_kd's choice)."""
  torch = common.need_torch()
  try:
    import hnswlib  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise common.Unavailable('hnswlib (their neighbour search) is not installed: '
                             'pip install hnswlib') from e
  nn = torch.nn
  bad = set(align) - set(SWITCHES)
  if bad:
    raise ValueError(f'unknown switches {sorted(bad)}; known: {SWITCHES}')
  if 'order' in align and 'partial' not in align:
    raise ValueError("drop_last needs their fixed order: leave 'partial' aligned with 'order'")
  run = ours_run or common.ours(config(rounds, seed))
  s = run.setting
  o = s.spec.options
  epochs, batch_size, lr = s.train
  assert epochs == 1, 'their loop runs one pass a round'
  k_clients = len(s.client_rows)
  data = [run.client_data(k) for k in range(k_clients)]
  n_of = [len(y) for _, y in data]
  proj = _projection(run)

  # ---- fedjax_kd's minibatches, as their loop sees them
  def steps(t, k):
    st = run.order(t, k, 'train', n_of[k], epochs, batch_size)
    return st if 'partial' in align else [p for p in st if len(p) == batch_size]

  if 'order' in align:   # identity at setup; every round refilled in place
    setup = [[p for p in (np.arange(i, min(i + batch_size, n)) for i in range(0, n, batch_size))
              if 'partial' in align or len(p) == batch_size] for n in n_of]
  else:                  # one fixed order, round 1's, every round
    setup = [steps(1, k) for k in range(k_clients)]
  # Their key (k, p) is position p of client k's setup sequence: the sample is setup_rows[k][p].
  setup_rows = [np.concatenate(st).astype(np.int64) for st in setup]

  class Train:
    """Client ``k``'s loader: their setup enumerates it once and keeps the tensors."""

    def __init__(self, k):
      self.k = k
      x, y = data[k]
      self.batches = [(common.nchw(x[p]), torch.from_numpy(y[p].astype(np.int64)))
                      for p in setup[k]]

    def __iter__(self):
      return iter(self.batches)

    def __len__(self):
      return len(self.batches)

    def refill(self, t):
      """Round ``t``'s batches into the tensors their loop holds."""
      x, y = data[self.k]
      order = steps(t, self.k)
      assert [len(p) for p in order] == [len(b[1]) for b in self.batches]
      for (bx, by), p in zip(self.batches, order):
        bx.copy_(common.nchw(x[p]))
        by.copy_(torch.from_numpy(y[p].astype(np.int64)))
      return np.concatenate(order)

  class Hash(nn.Module):
    """fedjax_kd's sample hash: the flattened (NHWC) input times its projection."""

    def forward(self, x):
      f = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
      return f if proj is None else f @ torch.from_numpy(proj)

  class Encoder(nn.Module):
    """Stands for MobileNetV3-small: their code keeps every child but the last."""

    def __init__(self):
      super().__init__()
      self.features = Hash()
      self.classifier = nn.Identity()

  def mobilenet_v3_small(weights=None):
    del weights
    return Encoder()

  tv = common.stub('torchvision')
  tv_transforms = common.stub('torchvision.transforms')
  tv_transforms.Compose = lambda fs: (lambda x: x)
  tv_transforms.Resize = lambda size: None
  tv_models = common.stub('torchvision.models')
  tv_models.mobilenet_v3_small = mobilenet_v3_small
  tv.transforms, tv.models = tv_transforms, tv_models

  models = [common.torch_model(run, run.client(0, k)) for k in range(k_clients)]
  loaders = [Train(k) for k in range(k_clients)]
  diffs, cache_diffs, theirs_acc = [], [], []
  box = {'t': 0, 'cache': None, 'order': None, 'pending': [], 'trained': None, 'ended': 0}

  def infer_logits(k):
    m = models[k]
    m.eval()
    with torch.no_grad():
      out = m(common.nchw(data[k][0]))
    return out

  def upload_inference(k):
    """Client ``k``'s ``model.eval()`` logits of all its (cached) samples, by their method."""
    cache, out = box['cache'], infer_logits(k)
    rows = setup_rows[k]
    base_set(cache, out[rows], data[k][1][rows], [(k, p) for p in range(len(rows))])

  def base_set(cache, logits, labels, ids):
    for z, l, i in zip(logits, labels, ids):
      cache_cls.set_knowledge_single(cache, z, l, i)

  def start(k):
    """Their loop starts client ``k``'s training."""
    if k == 0:
      box['t'] += 1
    prev = box['trained']
    if prev is not None and 'uploads' in align and 'reads' not in align:
      upload_inference(prev)   # live reads: the previous client's upload goes in now
    box['trained'] = k
    if 'order' in align:
      box['order'] = loaders[k].refill(box['t'])

  def end_of_round():
    """The round's training is over (their test loop starts)."""
    cache = box['cache']
    if 'uploads' in align:
      if 'reads' in align:
        for k in range(k_clients):
          upload_inference(k)
      else:
        upload_inference(box['trained'])
    else:
      for args in box['pending']:
        cache_cls.set_knowledge_single(cache, *args)
    box['pending'], box['trained'] = [], None
    # Their cache rows beside fedjax_kd's (meaningful when the uploads are aligned).
    ours_cache = np.asarray(run.states[box['t']].extra.logits)
    d = 0.0
    for k, p in cache.idx_to_hash:
      i = setup_rows[k][p]
      z = cache.cache[int(data[k][1][i])][(k, p)]
      d = max(d, float(np.max(np.abs(z.detach().numpy() - ours_cache[s.client_rows[k][i]]))))
    cache_diffs.append(d)

  class Test:
    """Client ``k``'s test loader: the server's test set as one batch."""

    def __init__(self, k):
      self.k = k

    def __iter__(self):
      t = box['t']
      if box['ended'] < t:
        box['ended'] = t
        end_of_round()
        diffs.append(0.0)
      diffs[-1] = max(diffs[-1], common.max_diff(models[self.k], run.client(t, self.k)))
      x = common.nchw(s.x_test)
      return iter([(x, torch.from_numpy(np.asarray(s.y_test, np.int64)))])

  def record(*a, **kw):
    del kw
    if a and str(a[0]).startswith('mean Test/AccTop1 on all clients'):
      theirs_acc.append(float(a[1]) / 100)

  starts = {id(m): (lambda k=k: start(k)) for k, m in enumerate(models)}
  stubs = {'torchvision': tv, 'torchvision.transforms': tv_transforms,
           'torchvision.models': tv_models}
  with common.imported_from(path, stubs), _on_cpu(starts), warnings.catch_warnings():
    warnings.simplefilter('ignore')
    import FedCache as mod  # pylint: disable=g-import-not-at-top
    import utils as their_utils  # pylint: disable=g-import-not-at-top
    cache_cls = mod.KnowledgeCache
    mod.print = record

    class Cache(cache_cls):
      """Their cache; aligned, a position key maps to the sample and writes wait."""

      def __init__(self, *a):
        super().__init__(*a)
        box['cache'] = self

      def key(self, idx):
        if 'order' in align and box['order'] is not None and box['ended'] < box['t']:
          k, p = idx
          return (k, int(box['order'][p]))
        return idx

      def fetch_knowledge_single(self, label, idx):
        return super().fetch_knowledge_single(label, self.key(idx))

      def set_knowledge_single(self, knowledge, label, idx):
        idx = self.key(idx)
        if 'uploads' in align:
          return None   # the inference logits go in after training
        if 'reads' in align:
          box['pending'].append((knowledge, label, idx))
          return None
        return super().set_knowledge_single(knowledge, label, idx)

    mod.KnowledgeCache = Cache
    if 'kl_eps' in align:
      F = torch.nn.functional

      def forward(self, output_batch, teacher_outputs):   # theirs, less the +1e-7
        output_batch = F.log_softmax(output_batch / self.T, dim=1)
        teacher_outputs = F.softmax(teacher_outputs / self.T, dim=1)
        return self.T * self.T * nn.KLDivLoss(reduction='batchmean')(output_batch,
                                                                     teacher_outputs)
      their_utils.KL_Loss.forward = forward

    args = common.namespace(
        client_number=k_clients, class_num=s.num_classes, R=o.r, comm_round=len(run.rows),
        lr=lr, wd=s.spec.train.weight_decay, alpha=o.beta, T=1.0, interval=1, sel=1)
    assert o.temperature == their_utils.KL_Loss().T
    assert s.spec.train.momentum == 0.9 and s.spec.train.fresh_optimizer
    tests = {k: Test(k) for k in range(k_clients)}
    trains = {k: loaders[k] for k in range(k_clients)}
    nums = {k: n_of[k] for k in range(k_clients)}
    api = mod.FedCache_standalone_API(models, nums, nums, trains, tests, args, None)
    api.do_fedcache_stand_alone(models, nums, nums, trains, tests, args)
    relation_mismatch = _relation_mismatch(box['cache'], run, setup_rows)

  aligned = ', '.join(a for a in SWITCHES if a in align) or 'none'
  return common.Result(
      baseline='fedcache', repo=common.REPOS['fedcache'], rounds=len(run.rows),
      param_diff=diffs, acc_ours=[r['test_acc'] for r in run.rows], acc_theirs=theirs_acc,
      what='every client model after each round; mean client accuracy on the test set',
      notes=(f'aligned to fedjax_kd: {aligned}',
             f'samples whose R related samples differ (HNSW vs exact): {relation_mismatch}',
             'cache rows vs fedjax_kd per round: '
             + ', '.join(f'{d:.1e}' for d in cache_diffs)))


def _relation_mismatch(cache, run: common.Ours, setup_rows) -> int:
  """Samples whose set of related samples in their HNSW relation is not fedjax_kd's."""
  s = run.setting
  related = np.asarray(run.states[0].extra.related)
  valid = np.asarray(run.states[0].extra.related_valid)
  row = lambda key: int(s.client_rows[key[0]][setup_rows[key[0]][key[1]]])
  bad = 0
  for key, rel in cache.relation.items():
    i = row(key)
    ours_set = set(related[i][valid[i]].tolist())
    bad += ours_set != {row(r) for r in rel}
  return bad


def effects(path: str, seed: int = 0, rounds: int = 3) -> dict[str, common.Result]:
  """The lock-step with :data:`ALIGN` aligned; with each difference left as their code has it
  (``'partial'`` only beside ``'order'``: their ``drop_last`` drops a fixed tail); with none;
  and with their KL's ``+1e-7`` dropped too."""
  run = common.ours(config(rounds, seed))
  less = lambda *names: tuple(x for x in ALIGN if x not in names)
  cases = {'aligned': ALIGN, 'theirs:order': less('order'),
           'theirs:order+partial': less('order', 'partial'), 'theirs:reads': less('reads'),
           'theirs:uploads': less('uploads'), 'theirs:reads+uploads': less('reads', 'uploads'),
           'theirs:all': (), 'aligned+kl_eps': SWITCHES}
  return {name: lockstep(path, seed, rounds, a, ours_run=run) for name, a in cases.items()}
