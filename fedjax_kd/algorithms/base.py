"""The round engine shared by every algorithm.

An algorithm is a small class with ``init``, ``round`` and ``evaluate``; it
writes what a client does as client programs (:mod:`fedjax_kd.core.program`), which
the federation runs for the round's clients (``Federation.run``, the one entry), and
composes them with the pure ops in :mod:`fedjax_kd.ops` and the engine's inference
kernels (predict, evaluate). Host code only decides which indices, which
clients and which payloads. Everything a round needs next time is in one
:class:`AlgState` pytree of four declared parts (client models, the client
table, the server model, the server state), so a checkpoint is one call and a
client store moves exactly the per-client parts. ``round(state, r)`` sees its
clients through one :class:`Round`, the same whether they live on the device or
in a store (:func:`play_round`). The design is in ``docs/design.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedjax_kd import options
from fedjax_kd.core import program as program_lib
from fedjax_kd.core import rng
from fedjax_kd.core.federation import Federation, SingleModel
from fedjax_kd.core.kernels import Planned
from fedjax_kd.core.program import Program, Rows
from fedjax_kd.core.state import wrong_rows
from fedjax_kd.data import augment as augment_lib
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm

Array = jax.Array


@flax.struct.dataclass
class AlgState:
  """Everything carried between rounds, in four declared parts.

  Attributes:
    clients: one stacked ModelState per cohort (rows in cohort order).
    table: the algorithm's client table: every other array with one row per
      client (leading axis K, global client order), e.g. SCARLET's per-client
      cache stamps, SCAFFOLD's ``c_k``, FedCache 2.0's synthetic sets and label
      frequencies, ACE-pFL's best past predictions and cluster ids. A typed
      pytree (``()`` when the algorithm has none). With a host or disk client
      store it lives with the client models, and a round sees the rows of its
      participants only.
    server: the server's model state (DS-FL's w_g, FedAvg's w_0) or ``()``.
    extra: the algorithm's server-side state (caches, counters, the pending
      downlink), a typed pytree with no client axis, or ``()``.
  """
  clients: tuple
  table: Any = ()
  server: Any = ()
  extra: Any = ()


@dataclasses.dataclass(frozen=True)
class Round:
  """What one round of an algorithm sees.

  Attributes:
    t: the round, from 1.
    fed: the federation of this round's clients: all K clients when they live
      on the device; the participants (padded per cohort) with a client store.
      Every per-client array of the round (``state.table``, ``active``, the
      data's index tables) is in ``fed``'s client order.
    active: ``[S]`` bool, which of ``fed``'s clients take part.
    epochs_k: ``[S]`` local epochs per client (stragglers) or None (all
      ``train.epochs``).
    carried: the host facts the run's previous played round left for this one
      (:attr:`RoundOutput.carry`), so that the round's control flow needs no device read;
      ``{}`` before the first round, None where they are unknown (the first round after a
      resume, a caller that does not carry them): the round then reads its state instead.
  """
  t: int
  fed: Federation
  active: np.ndarray
  epochs_k: np.ndarray | None = None
  carried: dict[str, Any] | None = None

  @property
  def num_clients(self) -> int:
    """S: the clients of this round's federation (K without a store)."""
    return self.fed.num_clients

  @property
  def ids(self) -> np.ndarray:
    """``[S]`` global client ids of ``fed``'s clients (keys, cache rows)."""
    return self.fed.global_ids

  @property
  def population(self) -> int:
    """K: every client of the experiment, whatever ``fed`` holds."""
    return self.fed.population


@flax.struct.dataclass
class Later:
  """A metric the host finishes after the round's one read: ``fn`` of the host value of
  ``value`` (a pytree of device arrays), e.g. the mean over clients of ``[K]`` accuracies,
  computed in NumPy as it always was, with no read of its own.

  :meth:`Algorithm.evaluate` and a round's metrics may hold them; :func:`read_metrics`
  reads every value of a dict in one transfer and finishes them.
  """
  value: Any
  fn: Any = flax.struct.field(pytree_node=False)


def read_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
  """``metrics`` as Python numbers (:func:`host_scalar`, :class:`Later` ones finished), read
  to the host in one ``jax.device_get``."""
  return _host_dict(jax.device_get(metrics))


def _host_dict(metrics: dict[str, Any]) -> dict[str, Any]:
  """:func:`host_scalar` of every value; a :class:`Later` that finishes as None is left out."""
  out = {k: host_scalar(v) for k, v in metrics.items()}
  return {k: v for k, v in out.items() if v is not None}


@dataclasses.dataclass
class RoundOutput:
  """What a round reports: scalar metrics and the payloads it sent.

  A round returns it without waiting for the device: a metric may be a device
  scalar (a ``jnp`` value) or a host number, and a payload's counts may be
  device scalars (:class:`fedjax_kd.ops.comm.Payload`). :meth:`to_host` reads
  all of them in one transfer; :func:`play_round` calls it once per round, so
  the runner (and anything else that plays rounds) sees Python numbers.

  Attributes:
    metrics: name -> scalar: a Python float or int, a NumPy scalar, a device
      scalar or a :class:`Later`. After :meth:`to_host`: Python ``int`` for integer
      values (counts), ``float`` for the rest.
    payloads: what the round sent.
    scores: the evaluation of the round's new state (:meth:`Algorithm.evaluate`), when
      :func:`play_round` was asked for it; read with the rest.
    carry: facts the next round needs for its control flow, which the runner hands it as
      :attr:`Round.carried` (the public-set family: a downlink is pending; FedCache 2.0: the
      next round's widest download): host values, or device values read with the round's
      output (host values after :meth:`read`).
  """
  metrics: dict[str, Any]
  payloads: list[comm.Payload]
  scores: dict[str, Any] = dataclasses.field(default_factory=dict)
  carry: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_host(self) -> RoundOutput:
    """The same output with Python numbers: one ``jax.device_get`` of every metric, score and
    payload count (host values pass through)."""
    out, _ = self.read()
    return out.finished()

  def read(self, also: Any = None) -> tuple[RoundOutput, Any]:
    """One ``jax.device_get`` of the metrics, the scores, the payload counts, the carry and
    ``also`` (any pytree): the output with its metrics and payloads as Python numbers, its
    carry's host values and its scores read but not finished (:meth:`finished`), and
    ``also``'s host value."""
    metrics, scores, counts, carry, also = jax.device_get(
        (self.metrics, self.scores, [p.counts for p in self.payloads], self.carry, also))
    return RoundOutput(_host_dict(metrics), [p.read(c) for p, c in zip(self.payloads, counts)],
                       scores, carry), also

  def finished(self) -> RoundOutput:
    """The output with its scores as Python numbers (:class:`Later` ones finished)."""
    return dataclasses.replace(self, scores=_host_dict(self.scores))


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
  """Base class; subclasses set ``name`` and implement ``round``.

  An algorithm object holds only what is fixed for the run (options, modules,
  precomputed constants); everything that changes is in the :class:`AlgState`
  that ``round`` takes and returns, and everything about the round's clients
  is in its :class:`Round`. ``round`` never looks at the full federation
  (``self.ctx.fed``): with a client store its clients are not the round's.
  """
  name: ClassVar[str] = ''
  paper_rules: ClassVar[str] = 'dsfl'   # comm rule set that 'paper' resolves to
  uses_public: ClassVar[bool] = True
  # Draws distill.public_per_round public samples a round (False: uses all of D0).
  samples_public: ClassVar[bool] = True
  has_server_model: ClassVar[bool] = False
  # Exchanges parameters (or parameter-shaped state) between clients: every client must use the
  # same model spec (checked by :meth:`options_from_config`).
  one_architecture: ClassVar[bool] = False
  # Optimises inputs by gradient (dataset distillation): float inputs only, no token ids.
  synthesizes_inputs: ClassVar[bool] = False
  # Its options: a frozen dataclass of ``fedjax_kd.options.option`` fields naming its config
  # group (``group``), or None. ``config.default_config`` adds the group of every registered
  # algorithm, so ``--config.<group>.<field>`` works and a misspelt field is refused; the
  # validated options are ``spec.options`` (:meth:`options_from_config`).
  options_class: ClassVar[type | None] = None

  def __init__(self, ctx: Context):
    self.ctx = ctx
    self.spec = ctx.spec
    self.options = ctx.spec.options
    self.server_model = None
    if self.has_server_model:
      self.server_model = SingleModel(ctx.modules[self.spec.server.model], ctx.optimizers,
                                      ctx.data.input_shape, ctx.spec.train.compute_dtype,
                                      normalize=ctx.data.normalize,
                                      input_dtype=ctx.data.model_input_dtype)
    self.distill_slot = 'train' if self.spec.distill.optimizer is None else 'distill'
    # One function object per run, so it is a stable jit static argument.
    self.augment = augment_lib.get_augment(self.spec.data.augment, ctx.input_stats)
    # SCARLET's code also augments the public images clients predict on.
    self.predict_augment = self.augment if self.spec.data.augment_predict else None

  @property
  def num_clients(self) -> int:
    """K, every client of the experiment."""
    return self.ctx.fed.num_clients

  # ---------------------------------------------------------------- config
  @classmethod
  def options_from_config(cls, config: ml_collections.ConfigDict, spec) -> Any:
    """The algorithm's validated options (:attr:`options_class` read from ``config``), and
    its rules on the rest of the spec; raises ConfigError naming the field."""
    if cls.one_architecture and len(set(spec.clients.models)) != 1:
      raise ConfigError('clients.models', list(dict.fromkeys(spec.clients.models)),
                        f'a single model spec for {cls.name} (it exchanges parameters, which '
                        'needs identical architectures)')
    return None if cls.options_class is None else options.read(cls.options_class, config,
                                                                 spec, cls)

  # ------------------------------------------------------------ lifecycle
  def init(self) -> AlgState:
    """The state before round 1 for all K clients: models, client table, server state.

    Subclasses extend it with ``state.replace(table=..., extra=...)``.
    """
    fed = self.ctx.fed
    key = rng.server_key(self.ctx.root, 0, 'init')
    # clients.shared_init: every client and the server start from one draw (the server's),
    # as the papers' code builds one model and copies it.
    clients = fed.init(self.ctx.root, shared_key=key if self.spec.clients.shared_init else None)
    server = ()
    if self.server_model is not None:
      server = self.server_model.init(key)
    return AlgState(clients=clients, server=server)

  def programs(self, shapes: AlgState) -> tuple[Planned, ...]:
    """The client programs a round runs, as :class:`~fedjax_kd.core.kernels.Planned`
    entries (the program and its inputs' shapes) for the memory planner, which traces or
    compiles each for the clients at once (:mod:`fedjax_kd.running.memory`). ``shapes`` is the
    state's (``jax.eval_shape`` of :meth:`init`); :meth:`planning_round` stands for a round
    where one is needed. Default: private training
    (:meth:`train_program`) and, for an algorithm that uses the public set, distillation on
    a round's open samples (:meth:`distill_program`); an algorithm with programs of its own
    declares them (a test runs a round of every algorithm and checks that each program it
    ran was declared)."""
    del shapes
    out = [self.planned_training()]
    if self.uses_public:
      out.append(self.planned_distillation())
    return tuple(out)

  def planning_round(self) -> Round:
    """Round 1 with every client taking part, for :meth:`programs` (nothing is run)."""
    return Round(t=1, fed=self.ctx.fed, active=np.ones(self.num_clients, bool))

  def planned_training(self, program: Program | None = None, row: Any = None,
                       shared: Any = None, data: Rows | None = None) -> Planned:
    """:meth:`train_clients`' call as the planner sees it (arguments as there: ``row`` with
    a leading client axis)."""
    return planned(program or self.train_program(), data or self.private_rows(), row,
                   self.training_shared(1, shared))

  def planned_distillation(self, per_client: bool = False, weighted: bool = False) -> Planned:
    """:meth:`distill_clients`' call on a round's open samples as the planner sees it, with
    targets every client shares, or ``per_client`` ones (``weighted``: and a weight each)."""
    d = self.ctx.data
    k, c = d.num_clients, int(d.num_classes)
    m = min(int(d.x_public.shape[0]), self.spec.distill.public_per_round)
    x = jax.ShapeDtypeStruct((m,) + tuple(d.x_public.shape[1:]), d.x_public.dtype)
    targets = jax.ShapeDtypeStruct((k, m, c) if per_client or weighted else (m, c), jnp.float32)
    weights = jax.ShapeDtypeStruct((k,), jnp.float32) if weighted else None
    program, data, row = distillation(self.distill_program(), x, targets, k, None, weights)
    return planned(program, data, row, None)

  def planned_server_distillation(self) -> Planned:
    """:meth:`distill_server`'s call on a round's open samples as the planner sees it."""
    d = self.ctx.data
    m = min(int(d.x_public.shape[0]), self.spec.distill.public_per_round)
    x = jax.ShapeDtypeStruct((m,) + tuple(d.x_public.shape[1:]), d.x_public.dtype)
    t = jax.ShapeDtypeStruct((m, int(d.num_classes)), jnp.float32)
    return planned(self.distill_program(), public_rows(x, 1, t=t), None, None, server=True)

  def planned_buffers(self) -> tuple[Any, ...]:
    """Device arrays the algorithm keeps from round to round besides its state (scratch it
    reuses, e.g. FedCache 2.0's download pool), as ``jax.ShapeDtypeStruct`` s: the memory
    planner and XLA's figure count them as resident. None by default."""
    return ()

  def setup_payloads(self) -> list[comm.Payload]:
    """One-time traffic before round 1 (the open-data multicast, ComU@I)."""
    if not self.uses_public:
      return []
    return comm.open_data_broadcast(int(self.ctx.data.x_public.shape[0]),
                                    self.ctx.bytes_per_public_sample, self.num_clients)

  def round(self, state: AlgState, r: Round) -> tuple[AlgState, RoundOutput]:
    """One round on ``r.fed``'s clients; ``state`` holds their rows (see :class:`Round`)."""
    raise NotImplementedError

  def evaluate(self, state: AlgState) -> dict[str, Any]:
    """The scores of ``state``'s evaluated models. Default: accuracy of the client models
    (mean, min, max).

    Values may be device scalars or :class:`Later` values, as a round's metrics may: the
    runner reads them with the round's output, in its one transfer. :meth:`scores` gives
    them as Python numbers.
    """
    return self.client_metrics(state, prefix='')

  def scores(self, state: AlgState) -> dict[str, float]:
    """:meth:`evaluate` read to the host (one transfer): Python numbers."""
    return read_metrics(self.evaluate(state))

  # --------------------------------------------------------------- shared
  def train_program(self, *transforms: program_lib.Transform,
                    loss: program_lib.LossFn = program_lib.ce_loss) -> program_lib.SGD:
    """Private training's program: ``train.*`` epochs and batch size, a fresh optimizer
    (``train.fresh_optimizer``), augmentation, the round's learning-rate factor
    (:class:`~fedjax_kd.core.program.LRScale`), then ``transforms`` (FedProx's proximal
    term, SCAFFOLD's control variates), on ``loss`` (default cross-entropy)."""
    tr = self.spec.train
    sgd = program_lib.SGD(loss, tr.epochs, tr.batch_size, augment=self.augment,
                          fresh=tr.fresh_optimizer)
    return program_lib.chain(sgd, program_lib.LRScale(), *transforms)

  def distill_program(self, loss: program_lib.LossFn = program_lib.soft_ce_loss,
                      augment: bool = True) -> program_lib.SGD:
    """Distillation's program: ``distill.*`` epochs and batch size and its optimizer slot,
    on ``loss`` (default cross-entropy on shared soft targets ``batch['t']``)."""
    d = self.spec.distill
    return program_lib.SGD(loss, d.epochs, d.batch_size, slot=self.distill_slot,
                           augment=self.augment if augment else None)

  def private_rows(self, fed: Federation | None = None) -> Rows:
    """Each client's labelled private rows, as a program's batches read them."""
    d = (fed or self.ctx.fed).data
    return Rows({'x': d.x_private, 'y': d.y_private}, d.client_idx, d.client_n)

  def training_shared(self, t: int, shared: dict | None = None) -> dict:
    """The shared inputs of :meth:`train_program`: round ``t``'s learning-rate factor and
    ``shared`` (the transforms' data)."""
    return {'lr_scale': jnp.float32(self.lr_factor(t)), **(shared or {})}

  def lr_factor(self, t: int) -> float:
    """``train.lr_decay ** (t - 1)``: round t's learning rate over the initial one."""
    return float(self.spec.train.lr_decay ** (t - 1))

  def train_clients(self, state: AlgState, r: Round, program: Program | None = None,
                    row: Any = None, shared: dict | None = None, data: Rows | None = None):
    """Local training of the active clients, with their epoch budgets (stragglers).

    Args:
      state: the state; its client models train.
      r: the round.
      program: default :meth:`train_program`.
      row: per-client inputs of the program's loss and transforms (rows of ``r.fed``).
      shared: their shared inputs, besides the learning-rate factor (:meth:`training_shared`).
      data: default the clients' private rows (:meth:`private_rows`).

    Returns:
      The new state and the mean loss over the active clients (a device scalar).
    """
    ran = r.fed.run(program or self.train_program(), state.clients, self.ctx.root, r.t, 'train',
                    data=data or self.private_rows(r.fed), row=row,
                    shared=self.training_shared(r.t, shared), active=r.active,
                    epochs=r.epochs_k)
    return state.replace(clients=ran.states), nanmean(ran.metrics)   # a device scalar

  def selection_losses(self, state: AlgState, candidates: np.ndarray) -> np.ndarray:
    """``[K]`` local training loss of each candidate's model (Power-of-Choice).

    Distillation algorithms have no global model, so a client's own model is
    what it would train next; FedAvg-family algorithms override this with the
    global model's loss.
    """
    _, nll = self.ctx.fed.evaluate(state.clients, active=candidates, split='train',
                                   chunk=self.spec.eval.chunk)
    return nll

  def sample_public(self, t: int) -> tuple[np.ndarray, Array]:
    """o_r: ``public_per_round`` open indices, uniform without replacement, fresh each round."""
    n_pub = int(self.ctx.data.x_public.shape[0])
    m = min(self.spec.distill.public_per_round, n_pub)
    idx = np.sort(rng.host_rng(self.spec.seed, t, 'sample').choice(n_pub, m, replace=False))
    return idx, jnp.take(self.ctx.data.x_public, jnp.asarray(idx), axis=0)

  def distill_clients(self, state: AlgState, r: Round, x: Array, targets: Array,
                      count: Any = None, weights: Array | None = None):
    """Every active client distils on ``(x[:count], targets[..., :count, :])``.

    ``targets`` is ``[m, C]`` (the same for every client) or ``[S, m, C]``; ``count`` (host
    or device int; default all ``m``) keeps shapes fixed, so a varying count does not
    recompile; ``weights`` ``[S]`` scales each client's loss (COMET's lambda).

    Returns the new state and the mean loss over the active clients (a device scalar).
    """
    program, data, row = distillation(self.distill_program(), x, targets, r.num_clients,
                                      count, weights)
    ran = r.fed.run(program, state.clients, self.ctx.root, r.t, 'distill', data=data, row=row,
                    active=r.active)
    return state.replace(clients=ran.states), nanmean(ran.metrics)

  def distill_server(self, state: AlgState, t: int, x: Array, targets: Array,
                     count: Any = None):
    """The server model distils on ``(x[:count], targets[:count])``.

    Returns the new state and its loss (a device scalar).
    """
    m = x.shape[0]
    ran = self.server_model.run(
        self.distill_program(), state.server, rng.server_key(self.ctx.root, t, 'distill'),
        data=Rows({'x': x, 't': targets}, jnp.arange(m, dtype=jnp.int32),
                  m if count is None else count))
    return state.replace(server=ran.states), ran.metrics

  def predict_clients(self, state: AlgState, r: Round, x: Array) -> Array:
    """``[S, m, C]`` client probabilities on public inputs (zeros for inactive)."""
    return r.fed.predict(state.clients, x, r.active, chunk=self.spec.eval.chunk,
                         augment=self.predict_augment, root=self.ctx.root, t=r.t)

  def client_metrics(self, state: AlgState, prefix: str = 'client_') -> dict[str, Any]:
    """The client models' accuracy and loss on their test rows: the mean (UA), min and max
    over clients, as :class:`Later` values of the ``[K]`` figures (no read here)."""
    if not self.spec.eval.clients and prefix:
      return {}
    acc, nll = self.ctx.fed.evaluate(state.clients,
                                     per_client_test=self.spec.data.per_client_test,
                                     chunk=self.spec.eval.chunk, read=False)
    out = {f'{prefix}acc': Later(acc, np.nanmean), f'{prefix}acc_min': Later(acc, np.nanmin),
           f'{prefix}acc_max': Later(acc, np.nanmax), f'{prefix}loss': Later(nll, np.nanmean)}
    d = self.ctx.data
    if self.spec.data.per_client_test and d.test_n is not None:
      n = np.asarray(d.test_n, np.float64)
      # The sample-weighted mean beside the unweighted UA (left out of the row when no
      # client has both a score and test rows: weighted_mean finishes as None).
      out[f'{prefix}acc_weighted'] = Later(acc, functools.partial(weighted_mean, n=n))
    if not prefix:  # the client models are the evaluated models (FD, single, pFL)
      out = {'test_acc': out['acc'], 'test_loss': out['loss'],
             'client_acc_min': out['acc_min'], 'client_acc_max': out['acc_max'],
             **({'test_acc_weighted': out['acc_weighted']} if 'acc_weighted' in out else {})}
    return out

  def server_metrics(self, state: AlgState) -> dict[str, Any]:
    """The server model's accuracy, loss and top-5 accuracy on the test set (device
    scalars, read with the round)."""
    d = self.ctx.data
    acc, loss, acc5 = self.server_model.evaluate(state.server, d.x_test, d.y_test,
                                                 chunk=self.spec.eval.chunk, read=False)
    # Top-5 too: SCARLET's code prints it for CIFAR-100 (as its "Test Accuracy").
    return {'test_acc': acc, 'test_loss': loss, 'test_acc_top5': acc5}

  def server_split_metrics(self, state: AlgState) -> dict[str, float]:
    """``server_ua``: the server model on every client's own test split (the unweighted
    mean over clients), with ``data.per_client_test``; empty without per-client splits.
    Parameter exchange logs it: its server model is the global model every client holds, the
    one a personalised method's UA is compared with (ACE-pFL's FedAvg, FedProx and SCAFFOLD
    baselines)."""
    d = self.ctx.data
    if not self.spec.data.per_client_test or d.test_idx is None:
      return {}
    probs = self.server_model.predict(state.server, d.x_test, chunk=self.spec.eval.chunk)
    return {'server_ua': split_mean_accuracy(probs, d.y_test, d.test_idx,
                                             jnp.asarray(d.test_n))}


def public_rows(x: Array, num_clients: int, count: Any = None, **columns: Array) -> Rows:
  """Rows of shared inputs ``x`` (``[m, ...]``) every client reads, the first ``count`` of
  them (host or device int; default all ``m``), with ``columns`` beside ``x``."""
  m = x.shape[0]
  return Rows({'x': x, **columns}, jnp.arange(m, dtype=jnp.int32),
              jnp.full((num_clients,), m if count is None else count, jnp.int32))


def distillation(program: program_lib.SGD, x: Array, targets: Array, num_clients: int,
                 count: Any = None, weights: Array | None = None) -> tuple[Any, Rows, Any]:
  """``(program, data, row)`` of distillation on ``x[:count]`` (``[m, ...]``): shared soft
  targets ``[m, C]`` are a column of the batches (``batch['t']``); per-client ones
  ``[K, m, C]`` (and ``weights`` ``[K]``, one per client) are rows of each client's inputs.
  Shapes (``jax.ShapeDtypeStruct``) work as arrays do."""
  rows = public_rows(x, num_clients, count)
  if weights is not None:
    if len(targets.shape) == 2:
      targets = jnp.broadcast_to(targets, (num_clients,) + targets.shape)
    return (dataclasses.replace(program, loss=program_lib.weighted_client_soft_ce_loss),
            rows, {'t': targets, 'w': weights})
  if len(targets.shape) == 2:
    return program, public_rows(x, num_clients, count, t=targets), None
  return (dataclasses.replace(program, loss=program_lib.client_soft_ce_loss), rows,
          {'t': targets})


def _shapes(tree: Any, drop: int = 0) -> Any:
  """``jax.ShapeDtypeStruct`` s of ``tree``'s leaves, less their first ``drop`` axes."""
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a)[drop:], a.dtype), tree)


def planned(program: Program, data: Rows | None, row: Any, shared: Any,
            server: bool = False) -> Planned:
  """A :class:`~fedjax_kd.core.kernels.Planned` entry from a run's arguments (arrays or
  shapes, ``row`` and ``data.idx`` with their client axis as ``Federation.run`` takes them):
  the planner's shapes of one client."""
  shared_rows = False
  if data is not None:
    shared_rows = len(np.shape(data.idx)) == 1
    data = Rows(_shapes(data.arrays), _shapes(data.idx, 0 if shared_rows else 1), None)
  return Planned(program, data, _shapes(row, 1), _shapes(shared), shared_rows, server)


@jax.jit
def split_mean_accuracy(probs: Array, y: Array, idx: Array, n: Array) -> Array:
  """The unweighted mean over splits with rows of one model's accuracy on each split
  (``idx`` ``[K, n_max]`` padded rows of ``probs``, ``n`` ``[K]`` real rows)."""
  hit = (jnp.argmax(probs, -1) == y).astype(jnp.float32)
  real = jnp.arange(idx.shape[1])[None, :] < n[:, None]
  per = jnp.sum(jnp.take(hit, idx, axis=0) * real, axis=1) / jnp.maximum(n, 1)
  return jnp.sum(jnp.where(n > 0, per, 0.0)) / jnp.maximum(jnp.sum(n > 0), 1)


@jax.jit
def _nanmean(x: Array) -> Array:
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  return jnp.where(jnp.any(jnp.isfinite(x)), jnp.nanmean(x), jnp.nan)


def nanmean(x) -> Array:
  """The mean over the entries that are not NaN, as a device scalar (no host read).

  NaN when no entry is finite (e.g. every client inactive: their losses are NaN).
  """
  return _nanmean(jnp.asarray(x))


def weighted_mean(acc: np.ndarray, n: np.ndarray) -> float | None:
  """The test-size-weighted mean of the clients' accuracies (None: no client has both)."""
  acc = np.asarray(acc)
  ok = np.isfinite(acc) & (n > 0)
  return float(np.sum(acc[ok] * n[ok]) / np.sum(n[ok])) if ok.any() else None


def host_scalar(value: Any) -> Any:
  """A metric read from the device as a Python number: ``int`` for integer values (as
  payload counts are read, `comm.host_count`), ``bool``, ``float`` for floating ones; Python
  numbers and strings pass through; a :class:`Later` is finished (its ``fn`` of its value)."""
  if isinstance(value, Later):
    return host_scalar(value.fn(value.value))
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  a = np.asarray(value)
  if a.ndim:
    return a.tolist()
  if a.dtype.kind in 'iu':
    return comm.host_count(a)
  if a.dtype.kind == 'b':
    return bool(a)
  return float(a)


def rows_where(mask: Array, a: Array, b: Array) -> Array:
  """``a`` in the rows where ``mask`` ``[S]`` holds, else ``b`` (a per-client select)."""
  return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b)


# ------------------------------------------------------------ the engine
def check_table(table: Any, num_clients: int) -> None:
  """Raises ValueError unless every leaf of a client table has a leading axis of K."""
  bad = wrong_rows(table, num_clients)
  if bad is not None:
    raise ValueError(
        f'client table field {bad[0]} has shape {bad[1]}: every array of AlgState.table has '
        f'one row per client (leading axis K={num_clients}); server-side arrays belong in '
        'AlgState.extra')


def init_state(algo: Algorithm) -> AlgState:
  """``algo.init()``, with the client table moved to the client store if there is one."""
  state = algo.init()
  check_table(state.table, algo.num_clients)
  store = algo.ctx.fed.store
  if store is None:
    return state
  return state.replace(table=store.put(state.table))


def round_input(algo: Algorithm, fed: Federation, t: int, active: np.ndarray,
                carried: dict[str, Any] | None = None) -> Round:
  """The :class:`Round` of ``fed``'s clients (straggler epochs sliced to them)."""
  epochs_k = None
  if algo.ctx.selector is not None:
    epochs = algo.ctx.selector.local_epochs(t, algo.spec.train.epochs)
    if epochs is not None:
      epochs_k = np.asarray(epochs)[fed.global_ids]
  return Round(t=t, fed=fed, active=np.asarray(active, bool), epochs_k=epochs_k,
               carried=carried)


def play_round(algo: Algorithm, state: AlgState, t: int, active: np.ndarray,
               check=None, *, evaluate: bool = False,
               carried: dict[str, Any] | None = None) -> tuple[AlgState, RoundOutput]:
  """One round of ``algo`` on the clients ``active``, wherever client state lives.

  With device-resident clients the round sees all K clients. With a client
  store it runs on a :class:`~fedjax_kd.core.federation.RoundView`: the
  participants' model rows and client-table rows are gathered to the device,
  ``algo.round`` runs on them, and their rows are written back. The algorithm
  does the same in both cases.

  Args:
    algo: the algorithm.
    state: the state after round ``t - 1``.
    t: the round.
    active: ``[K]`` bool mask of participants (at least one).
    check: optional ``check(state, fed, out, finite)`` called on the round's new state
      before it is stored (the runner's NaN guard), with ``finite``, the host value of
      :func:`finite_flags` of that state; for a store this is the participants' compact
      state and the view's federation.
    evaluate: also score the new state (:meth:`Algorithm.evaluate`), as ``out.scores``.
    carried: the previous played round's ``out.carry`` (``{}`` before a run's first round;
      None: unknown, as after a resume), given to the round as :attr:`Round.carried`.

  Returns:
    The new state and the round's output, read to the host in one transfer
    (:meth:`RoundOutput.read`): its metrics, payload counts, scores and the check's
    flags, the round's only read besides those its own host control flow needs. With a
    client store the scores are read after the rows are written back, in a second one.
  """
  fed = algo.ctx.fed
  if fed.store is None:
    state, out = algo.round(state, round_input(algo, fed, t, active, carried))
    if evaluate:
      out = dataclasses.replace(out, scores=algo.evaluate(state))
    out, finite = out.read(finite_flags(state) if check is not None else None)
    if check is not None:
      check(state, fed, out, finite)
    return state, out.finished()
  view = fed.round_view(active)
  vstate = fed.store.gather(state, view)
  vstate, out = algo.round(vstate, round_input(algo, view.fed, t, view.active, carried))
  out, finite = out.read(finite_flags(vstate) if check is not None else None)
  if check is not None:
    check(vstate, view.fed, out, finite)
  state = fed.store.scatter(state, vstate, view)
  if evaluate:
    out = dataclasses.replace(out, scores=algo.scores(state))
  return state, out.finished()


@jax.jit
def finite_flags(tree: Any) -> Any:
  """``tree``'s leaves each as a device bool: every entry finite (True for non-float leaves);
  the NaN guard reads them with the round."""
  def ok(x):
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return jnp.all(jnp.isfinite(x))
    return jnp.bool_(True)
  return jax.tree.map(ok, tree)
