"""SCDPFL (Chen et al., NeurIPS 2023) beside its authors' code: spectral-dis-FL's ``util/update.py``.

Their functions run unchanged: ``LocalUpdate.update_weights`` (the generic model's local
epochs: cross-entropy plus ``lambda_g`` times the KL of the truncated spectra),
``LocalUpdate_per.update_weights`` (the personalised model's: cross-entropy plus ``lambda_l``
times the KL of the full spectra, plus their proximal term ``beta ||w_G - w_P||``),
``FedAvg_noniid`` (the ``n_k``-weighted average, ``util/fedavg.py``), ``localtest`` /
``globaltest`` (the scores). Two drivers run them:

* :func:`lockstep` (the lock-step): their ``main.py``'s loop with the generic model (GM) and
  the personalised models (PMs) held apart, as the paper has them: each client trains a copy
  of the received GM (its spectral teacher: its PM at the round's start) and its own PM
  (teacher: the received GM, main.py:97), then the server averages the GM copies. Every PM
  and the GM are compared after every round.
* :func:`as_written`: their ``main.py`` itself, run as ``__main__``. Two aliases there make it
  another algorithm: ``l_model=netglob`` (main.py:71) makes the "personal" model the global
  model object, so a client's ``l_model.load_state_dict(p_net_list[idx])`` overwrites
  ``netglob``: both branches of every client start from the client's own PM and the average is
  overwritten before anybody trains from it; ``p_net_list = [l_model.state_dict()]*N``
  (main.py:72) holds the live tensors of that model until a client is first visited, so in
  round 1 every client starts from the previous client's PM. Its printed "local test acc" is
  the last client's only (``acc_per_s = []`` inside the client loop, main.py:87).
  ``fixes=('l_model', 'p_net_list')`` replaces the two lines by copies (:data:`ALIASES`, a
  measurement, not needed to run); main.py then is :func:`lockstep`'s loop, to 2e-7.

Around their code the driver supplies:

* the data: ``LocalUpdate.train_test`` and ``LocalUpdate_per.train_test`` (the one run-time
  patch, a data-loading path) return a loader of fedjax_kd's minibatches, the GM copy's of
  fedjax_kd's phase ``'train'``, the PM's of phase ``'custom'``, one pass per epoch;
* the model: fedjax_kd's MLP as a ``torch.nn.Sequential`` holding fedjax_kd's initial server
  weights (their ``p_net_list`` starts every PM from the GM's initial weights);
* the args: fedjax_kd's learning rate, momentum, batch size, epochs; ``lambda_g``, ``lambda_l``,
  ``ratio`` their and fedjax_kd's defaults; ``beta = 0`` (their ``options.py`` default is 0.2,
  the README's runs use 5; fedjax_kd has no proximal term: :func:`prox_effect`);
* for :func:`as_written` also empty ``options``, ``util.data``, ``util.dataset``, ``model`` and
  ``model.build_model`` modules with ``args_parser``, ``myDataset`` and ``build_model`` (their
  CIFAR loaders need torchvision and downloads, their nets are ResNets), and ``localtest`` /
  ``globaltest`` wrapped to record (they still run) and to read main.py's models.

fedjax_kd options set: ``scdpfl.lambda_g = scdpfl.lambda_l = 0``: their spectra are computed in
NumPy from ``.data`` (update.py:11-54), outside autograd, so their spectral terms add a
constant to the loss and nothing to the gradient, whatever the lambdas (fedjax_kd
differentiates them: :func:`spectral_effect`). ``clients.shared_init = True``: their PMs start
from the GM's initial weights (fedjax_kd's default gives each client its own draw).
``data.per_client_test = True``: their ``localtest`` scores each PM on the client's own test
split (``dict_localtest``), as fedjax_kd's ``test_acc``. ``train.fresh_optimizer = True``
matters only with momentum: their PM optimizer is built anew every round (update.py:168),
fedjax_kd's PM keeps its own (:func:`momentum_effect`).

Measured (seed 0, 3 rounds): the lock-step holds at 1.8e-7 (4.2e-7 over 10 rounds), PM UA and
GM accuracy equal. Against it: fedjax_kd's differentiated spectral terms 2.7e-2 (UA equal, GM
accuracy within 1.3 points); PM momentum 0.5 kept across rounds 4.7e-2 (UA +2 points; fresh:
1.2e-7); their ``beta`` 0.2 / 5: 8e-2 / 0.28; main.py as written 0.37 (UA 0.71 vs 0.70, GM
0.41 vs 0.27).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import runpy
import sys
import tempfile

import numpy as np

from benchmarks.references.authors import common

RATIO = 0.4       # their options.py --ratio (fedjax_kd's default)
LAMBDA_G = 0.3    # their options.py --lambda_g (fedjax_kd's default)
LAMBDA_L = 0.4    # their options.py --lambda_l (fedjax_kd's default)


def config(rounds: int = 3, seed: int = 0, differentiated: bool = False, momentum: float = 0.0,
           fresh_optimizer: bool = True):
  """The tiny setting; ``differentiated``: fedjax_kd's spectral terms at their defaults (else
  off, as their gradient is in the authors' code)."""
  lam = {} if differentiated else {'scdpfl.lambda_g': 0.0, 'scdpfl.lambda_l': 0.0}
  return common.tiny('scdpfl', rounds, seed=seed,
                     **{'data.per_client_test': True, 'clients.shared_init': True,
                        'train.momentum': momentum, 'train.fresh_optimizer': fresh_optimizer,
                        **lam})


@contextlib.contextmanager
def _imported_from(path: str, stubs: dict | None = None):
  """:func:`common.imported_from`, yielding their ``util.update``."""
  with common.imported_from(path, stubs):
    yield importlib.import_module('util.update')


class _EpochLoader:
  """A train loader of fedjax_kd's minibatches: each ``iter()`` is the next epoch's pass."""

  def __init__(self, x, y, steps: list[np.ndarray], epochs: int):
    import torch  # pylint: disable=g-import-not-at-top
    self.x, self.y = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))
    per = len(steps) // epochs
    assert per * epochs == len(steps), (len(steps), epochs)
    self.epochs = [steps[e * per:(e + 1) * per] for e in range(epochs)]
    self.done = 0

  def __len__(self):
    return len(self.epochs[0])

  def __iter__(self):
    import torch  # pylint: disable=g-import-not-at-top
    steps = self.epochs[self.done]
    self.done += 1
    return iter([(self.x[torch.from_numpy(j)], self.y[torch.from_numpy(j)]) for j in steps])


class _Harness:
  """What both drivers share: the data in their format, the patched loaders, the comparison."""

  def __init__(self, run: common.Ours, beta: float, momentum: float):
    import torch  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.run = run
    s = run.setting
    self.k = len(s.client_rows)
    self.epochs, self.batch_size, self.lr = s.train
    self.data = [run.client_data(k) for k in range(self.k)]
    sizes = [len(y) for _, y in self.data]
    starts = np.cumsum([0] + sizes)
    # Their dataset_train / dict_users: the clients' rows one after another.
    self.dict_users = {k: list(range(starts[k], starts[k + 1])) for k in range(self.k)}
    self.owner = {starts[k]: k for k in range(self.k)}
    x = np.concatenate([d[0] for d in self.data])
    y = np.concatenate([d[1] for d in self.data])
    self.dataset_train = torch.utils.data.TensorDataset(
        common.nchw(x), torch.from_numpy(np.asarray(y, np.int64)))
    self.dataset_test = torch.utils.data.TensorDataset(
        common.nchw(s.x_test), torch.from_numpy(np.asarray(s.y_test, np.int64)))
    self.dict_localtest = {k: [int(i) for i in s.client_test_rows[k]] for k in range(self.k)}
    self.calls: dict[tuple[str, int], int] = {}
    self.args = common.namespace(
        lr=self.lr, momentum=momentum, local_bs=self.batch_size, local_ep=self.epochs,
        device='cpu', ratio=RATIO, lambda_g=LAMBDA_G, lambda_l=LAMBDA_L, beta=beta, mixup=False,
        model='mlp', seed=0, rounds=len(run.rows), frac=1.0, num_users=self.k,
        num_classes=s.num_classes, dataset='fedjax_kd', iid=False, non_iid_prob_class=1.0,
        alpha_dirichlet=0.0, balanced_global=False, IF=1.0)
    self.diffs, self.pm_acc, self.gm_acc, self.printed_pm_acc = [], [], [], []

  def net(self, variables=None):
    return common.torch_model(self.run, variables or self.run.server(0))

  def loader(self, phase: str, idxs) -> _EpochLoader:
    """Client ``owner(idxs)``'s minibatches of ``phase`` in its next round (a call count)."""
    k = self.owner[int(list(idxs)[0])]
    t = self.calls.get((phase, k), 0) + 1
    self.calls[(phase, k)] = t
    x, y = self.data[k]
    return _EpochLoader(x, y, self.run.order(t, k, phase, len(y), self.epochs, self.batch_size),
                        self.epochs)

  @contextlib.contextmanager
  def patched(self, update):
    """The run-time patch: their two ``train_test`` give fedjax_kd's minibatches."""
    saved = update.LocalUpdate.train_test, update.LocalUpdate_per.train_test
    update.LocalUpdate.train_test = lambda _, ds, idxs: (self.loader('train', idxs), None)
    update.LocalUpdate_per.train_test = lambda _, ds, idxs: (self.loader('custom', idxs), None)
    try:
      yield
    finally:
      update.LocalUpdate.train_test, update.LocalUpdate_per.train_test = saved

  def compare(self, t: int, pm_states: list, gm_state) -> None:
    """Every PM and the GM against fedjax_kd's after round ``t``."""
    d = []
    for k in range(self.k):
      m = self.net()
      m.load_state_dict(pm_states[k])
      d.append(common.max_diff(m, self.run.client(t, k)))
    m = self.net()
    m.load_state_dict(gm_state)
    d.append(common.max_diff(m, self.run.server(t)))
    self.diffs.append(max(d))

  def result(self, what: str, notes: tuple[str, ...]) -> common.Result:
    rows = self.run.rows
    notes = notes + (
        'global accuracy (GM, server test set) ours '
        f'{[round(r["global_acc"], 4) for r in rows]} theirs '
        f'{[round(a, 4) for a in self.gm_acc]}',)
    return common.Result(
        baseline='scdpfl', repo=common.REPOS['scdpfl'], rounds=len(rows),
        param_diff=self.diffs, acc_ours=[r['test_acc'] for r in rows],
        acc_theirs=self.pm_acc, what=what, notes=notes)


def lockstep(path: str, seed: int = 0, rounds: int = 3, beta: float = 0.0,
             ours_run: common.Ours | None = None) -> common.Result:
  """Their classes in their ``main.py``'s loop with the GM and the PMs apart (module
  docstring); every PM and the GM compared after each round; accuracy: the PMs' UA."""
  common.need_torch()
  run = ours_run or common.ours(config(rounds, seed))
  momentum = float(run.setting.spec.train.momentum)
  h = _Harness(run, beta, momentum)
  with _imported_from(path) as update:
    FedAvg_noniid = importlib.import_module('util.fedavg').FedAvg_noniid  # pylint: disable=invalid-name
    with h.patched(update):
      args = h.args
      np.random.seed(seed)
      netglob = h.net()
      pms = [h.net() for _ in range(h.k)]   # their p_net_list: the GM's initial weights
      for t in range(1, len(run.rows) + 1):
        users = np.random.choice(range(h.k), h.k, replace=False)   # their draw (frac 1)
        w_locals, accs = [], {}
        for idx in users:
          local = update.LocalUpdate(args=args, dataset=h.dataset_train, idxs=h.dict_users[idx])
          w_local, _ = local.update_weights(net=copy.deepcopy(netglob), seed=args.seed,
                                            w_g=pms[idx], epoch=args.local_ep)
          w_locals.append(copy.deepcopy(w_local))
          localp = update.LocalUpdate_per(args=args, dataset=h.dataset_train,
                                          idxs=h.dict_users[idx])
          w_p, _ = localp.update_weights(net=copy.deepcopy(pms[idx]), seed=args.seed,
                                         w_g=netglob, epoch=args.local_ep)
          pms[idx].load_state_dict(copy.deepcopy(w_p))
          accs[idx] = update.localtest(copy.deepcopy(pms[idx]), update.DatasetSplit(
              h.dataset_test, h.dict_localtest[idx]), args)
        w_glob = FedAvg_noniid(w_locals, [len(h.dict_users[i]) for i in users])
        netglob.load_state_dict(copy.deepcopy(w_glob))
        h.gm_acc.append(update.globaltest(copy.deepcopy(netglob), h.dataset_test, args))
        h.pm_acc.append(float(np.mean([accs[k] for k in range(h.k)])))
        h.compare(t, [p.state_dict() for p in pms], netglob.state_dict())
  spec = run.setting.spec
  lam = (spec.options.lambda_g, spec.options.lambda_l)
  return h.result(
      'every PM and the GM after each round; accuracy: the PMs\' mean accuracy on their '
      'clients\' test splits (UA)',
      (f'fedjax_kd scdpfl.lambda_g, lambda_l = {lam} (theirs {LAMBDA_G}, {LAMBDA_L}, no '
       f'gradient); beta {beta}; momentum {momentum}, fedjax_kd train.fresh_optimizer '
       f'{spec.train.fresh_optimizer}',))


# The two aliases of their main.py, and the copies that undo them (:func:`as_written`'s
# ``fixes``, a measurement: with both undone, main.py is :func:`lockstep`'s loop).
ALIASES = {
    'l_model': ('l_model=netglob', 'l_model=copy.deepcopy(netglob)'),
    'p_net_list': ('p_net_list = [l_model.state_dict()]*args.num_users',
                   'p_net_list = [copy.deepcopy(l_model.state_dict()) '
                   'for _ in range(args.num_users)]'),
}


def as_written(path: str, seed: int = 0, rounds: int = 3, beta: float = 0.0,
               ours_run: common.Ours | None = None, fixes: tuple[str, ...] = ()) -> common.Result:
  """Their ``main.py`` unchanged (run as ``__main__``), against fedjax_kd's aligned run;
  ``fixes``: names in :data:`ALIASES` whose line is replaced by its copy before it runs."""
  torch = common.need_torch()
  run = ours_run or common.ours(config(rounds, seed))
  momentum = float(run.setting.spec.train.momentum)
  h = _Harness(run, beta, momentum)
  h.args.seed, h.args.rounds = seed, len(run.rows)

  class MyDataset:
    def __init__(self, args):
      self.args = args

    def get_args(self):
      return self.args

    def get_imbalanced_dataset(self, args):
      args.device = 'cpu'
      return h.dataset_train, h.dataset_test, h.dict_users, h.dict_localtest

    get_balanced_dataset = get_imbalanced_dataset

  stubs = {name: common.stub(name) for name in
           ('options', 'util.data', 'util.dataset', 'model', 'model.build_model')}
  stubs['options'].args_parser = lambda: h.args
  stubs['util.data'].myDataset = MyDataset
  stubs['model.build_model'].build_model = lambda args: h.net()
  stubs['model'].__path__ = []
  seen: dict[int, float] = {}
  with _imported_from(path, stubs) as update:
    real_local, real_global = update.localtest, update.globaltest

    def localtest(net, dataset, args):
      a = real_local(net, dataset, args)
      seen[h.owner_test[tuple(dataset.idxs)]] = a
      return a

    def globaltest(net, dataset, args):
      a = real_global(net, dataset, args)
      g = sys._getframe(1).f_globals   # pylint: disable=protected-access  main.py's
      h.gm_acc.append(a)
      h.pm_acc.append(float(np.mean([seen[k] for k in range(h.k)])))
      h.printed_pm_acc.append(float(g['acc_per']))
      h.compare(int(g['rnd']) + 1, [copy.deepcopy(p) for p in g['p_net_list']],
                g['netglob'].state_dict())
      return a

    h.owner_test = {tuple(v): k for k, v in h.dict_localtest.items()}
    update.localtest, update.globaltest = localtest, globaltest
    cwd = os.getcwd()
    try:
      with h.patched(update), tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)   # their results/ file
        main = os.path.join(path, 'main.py')
        if not fixes:
          runpy.run_path(main, run_name='__main__')
        else:
          with open(main, encoding='utf-8') as f:
            src = f.read()
          for name in fixes:
            old, new = ALIASES[name]
            assert src.count(old) == 1, old
            src = src.replace(old, new)
          exec(compile(src, main, 'exec'), {'__name__': '__main__', '__file__': main})  # pylint: disable=exec-used
    finally:
      os.chdir(cwd)
      update.localtest, update.globaltest = real_local, real_global
  del torch
  return h.result(
      'their main.py as written: every PM (p_net_list) and the GM (netglob) after each round; '
      'accuracy: the PMs\' UA',
      (f'their printed "local test acc" (last client only): {h.printed_pm_acc}',
       f'aliases undone: {list(fixes) or "none"}'))


def spectral_effect(path: str, seed: int = 0, rounds: int = 3) -> common.Result:
  """fedjax_kd's differentiated spectral terms (its defaults) against their code."""
  return lockstep(path, seed, rounds, ours_run=common.ours(config(rounds, seed, True)))


def prox_effect(path: str, seed: int = 0, rounds: int = 3, beta: float = 5.0) -> common.Result:
  """Their proximal term at the README's ``beta`` against fedjax_kd (which has none)."""
  return lockstep(path, seed, rounds, beta=beta)


def momentum_effect(path: str, seed: int = 0, rounds: int = 3,
                    momentum: float = 0.5) -> tuple[common.Result, common.Result]:
  """Their default momentum 0.5: fedjax_kd with a fresh optimizer a round (as theirs), and with
  the PM's kept (fedjax_kd's default)."""
  fresh = lockstep(path, seed, rounds, ours_run=common.ours(config(rounds, seed, False,
                                                                     momentum, True)))
  kept = lockstep(path, seed, rounds, ours_run=common.ours(config(rounds, seed, False,
                                                                    momentum, False)))
  return fresh, kept
