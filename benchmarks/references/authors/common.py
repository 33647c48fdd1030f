"""The shared harness of the lock-steps: the authors' checkouts, fedjax_kd's side, the comparison.

A lock-step is a pair of runs that share everything an implementation does not decide:
for one config and seed, fedjax_kd's experiment gives the data split, the client partition,
the initial weights of every model and the minibatch order of every client, round and phase
(``benchmarks/references/pytorch/common.py``'s :class:`Setting` and :class:`Lockstep`). fedjax_kd
runs its rounds (:func:`ours`, through ``play_round``, as the runner does); the driver then runs the
same rounds through the authors' code, and :func:`max_diff` compares every parameter of every
model after every round. Float rounding is all that is left between the two, so the
difference stays near 1e-6 for a few rounds; a difference of the method shows at once, and
grows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.references.authors.repos import (  # pylint: disable=unused-import
    NOT_LOCKSTEPPED, REPOS, Repo)
from benchmarks.references.pytorch import common as ref

REPO = ref.REPO
# Where the checkouts are: a folder holding one ``owner+name`` clone per repository.
AUTHORS_ENV = 'FEDJAX_KD_AUTHORS'
# The largest parameter difference a lock-step accepts: float32 rounding of a few hundred
# SGD steps on a small MLP (measured: at most a few 1e-6, docs/reproduction.md's table).
PARAM_TOL = 1e-4


class Unavailable(Exception):
  """A lock-step cannot run here (no PyTorch, no checkout, a checkout at another commit)."""


def authors_dir() -> str:
  return os.environ.get(AUTHORS_ENV, '')


def checkout(baseline: str, root: str | None = None) -> str:
  """The checkout of ``baseline``'s repository under ``root`` (``$FEDJAX_KD_AUTHORS``).

  Raises:
    Unavailable: there is none, or it is not at the pinned commit (one line saying what to do).
  """
  repo = REPOS[baseline]
  root = authors_dir() if root is None else root
  fetch = f'bash benchmarks/references/authors/fetch.sh {root or "DIR"}'
  if not root:
    raise Unavailable(f'${AUTHORS_ENV} is not set: {fetch}, then export {AUTHORS_ENV}=DIR')
  path = os.path.join(root, repo.folder)
  if not os.path.isdir(path):
    raise Unavailable(f'{path} is missing: {fetch}')
  try:
    head = subprocess.run(['git', '-C', path, 'rev-parse', 'HEAD'], capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError) as e:
    raise Unavailable(f'{path} is not a git checkout ({e}): {fetch}') from e
  if head != repo.commit:
    raise Unavailable(f'{path} is at {head[:7]}, the lock-step ran against {repo.commit[:7]}: '
                      f'git -C {path} checkout {repo.commit}')
  return path


def stub(name: str):
  """An empty module called ``name``: a package the authors' code imports but the lock-step
  never calls (with a spec, so that importers that look modules up, torch's, are content)."""
  import importlib.machinery  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  m = types.ModuleType(name)
  m.__spec__ = importlib.machinery.ModuleSpec(name, None)
  return m


def need_torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise Unavailable("PyTorch is not installed: pip install -e '.[authors]'") from e
  torch.set_num_threads(1)   # one thread: the same reduction order on every run
  return torch


@contextlib.contextmanager
def imported_from(path: str, stubs: dict[str, Any] | None = None):
  """``path`` first on ``sys.path`` for the block, with ``stubs`` as modules (a package the
  authors' code imports but the lock-step never calls, e.g. a plotting library); afterwards
  every module and namespace package loaded from ``path`` is forgotten, so two repositories
  with a ``utils`` module each do not meet, and a second import reads the checkout again."""
  before = set(sys.modules)
  saved = {name: sys.modules.get(name) for name in (stubs or {})}
  sys.modules.update(stubs or {})
  sys.path.insert(0, path)
  try:
    yield
  finally:
    sys.path.remove(path)
    root = os.path.abspath(path)
    # children before their packages: a namespace package (a folder without __init__.py, no
    # __file__) recomputes its __path__ from its parent's
    for name in sorted(set(sys.modules) - before, key=lambda n: -n.count('.')):
      mod = sys.modules[name]
      spec = getattr(mod, '__spec__', None)
      places = [getattr(mod, '__file__', None) or '',
                *(getattr(spec, 'submodule_search_locations', None) or ())]
      if any(os.path.abspath(p).startswith(root) for p in places if p):
        del sys.modules[name]
    for name, mod in saved.items():
      if mod is None:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = mod


# ------------------------------------------------------------ fedjax_kd's side
def tiny(algorithm: str, rounds: int = 3, **overrides):
  """The setting every lock-step starts from: ``algorithm``'s digits preset on 600 synthetic
  28x28 images, three clients of one small MLP (``mlp@0.1``: 20 hidden units a layer), every
  client in every round, one epoch of minibatches of 20, plain SGD at 0.1. ``overrides``:
  dotted config fields."""
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
  c = presets.digits(algorithm)
  base = {'rounds': rounds, 'data.source': 'synthetic:600', 'data.num_public': 100,
          'clients.num_clients': 3, 'clients.models': ['mlp@0.1'], 'server.model': 'mlp@0.1',
          'clients.participation': 1.0, 'train.epochs': 1, 'train.batch_size': 20,
          'train.learning_rate': 0.1, 'train.momentum': 0.0, 'train.weight_decay': 0.0,
          'eval.every': 1, 'checkpoint.every': 0}
  return config_lib.override(c, {**base, **overrides})


@dataclasses.dataclass
class Ours:
  """fedjax_kd's run of a lock-step.

  Attributes:
    setting: what the pair shares (data, partition, initial weights, minibatch order).
    states: the algorithm's state before round 1, then after every round.
    rows: per round, the round's metrics and its evaluation.
  """
  setting: ref.Setting
  states: list
  rows: list[dict]

  @property
  def exp(self):
    return self.setting.experiment

  @property
  def lockstep(self) -> ref.Lockstep:
    if not hasattr(self, '_lockstep'):
      self._lockstep = ref.Lockstep(self.setting)   # pylint: disable=attribute-defined-outside-init
    return self._lockstep

  def client(self, t: int, k: int, part: str = 'clients') -> tuple[dict, dict]:
    """Client ``k``'s ``(params, batch_stats)`` after round ``t`` (0: the initial ones)."""
    fed = self.exp.ctx.fed
    cohort, row = int(fed._cohort_of[k]), int(fed._row_of[k])  # pylint: disable=protected-access
    st = self.states[t].clients[cohort] if part == 'clients' else getattr(self.states[t], part)
    take = lambda tree: _numpy(tree, row)
    return take(st.params), take(st.batch_stats or {})

  def server(self, t: int) -> tuple[dict, dict]:
    """The global (server) model's ``(params, batch_stats)`` after round ``t``."""
    st = self.states[t].server
    return _numpy(st.params, 0), _numpy(st.batch_stats or {}, 0)

  def order(self, t: int, k: int | None, phase: str, n: int, epochs: int,
            batch_size: int) -> list[np.ndarray]:
    """fedjax_kd's minibatches of client ``k`` (None: the server) in round ``t``'s ``phase``:
    positions into the ``n`` rows it trains on, one array a step (the partial last batch
    kept, steps without a real sample dropped)."""
    pos = self.lockstep.order(t, k, phase, n, n, epochs, batch_size)
    return [p[p < n].astype(np.int64) for p in pos if (p < n).any()]

  def client_data(self, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``k``'s training rows ``(x NHWC, y)``, as fedjax_kd's models see them."""
    s = self.setting
    rows = s.client_rows[k]
    return s.x_private[rows], s.y_private[rows]


def _numpy(tree, row: int):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: np.asarray(x[row]), tree)


def ours(cfg, rounds: int | None = None, actives: Sequence[np.ndarray] | None = None) -> Ours:
  """Builds ``cfg``'s experiment and plays its rounds, keeping every state.

  Args:
    rounds: how many (default: the config's).
    actives: per round, the ``[K]`` mask of its clients (default: every client, every round).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  setting = ref.export_setting(cfg, (cfg.algorithm,))
  exp = setting.experiment
  algo = exp.algorithm
  state = base.init_state(algo)
  # Host copies: a round may donate the state it was given (local training does).
  host = lambda st: jax.tree.map(np.array, st)
  states, rows = [host(state)], []
  every = np.ones(algo.num_clients, bool)
  actives = actives or [every] * (rounds or exp.spec.rounds)
  for t, active in enumerate(actives, 1):
    state, out = base.play_round(algo, state, t, np.asarray(active))
    row = dict(out.metrics)
    row.update({k: float(v) for k, v in algo.scores(state).items()
                if np.ndim(v) == 0})
    states.append(host(state))
    rows.append(row)
  return Ours(setting=setting, states=states, rows=rows)


# ------------------------------------------------------------ models and the comparison
def torch_model(ours_run: Ours, variables: tuple[dict, dict], spec: str | None = None):
  """The PyTorch twin of fedjax_kd's model ``spec`` (the clients' model by default), holding
  ``variables`` (fedjax_kd's ``(params, batch_stats)``)."""
  torch = need_torch()
  s = ours_run.setting
  name, width = ref._parse_model(spec or s.client_models[0])  # pylint: disable=protected-access
  hw, channels = s.x_private.shape[1], s.x_private.shape[3]
  kw = {'width': width, 'hw': hw} if name in ref._WIDTH_MODELS else {}  # pylint: disable=protected-access
  m = ref.MODELS[name](s.num_classes, channels, biased_bn=True, **kw)
  load(m, variables)
  del torch
  return m


def load(model, variables: tuple[dict, dict]) -> None:
  """Puts fedjax_kd's ``(params, batch_stats)`` into the PyTorch ``model``."""
  import torch  # pylint: disable=g-import-not-at-top
  sd = ref.from_flax(model, *variables)
  model.load_state_dict({k: torch.tensor(np.array(v, np.float32)) for k, v in sd.items()},
                        strict=False)


def max_diff(model, variables: tuple[dict, dict]) -> float:
  """The largest absolute difference between the PyTorch ``model``'s parameters (and BatchNorm
  statistics) and fedjax_kd's ``variables`` of the same model."""
  want = ref.from_flax(model, *variables)
  got = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
  return max(float(np.max(np.abs(got[k] - np.asarray(v)))) for k, v in want.items())


def nchw(x: np.ndarray):
  return ref.nchw(x)


def accuracy(model, x: np.ndarray, y: np.ndarray, forward: Callable | None = None) -> float:
  """``model``'s accuracy on ``(x NHWC, y)`` in inference mode."""
  import torch  # pylint: disable=g-import-not-at-top
  model.eval()
  with torch.no_grad():
    logits = (forward or model)(nchw(x))
  return float((logits.argmax(1).numpy() == y).mean())


@dataclasses.dataclass
class Result:
  """One lock-step: per round, the largest parameter difference and the accuracies.

  Attributes:
    baseline: the fedjax_kd algorithm.
    repo: the authors' repository and commit.
    rounds: rounds run.
    param_diff: per round, the largest absolute parameter difference over every model compared.
    acc_ours, acc_theirs: per round, the accuracy both sides report for the same model(s).
    what: which models were compared, and which accuracy.
    notes: the differences found and kept (each also in docs/papers.md).
  """
  baseline: str
  repo: Repo
  rounds: int
  param_diff: list[float]
  acc_ours: list[float]
  acc_theirs: list[float]
  what: str
  notes: tuple[str, ...] = ()

  @property
  def acc_diff(self) -> float:
    return float(np.max(np.abs(np.subtract(self.acc_ours, self.acc_theirs))))

  @property
  def holds(self) -> bool:
    return max(self.param_diff) <= PARAM_TOL

  def to_json(self) -> dict:
    return {'baseline': self.baseline, 'repo': self.repo.slug, 'commit': self.repo.commit,
            'files': list(self.repo.files), 'rounds': self.rounds,
            'param_diff': self.param_diff, 'max_param_diff': max(self.param_diff),
            'acc_ours': self.acc_ours, 'acc_theirs': self.acc_theirs,
            'max_acc_diff': self.acc_diff, 'what': self.what, 'notes': list(self.notes),
            'holds': self.holds}


def namespace(**kw) -> Any:
  """An ``argparse.Namespace``-like object: the args the authors' constructors read."""
  import argparse  # pylint: disable=g-import-not-at-top
  return argparse.Namespace(**kw)


class Batches:
  """A data loader that yields fedjax_kd's minibatches, in order, round after round.

  ``len()`` is the steps of one epoch (what a ``DataLoader`` gives), iteration yields
  ``(x NCHW, y)`` tensors; ``.next()`` is there too for code written against Python 2's
  iterators. ``steps`` is the list of position arrays, replaced by the driver every round.
  """

  def __init__(self, x: np.ndarray, y: np.ndarray, steps_per_epoch: int):
    import torch  # pylint: disable=g-import-not-at-top
    self.x, self.y = nchw(x), torch.from_numpy(np.asarray(y, np.int64))
    self.steps: list[np.ndarray] = []
    self.per_epoch = steps_per_epoch

  def __len__(self):
    return self.per_epoch

  def __iter__(self):
    return _Iter(self)


class _Iter:
  def __init__(self, b: Batches):
    self.b, self.i = b, 0

  def __iter__(self):
    return self

  def __next__(self):
    import torch  # pylint: disable=g-import-not-at-top
    if self.i >= len(self.b.steps):
      raise StopIteration
    j = torch.from_numpy(self.b.steps[self.i])
    self.i += 1
    return self.b.x[j], self.b.y[j]

  next = __next__


def run_all(names: Sequence[str], root: str, seed: int = 0) -> tuple[list[Result], dict]:
  """Runs each named driver whose checkout is under ``root``; returns the results and, for the
  rest, why they did not run."""
  import importlib  # pylint: disable=g-import-not-at-top
  done, skipped = [], {}
  for name in names:
    try:
      path = checkout(name, root)
      need_torch()
      driver = importlib.import_module(f'benchmarks.references.authors.{name}')
      done.append(driver.lockstep(path, seed=seed))
    except Unavailable as e:
      skipped[name] = str(e)
  return done, skipped
