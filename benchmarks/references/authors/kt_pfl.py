"""KT-pFL (Zhang et al., NeurIPS 2021) beside its authors' code: cugzj/KT-pFL.

Their class ``src/engine_kt_pfl.py:KT_pFL`` runs unchanged, its ``__init__`` (the first
private training of every client, their ``model_init_params``) and its own
``collaborative_training()`` loop included (the alignment draw, ``predict`` at ``Temp``, the
coefficient step ``get_models_logits``, the distillation ``train_one_model(...,
with_softmax=False)`` with their ``KL_loss``, the private training with cross-entropy, a
fresh ``SGD(lr=0.02)`` for each). Their cycle is fedjax_kd's shifted by half a round: their
``__init__`` training is fedjax_kd's round-1 training, their loop iteration ``i`` (predict,
``c``, distil, then train) is fedjax_kd's round ``i + 1`` steps 2-4 followed by round
``i + 2``'s training, so every model is compared after its distillation of iteration ``i``
(fedjax_kd's state after round ``i + 1``), with the coefficient matrix ``c``. Around their
class the driver supplies:

* the data: ``read_data`` / ``read_user_data`` (their module's names for their JSON readers)
  give client ``i`` fedjax_kd's training rows and its own test split
  (``data.per_client_test``, their per-user test sets); ``generate_alignment_data`` gives
  iteration ``i`` fedjax_kd's public sample of round ``i + 1`` (``Setting.draws``, i.e.
  ``algorithm.sample_public``, the same rows in the same order); ``data`` / ``data_new``
  (their ``Dataset`` classes, which repeat grey images to three channels for their
  3-channel models) are plain holders, and ``DataLoader`` yields fedjax_kd's minibatches of
  that client, round and phase (``'train'`` for private training, ``'distill'`` for the
  distillation on the public sample; soft targets as floats), a test split as one batch;
* the model: fedjax_kd's MLP of each client (its own initial weights) as a
  ``torch.nn.Sequential`` of logits;
* the args: ``KT_pFL_params`` (``N_alignment`` = ``distill.public_per_round``, one private
  epoch a round as ``train.epochs``, ``distill.epochs``, both batch sizes) and
  ``model_init_params`` (``Temp`` = ``kt_pfl.temperature``, ``penalty_ratio`` =
  ``kt_pfl.rho``, one epoch, ``train.batch_size``); their result file is written in a
  temporary folder; ``torchvision`` (imported by their ``data_utils.py`` /
  ``model_utils.py`` / ``sampling.py``, never called) as empty modules;
* fedjax_kd's side: ``common.ours`` (every state copied to the host).

Patches of their code, only what it needs to run at all here: their module's ``torch`` is a
proxy whose ``device(...)`` is the CPU (``collaborative_training`` hard-codes
``torch.device('cuda')``) and whose ``zeros(..., requires_grad=True)`` drops the flag:
``get_models_logits`` builds ``models_logits`` as a leaf that requires grad and then assigns
its rows in place, which PyTorch refuses ("a view of a leaf Variable that requires grad is
being used in an in-place operation"); the tensor is ``.detach()``-ed by its caller, so
nothing else changes.

The coefficient step. ``c_rule='fedjax_kd'`` (the lock-step) replaces their
``get_models_logits`` by fedjax_kd's step written in PyTorch (:func:`fedjax_step`: the
paper's ``lam sum_n mean_x KL(t_n || s_n) + rho ||c - 1/N||^2``, each row's gradient scaled
to L1 norm ``c_lr``, Euclidean projection on the simplex, ``t_n = sum_m c_nm s_m``);
everything else is theirs: the lock-step (3 rounds, seed 0) holds at 3e-8 for every model
and ``c``, and the accuracies agree to 2e-8. ``c_rule='theirs'`` runs their
``get_models_logits`` unchanged
(:func:`c_step_effect`): per row the MSE between the student's own predictions and the
mixture, plus ``penalty_ratio`` times the MSE of the row to ``1/N``, a step ``grad * 5^k``
with ``k`` chosen so that the row's mean absolute step lies near [0.01, 0.05), then every
row replaced by ``softmax(5 w)``: a scale-free step (like ``c_step='normalized'``, not
``'plain'``) on another loss, without projection. No fedjax_kd option gives it; its effect is
what ``c_rule='theirs'`` measures.

fedjax_kd options: ``train.learning_rate = 0.02`` (their hard-coded SGD rate, also that of
distillation through ``distill.optimizer='same'``); ``kt_pfl.lam = 1 / C``: their
``KL_loss`` is ``F.kl_div(..., reduction='mean')``, the mean over the batch *and the C
classes*, i.e. ``KL / C`` per sample, where fedjax_kd's ``_kd_loss`` is ``lam KL``;
``kt_pfl.temperature = 10`` and ``kt_pfl.rho = 0.7`` are already their ``Temp`` and
``penalty_ratio``; ``data.per_client_test = True`` (their per-user test sets);
``distill.public_per_round = 60`` (the tiny public set has 100 rows; fedjax_kd's preset draws
300). ``kt_pfl.c_step`` / ``c_lr`` keep fedjax_kd's defaults (their step has no
equivalent). Their private epochs ramp up (``local_epoch`` = 1, 2, ... up to
``N_private_training_round``) where fedjax_kd trains ``train.epochs`` every round: equal at
one epoch, as here. Their own test (``val_one_model``, batches of 8, the mean of the batch
means) scores the models before distillation; the driver scores them after it, on the whole
split as one batch, as fedjax_kd's ``test_acc``.

Found beside the lock-step (seed 0, 3 rounds; max |diff| per round):

* fedjax_kd's ``c_step='normalized'`` hardly moved ``c`` before this lock-step found it: the
  paper's gradient with the row mass held fixed is ``lam`` times ``1 +`` a small term per
  entry (the ``+1`` of ``d(t log t)``; near-uniform predictions at ``T = 10`` make the rest
  ~1e-3 of it), and the L1 normalisation scaled by that constant, which the projection then
  removed: a row moved 7e-5 in L1 in round 1 where ``c_lr = 0.1`` is meant. fedjax_kd now
  centres each row's gradient over the block first (``ops/knowledge_coeff.py``), and a row
  moves by ``c_lr`` (0.100; theirs 0.122). The centred gradient is a difference of nearly
  equal float32 terms, so ``c`` agrees to 3.3e-4 by round 3 (0.3% of a step), not to 1e-7;
  ``param_diff`` is the models'. With ``c_rule='theirs'``: ``c`` differs by 3.5e-2, 7.1e-2,
  1.1e-1, the models by 7e-7 to 6.4e-6 (distillation towards near-uniform targets is weak
  here), the accuracies agree to 1e-8.
* ``kt_pfl.lam``'s default 1 against their ``KL / C``: with ``c`` aligned, the models differ by
  1.3e-4, 4.7e-4, 7.2e-4 (accuracies equal to 1e-4 in this setting).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import warnings

import numpy as np

from benchmarks.references.authors import common

PUBLIC_PER_ROUND = 60
LR = 0.02            # their SGD(lr=0.02) in every phase
C_RULES = ('fedjax_kd', 'theirs')


def config(rounds: int = 3, seed: int = 0, **overrides):
  """The tiny KT-pFL experiment; ``overrides`` (dotted fields) on top, e.g. fedjax_kd's
  defaults back (``{'kt_pfl.lam': 1.0}``) to measure them."""
  num_classes = 10   # the synthetic digits
  base = {'train.learning_rate': LR, 'kt_pfl.lam': 1.0 / num_classes,
          'data.per_client_test': True, 'distill.public_per_round': PUBLIC_PER_ROUND}
  return common.tiny('kt_pfl', rounds, seed=seed, **{**base, **overrides})


class _Stop(Exception):
  """Raised in their loop after the last compared round."""


class _Held:
  """Their ``data`` / ``data_new``: the arrays as given (the loader picks the rows)."""

  def __init__(self, x, y):
    self.X, self.y = x, y


class _Loader:
  """Yields ``(x[j] NCHW, y[j])`` for each position array ``j`` of ``steps``, one epoch
  (``per_epoch`` steps) per iteration: their ``train_one_model`` iterates the loader once an
  epoch."""

  def __init__(self, x, y, steps, per_epoch: int, soft: bool):
    import torch  # pylint: disable=g-import-not-at-top
    self.x = common.nchw(x)
    self.y = torch.from_numpy(np.asarray(y, np.float32 if soft else np.int64))
    self.steps, self.per_epoch, self.epoch = steps, per_epoch, 0

  def __len__(self):
    return self.per_epoch

  def __iter__(self):
    import torch  # pylint: disable=g-import-not-at-top
    e, self.epoch = self.epoch, self.epoch + 1
    for j in self.steps[e * self.per_epoch:(e + 1) * self.per_epoch]:
      j = torch.from_numpy(np.asarray(j, np.int64))
      yield self.x[j], self.y[j]


class _TorchProxy:
  """Their module's ``torch``: the CPU for ``device``, no grad flag on ``zeros`` (docstring)."""

  def __init__(self, torch):
    self._torch = torch

  def __getattr__(self, name):
    return getattr(self._torch, name)

  def device(self, *args, **kwargs):
    del args, kwargs
    return self._torch.device('cpu')

  def zeros(self, *args, requires_grad=False, **kwargs):
    del requires_grad
    return self._torch.zeros(*args, **kwargs)


def _project_simplex(torch, v, mass):
  """Each row of ``v`` onto ``{x >= 0, sum x = mass}`` (fedjax_kd's ``project_simplex``)."""
  u = torch.sort(v, dim=1, descending=True).values
  css = torch.cumsum(u, dim=1)
  j = torch.arange(1, v.shape[1] + 1, dtype=v.dtype)
  ok = (u - (css - mass[:, None]) / j) > 0
  rho = torch.clamp(ok.sum(1), min=1)
  tau = (css.gather(1, (rho - 1)[:, None])[:, 0] - mass) / rho
  return torch.clamp(v - tau[:, None], min=0.0)


def fedjax_step(raw_logits, weight, lam: float, rho: float, lr: float, normalize: bool):
  """fedjax_kd's coefficient step (``ops/knowledge_coeff.py``) in PyTorch, with their
  ``get_models_logits``' signature of results: ``(targets [N, m, C], new c [N, N])``.

  Args:
    raw_logits: per client, its soft predictions ``softmax(z / T)`` ``[m, C]`` (numpy).
    weight: ``c`` ``[N, N]`` before the step.
  """
  import torch  # pylint: disable=g-import-not-at-top
  s = torch.from_numpy(np.stack(raw_logits).astype(np.float32))
  n = s.shape[0]
  c = weight.detach().clone().float().requires_grad_(True)
  mass = torch.clamp(c.sum(1, keepdim=True), min=1e-30).detach()
  t = torch.einsum('nj,jmc->nmc', c / mass, s)
  logt = torch.log(torch.clamp(t, min=1e-30))
  logs = torch.log(torch.clamp(s, min=1e-30))
  kl = torch.where(t > 0, t * (logt - logs), torch.zeros(())).sum(-1).mean(-1)
  loss = lam * kl.sum() + rho * ((c - 1.0 / n) ** 2).sum()
  (g,) = torch.autograd.grad(loss, c)
  with torch.no_grad():
    g = g - g.mean(1, keepdim=True)   # along each row's constraint
    if normalize:
      g = g / torch.clamp(g.abs().sum(1, keepdim=True), min=1e-30)
    new = _project_simplex(torch, c - lr * g, c.sum(1))
    w = new / torch.clamp(new.sum(1, keepdim=True), min=1e-30)
    targets = torch.einsum('nj,jmc->nmc', w, s)
  return targets, new


def lockstep(path: str, seed: int = 0, rounds: int = 3, c_rule: str = 'fedjax_kd',
             ours_run: common.Ours | None = None, **overrides) -> common.Result:
  """fedjax_kd's ``rounds`` beside their ``KT_pFL`` on the same weights, draws and batches.

  Args:
    c_rule: ``'fedjax_kd'``: their coefficient step replaced by fedjax_kd's (the lock-step);
      ``'theirs'``: their ``get_models_logits`` unchanged (the effect of the step).
    overrides: fedjax_kd config fields over :func:`config` (their side does not change).

  Returns:
    Per round, the largest difference over every client model and ``c``; the mean of the
    clients' accuracies on their own test splits after distillation, on both sides (theirs
    with their ``val_one_model``, on the split as one batch).
  """
  if c_rule not in C_RULES:
    raise ValueError(f'c_rule={c_rule!r}: one of {C_RULES}')
  torch = common.need_torch()
  run = ours_run or common.ours(config(rounds, seed, **overrides))
  s = run.setting
  o = s.spec.options
  epochs, batch_size, _ = s.train
  d_epochs, d_batch, _ = s.distill
  rounds = len(run.rows)
  k_clients = len(s.client_rows)
  train = [run.client_data(k) for k in range(k_clients)]
  tests = [(s.x_test[r], s.y_test[r]) for r in s.client_test_rows]
  pub_x, pub_y = s.x_public, s.y_public
  m = s.draws.shape[1]

  box = {'it': -1, 'k': None, 'algo': None}
  diffs = [[0.0] for _ in range(rounds)]     # the client models
  c_diffs = [0.0] * rounds
  accs = [[None] * k_clients for _ in range(rounds)]
  c_seen = [None] * rounds

  def read_data(name):
    del name

  def read_user_data(index, newdata, dataset):
    del newdata, dataset
    box['k'] = index
    return train[index][0], train[index][1], tests[index][0], tests[index][1]

  def generate_alignment_data(x, y, n_alignment):
    del x, y
    box['it'] += 1
    if box['it'] >= rounds:
      raise _Stop
    idx = s.draws[box['it']]
    assert n_alignment == m == len(idx)
    return {'idx': idx, 'X': pub_x[idx], 'y': pub_y[idx]}

  def loader(dataset, **kwargs):   # their batch_size / shuffle: fedjax_kd's minibatches instead
    del kwargs
    k, it = box['k'], box['it']
    for x_test, y_test in tests:                         # a test split: one batch
      if dataset.X is x_test:
        return _whole(x_test, y_test)
    if dataset.X is train[k][0]:                         # private training
      n = len(dataset.y)
      if it >= 0:   # distillation of iteration it is done: fedjax_kd's round it + 1
        model = box['algo'].collaborative_parties[k]
        diffs[it].append(common.max_diff(model, run.client(it + 1, k)))
        accs[it][k] = mod.val_one_model(model, _whole(*tests[k]), None, torch.device('cpu'))
      # round it + 2's training (past the last round: a key fedjax_kd derives the same way;
      # it trains after the last comparison, and their loop stops at the next draw)
      steps = run.order(it + 2, k, 'train', n, epochs, batch_size)
      return _Loader(dataset.X, dataset.y, steps, -(-n // batch_size), soft=False)
    # distillation on round it + 1's public sample, towards client k's target
    steps = run.order(it + 1, k, 'distill', m, d_epochs, d_batch)
    return _Loader(dataset.X, dataset.y, steps, -(-m // d_batch), soft=True)

  def _whole(x, y):   # a test split as one batch
    return _Loader(x, y, [np.arange(len(y))], 1, soft=False)

  def record(step):
    def wrapped(raw_logits, weight_alpha, n_models, penalty_ratio):
      targets, weight = step(raw_logits, weight_alpha, n_models, penalty_ratio)
      it = box['it']
      c_seen[it] = weight.detach().numpy().copy()
      c_diffs[it] = float(np.max(np.abs(c_seen[it] - np.asarray(run.states[it + 1].extra.c))))
      return targets, weight
    return wrapped

  stubs = {name: common.stub(name) for name in
           ('torchvision', 'torchvision.datasets', 'torchvision.transforms')}
  stubs['torchvision'].datasets = stubs['torchvision.datasets']
  stubs['torchvision'].transforms = stubs['torchvision.transforms']
  src = os.path.join(path, 'src')
  cwd = os.getcwd()
  with common.imported_from(src, stubs), tempfile.TemporaryDirectory() as tmp, \
       warnings.catch_warnings():
    warnings.simplefilter('ignore')
    import engine_kt_pfl as mod  # pylint: disable=g-import-not-at-top
    mod.torch = _TorchProxy(torch)
    mod.read_data, mod.read_user_data = read_data, read_user_data
    mod.generate_alignment_data = generate_alignment_data
    mod.data = mod.data_new = _Held
    mod.DataLoader = loader
    if c_rule == 'fedjax_kd':
      step = lambda raw, w, n, p: fedjax_step(raw, w, o.lam, p, o.c_lr,
                                              o.c_step == 'normalized')
    else:
      step = mod.get_models_logits
    mod.get_models_logits = record(step)

    parties = [common.torch_model(run, run.client(0, k)) for k in range(k_clients)]
    params = {'N_alignment': m, 'N_rounds': rounds, 'N_logits_matching_round': d_epochs,
              'logits_matching_batchsize': d_batch, 'N_private_training_round': epochs,
              'private_training_batchsize': batch_size}
    init = {'epochs': epochs, 'min_delta': 0.001, 'patience': 10, 'batch_size': batch_size,
            'is_shuffle': True, 'num_workers': 0, 'Temp': o.temperature,
            'penalty_ratio': o.rho}
    bounds = {'epochs': 0, 'min_delta': 0.001, 'patience': 10, 'batch_size': batch_size,
              'is_shuffle': True, 'num_workers': 0}
    os.makedirs(os.path.join(tmp, 'result'))
    os.chdir(tmp)
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        np.random.seed(seed)
        torch.manual_seed(seed)
        algo = mod.KT_pFL(parties, {'X': pub_x, 'y': pub_y}, None, None, None, params, init,
                          bounds, device='cpu')
        box['algo'] = algo
        try:
          algo.collaborative_training()
        except _Stop:
          pass
    finally:
      os.chdir(cwd)
  acc_theirs = [float(np.mean(a)) for a in accs]
  notes = [f'c_rule={c_rule}' + (' (their get_models_logits replaced by fedjax_kd\'s step)'
                                 if c_rule == 'fedjax_kd' else ' (their get_models_logits)'),
           f'kt_pfl.lam={o.lam:g} c_step={o.c_step} c_lr={o.c_lr:g} T={o.temperature:g} '
           f'rho={o.rho:g}']
  notes.append('per round, models / c: ' + ', '.join(
      f'{max(d):.1e} / {e:.1e}' for d, e in zip(diffs, c_diffs))
               + f' (c within {max(c_diffs) / o.c_lr:.1%} of a step: the centred gradient is a '
               'difference of nearly equal float32 terms, which the normalised step scales up)')
  if c_seen[0] is not None:
    move = lambda c: float(np.abs(c - 1.0 / k_clients).sum(1).mean())
    notes.append(f'round-1 c, mean row L1 from uniform: theirs {move(c_seen[0]):.4f}, '
                 f'ours {move(np.asarray(run.states[1].extra.c)):.4f}')
  return common.Result(
      baseline='kt_pfl', repo=common.REPOS['kt_pfl'], rounds=rounds,
      param_diff=[max(d) for d in diffs],
      acc_ours=[r['test_acc'] for r in run.rows],
      acc_theirs=acc_theirs,
      what=('every client model after its distillation after each round (c apart: its '
            'difference is in the notes); the mean of the clients\' accuracies on their own '
            'test splits'),
      notes=tuple(notes))


def c_step_effect(path: str, seed: int = 0, rounds: int = 3, **overrides) -> common.Result:
  """The same runs with their coefficient step unchanged (``c_rule='theirs'``)."""
  return lockstep(path, seed, rounds, c_rule='theirs', **overrides)


def lam_effect(path: str, seed: int = 0, rounds: int = 3) -> common.Result:
  """The lock-step with fedjax_kd's default ``kt_pfl.lam = 1`` (their distillation: ``KL / C``)."""
  return lockstep(path, seed, rounds, **{'kt_pfl.lam': 1.0})
