"""The round engine shared by every algorithm.

An algorithm is a small class with ``init``, ``round`` and ``evaluate``; it
composes the federation's kernels (train, predict, distill, evaluate) with the
pure ops in :mod:`fedjax_kd.ops`. Host code only decides which indices, which
clients and which payloads. Everything a round needs next time is in one
:class:`AlgState` pytree, so a checkpoint is one call.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedjax_kd.core import rng
from fedjax_kd.core.federation import Federation, SingleModel
from fedjax_kd.data import augment as augment_lib
from fedjax_kd.ops import comm

Array = jax.Array


@flax.struct.dataclass
class AlgState:
  """Everything carried between rounds.

  Attributes:
    clients: one stacked ModelState per cohort.
    server: the server's model state (DS-FL's w_g, FedAvg's w_0) or ``()``.
    extra: algorithm-specific arrays (caches, stamps, counters), a dict.
  """
  clients: tuple
  server: Any = ()
  extra: Any = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RoundOutput:
  """What a round reports: scalar metrics and the payloads it sent."""
  metrics: dict[str, float]
  payloads: list[comm.Payload]


@dataclasses.dataclass(frozen=True)
class Context:
  """Static things an algorithm needs (built once by the experiment)."""
  spec: Any                      # ExperimentSpec
  fed: Federation
  root: Array                    # experiment root PRNG key
  modules: dict[str, Any]        # model spec -> Flax module
  optimizers: dict[str, optax.GradientTransformation]
  bytes_per_public_sample: float  # for the one-time open-data broadcast (ComU@I)
  selector: Any = None           # fedjax_kd.selection.ClientSelector (stragglers' epochs)
  input_stats: Any = None        # per-channel (mean, std) of data.normalize; None: [0, 1]

  @property
  def data(self):
    return self.fed.data


class Algorithm:
  """Base class; subclasses set ``name`` and implement ``round``."""
  name: ClassVar[str] = ''
  paper_rules: ClassVar[str] = 'dsfl'   # comm rule set that 'paper' resolves to
  uses_public: ClassVar[bool] = True
  # Draws distill.public_per_round public samples a round (False: uses all of D0).
  samples_public: ClassVar[bool] = True
  has_server_model: ClassVar[bool] = False

  # Attributes built at construction with a leading client axis of K (label
  # frequencies, cluster ids, ...): a round view slices them to its clients.
  client_attrs: ClassVar[tuple[str, ...]] = ()

  def __init__(self, ctx: Context):
    self.ctx = ctx
    self.spec = ctx.spec
    self.fed = ctx.fed
    self.options = ctx.spec.options
    self.server_model = None
    if self.has_server_model:
      self.server_model = SingleModel(ctx.modules[self.spec.server_model], ctx.optimizers,
                                      ctx.data.input_shape, ctx.spec.train.compute_dtype)
    self.distill_slot = 'train' if self.spec.distill is None else 'distill'
    # One function object per run, so it is a stable jit static argument.
    self.augment = augment_lib.get_augment(self.spec.data.augment, ctx.input_stats)
    # SCARLET's code also augments the public images clients predict on (§8.8).
    self.predict_augment = self.augment if self.spec.data.augment_predict else None

  # ---------------------------------------------------------------- config
  @classmethod
  def options_from_config(cls, config: ml_collections.ConfigDict, spec) -> Any:
    """Validates the algorithm's own config group; returns frozen options."""
    del config, spec
    return None

  # ------------------------------------------------------------ lifecycle
  def init(self) -> AlgState:
    clients = self.fed.init(self.ctx.root, shared_init=self.spec.shared_init)
    server = ()
    if self.server_model is not None:
      server = self.server_model.init(rng.server_key(self.ctx.root, 0, 'init'))
    return AlgState(clients=clients, server=server, extra={})

  def client_state_keys(self) -> tuple[str, ...]:
    """Entries of ``AlgState.extra`` with one row per client (leading axis K).

    With a host or disk client store these live with the client models and
    only the participants' rows reach the device in a round; every other
    entry is server-side state and stays on the device.
    """
    return ()

  def on_view(self, view) -> 'Algorithm':
    """This algorithm bound to a round's participants only.

    Args:
      view: a :class:`~fedjax_kd.core.federation.RoundView`.

    Returns:
      A shallow copy whose ``fed``/``ctx`` are the view's (the algorithm's
      ``round`` then sees the view's S clients, of which ``view.active``
      participate) and whose ``client_attrs`` are sliced to the view's clients.
      Client ids used for random keys stay global (``fed.global_ids``).
    """
    new = copy.copy(self)
    selector = self.ctx.selector
    new.ctx = dataclasses.replace(
        self.ctx, fed=view.fed,
        selector=None if selector is None else _SelectorView(selector, view.ids))
    new.fed = view.fed
    ids = np.asarray(view.ids)
    for name in self.client_attrs:
      a = getattr(self, name)
      setattr(new, name, jnp.take(a, jnp.asarray(ids), axis=0) if isinstance(a, jax.Array)
              else np.asarray(a)[ids])
    return new

  def setup_payloads(self) -> list[comm.Payload]:
    """One-time traffic before round 1 (the open-data multicast, ComU@I)."""
    if not self.uses_public:
      return []
    return comm.open_data_broadcast(int(self.ctx.data.x_public.shape[0]),
                                    self.ctx.bytes_per_public_sample, self.fed.num_clients)

  def round(self, state: AlgState, t: int, active: np.ndarray) -> tuple[AlgState, RoundOutput]:
    raise NotImplementedError

  def evaluate(self, state: AlgState) -> dict[str, float]:
    """Default: accuracy of the client models (mean, min, max)."""
    return self.client_metrics(state, prefix='')

  # --------------------------------------------------------------- shared
  def local_options(self, t: int) -> dict[str, Any]:
    """Local-training options every algorithm's private training shares.

    Per-client epochs (stragglers), the round's learning-rate factor
    ``train.lr_decay ** (t - 1)`` and ``train.fresh_optimizer``.
    """
    tr = self.spec.train
    epochs_k = None
    if self.ctx.selector is not None:
      epochs_k = self.ctx.selector.local_epochs(t, tr.epochs)
    return {'epochs_k': epochs_k, 'lr_scale': self.lr_factor(t),
            'fresh_opt': tr.fresh_optimizer}

  def lr_factor(self, t: int) -> float:
    """``train.lr_decay ** (t - 1)``: round t's learning rate over the initial one."""
    return float(self.spec.train.lr_decay ** (t - 1))

  def train_clients(self, state: AlgState, t: int, active: np.ndarray, **local):
    """Private training of the active clients; ``local`` adds e.g. ``prox_mu``."""
    tr = self.spec.train
    clients, loss = self.fed.train_private(state.clients, self.ctx.root, t, epochs=tr.epochs,
                                           batch_size=tr.batch_size, active=active,
                                           augment=self.augment,
                                           **{**self.local_options(t), **local})
    return state.replace(clients=clients), _nanmean(loss)

  def selection_losses(self, state: AlgState, candidates: np.ndarray) -> np.ndarray:
    """``[K]`` local training loss of each candidate's model (Power-of-Choice).

    Distillation algorithms have no global model, so a client's own model is
    what it would train next; FedAvg-family algorithms override this with the
    global model's loss.
    """
    _, nll = self.fed.evaluate(state.clients, active=candidates, split='train',
                               chunk=self.spec.eval_chunk)
    return nll

  def sample_public(self, t: int) -> tuple[np.ndarray, Array]:
    """o_r: ``public_per_round`` open indices, uniform without replacement (A6)."""
    n_pub = int(self.ctx.data.x_public.shape[0])
    m = min(self.spec.public_per_round, n_pub)
    idx = np.sort(rng.host_rng(self.spec.seed, t, 'sample').choice(n_pub, m, replace=False))
    return idx, jnp.take(self.ctx.data.x_public, jnp.asarray(idx), axis=0)

  def distill_clients(self, state: AlgState, t: int, x: Array, targets: Array,
                      active: np.ndarray, count: int | None = None,
                      weights: Array | None = None):
    """Every active client distils on ``(x[:count], targets[..., :count, :])``."""
    clients, loss = self.fed.distill(state.clients, self.ctx.root, t, x, targets,
                                     epochs=self.spec.distill_epochs,
                                     batch_size=self.spec.distill_batch_size, active=active,
                                     opt_slot=self.distill_slot, count=count,
                                     weights=weights, augment=self.augment)
    return state.replace(clients=clients), _nanmean(loss)

  def distill_server(self, state: AlgState, t: int, x: Array, targets: Array,
                     count: int | None = None):
    """The server model distils on ``(x[:count], targets[:count])``."""
    server, loss = self.server_model.distill(
        state.server, rng.server_key(self.ctx.root, t, 'distill'), x, targets,
        epochs=self.spec.distill_epochs, batch_size=self.spec.distill_batch_size,
        opt_slot=self.distill_slot, count=count, augment=self.augment)
    return state.replace(server=server), float(loss[0])

  def predict_clients(self, state: AlgState, t: int, x: Array, active: np.ndarray) -> Array:
    """``[K, m, C]`` client probabilities on public inputs (zeros for inactive)."""
    return self.fed.predict(state.clients, x, active, chunk=self.spec.eval_chunk,
                            augment=self.predict_augment, root=self.ctx.root, t=t)

  def client_metrics(self, state: AlgState, prefix: str = 'client_') -> dict[str, float]:
    if not self.spec.eval_clients and prefix:
      return {}
    acc, nll = self.fed.evaluate(state.clients, per_client_test=self.spec.data.per_client_test,
                                 chunk=self.spec.eval_chunk)
    out = {f'{prefix}acc': float(np.nanmean(acc)), f'{prefix}acc_min': float(np.nanmin(acc)),
           f'{prefix}acc_max': float(np.nanmax(acc)), f'{prefix}loss': float(np.nanmean(nll))}
    d = self.ctx.data
    if self.spec.data.per_client_test and d.test_n is not None:
      n = np.asarray(d.test_n, np.float64)
      ok = np.isfinite(acc) & (n > 0)
      if ok.any():   # the sample-weighted mean beside the unweighted UA
        out[f'{prefix}acc_weighted'] = float(np.sum(acc[ok] * n[ok]) / np.sum(n[ok]))
    if not prefix:  # the client models are the evaluated models (FD, single, pFL)
      out = {'test_acc': out['acc'], 'test_loss': out['loss'],
             'client_acc_min': out['acc_min'], 'client_acc_max': out['acc_max'],
             **({'test_acc_weighted': out['acc_weighted']} if 'acc_weighted' in out else {})}
    return out

  def server_metrics(self, state: AlgState) -> dict[str, float]:
    d = self.ctx.data
    acc, loss, acc5 = self.server_model.evaluate(state.server, d.x_test, d.y_test,
                                                 chunk=self.spec.eval_chunk)
    # Top-5 too: SCARLET's code prints it for CIFAR-100 (spec scarlet.md §8.10).
    return {'test_acc': acc, 'test_loss': loss, 'test_acc_top5': acc5}


class _SelectorView:
  """A client selector seen by a round view: per-client answers sliced to its clients."""

  def __init__(self, selector, ids: np.ndarray):
    self._selector = selector
    self._ids = np.asarray(ids)

  def local_epochs(self, t: int, epochs: int):
    out = self._selector.local_epochs(t, epochs)
    return None if out is None else np.asarray(out)[self._ids]


def _nanmean(x) -> float:
  x = np.asarray(x, np.float64)
  return float(np.nanmean(x)) if np.isfinite(x).any() else float('nan')


# ------------------------------------------------------------ the engine
def init_state(algo: Algorithm) -> AlgState:
  """``algo.init()``, with per-client state moved to the client store if there is one."""
  state = algo.init()
  store = algo.fed.store
  if store is None:
    return state
  extra = dict(state.extra)
  for k in algo.client_state_keys():
    extra[k] = store.put(extra[k])
  return state.replace(extra=extra)


def play_round(algo: Algorithm, state: AlgState, t: int, active: np.ndarray,
               check=None) -> tuple[AlgState, RoundOutput]:
  """One round of ``algo`` on the clients ``active``, wherever client state lives.

  With device-resident clients this is ``algo.round``. With a client store,
  the round runs on a :class:`~fedjax_kd.core.federation.RoundView`: only the
  participants' rows are gathered to the device, the unchanged ``round`` runs
  on them, and their rows are written back.

  Args:
    algo: the algorithm (bound to the full federation).
    state: the state after round ``t - 1``.
    t: the round.
    active: ``[K]`` bool mask of participants (at least one).
    check: optional ``check(state, fed, out)`` called on the round's new state
      before it is stored (the runner's NaN guard); for a store this is the
      participants' compact state and the view's federation.

  Returns:
    The new state and the round's output.
  """
  fed = algo.fed
  if fed.store is None:
    state, out = algo.round(state, t, active)
    if check is not None:
      check(state, fed, out)
    return state, out
  view = fed.round_view(active)
  keys = algo.client_state_keys()
  vstate = fed.store.gather(state, view, keys)
  vstate, out = algo.on_view(view).round(vstate, t, view.active)
  if check is not None:
    check(vstate, view.fed, out)
  return fed.store.scatter(state, vstate, view, keys), out
