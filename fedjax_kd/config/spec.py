"""The experiment's options, declared once: one frozen dataclass per config group.

Each engine group (``data``, ``clients``, ``train``, ...) is a frozen dataclass whose fields
are :func:`fedjax_kd.options.option` declarations: the default of ``default_config``, the
one-line doc of ``docs/configs.md``'s tables and the check. A group's ``validate(spec,
algorithm)`` holds its rules across fields and groups (groups are validated in the order of
:class:`ExperimentSpec`'s fields, so a group sees the ones before it checked), and sets its
:func:`~fedjax_kd.options.derived` fields. :func:`fedjax_kd.config.validate` reads the whole
:class:`ExperimentSpec` with :func:`fedjax_kd.options.read`; everything below the config
layer (the experiment, the algorithms, client selection) reads this spec, never the config.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from fedjax_kd import fields
from fedjax_kd import options
from fedjax_kd.data import augment as augment_lib
from fedjax_kd.data import partition as partition_lib
from fedjax_kd.errors import ConfigError
from fedjax_kd.models import registry
from fedjax_kd.ops import comm
from fedjax_kd.ops.errors import ParamError

option, derived, nested = options.option, options.derived, options.nested

OPTIMIZERS = ('sgd', 'adam')
COMPUTE_DTYPES = ('float32', 'bfloat16')   # train.compute_dtype (core.kernels.COMPUTE_DTYPES)
NORMALIZATIONS = ('unit', 'symmetric', 'standardize')
STORES = ('device', 'host', 'disk')
SOURCES = "'digits', 'synthetic[:N]', 'npz:<path>' or 'tfds:<name>'"


def _below_one(value: float, field: str) -> float:
  if value >= 1.0:
    raise ConfigError(field, value, 'a number in [0, 1)')
  return value


def _source(value: Any, field: str) -> str:
  if not isinstance(value, str) or not value:
    raise ConfigError(field, value, SOURCES)
  return value


def _channel_numbers(value: Any, field: str) -> tuple[float, ...]:
  if not isinstance(value, (tuple, list)) or not all(
      isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a)
      for a in value):
    raise ConfigError(field, value, 'a tuple of per-channel numbers, or () to use the data')
  return tuple(float(a) for a in value)


def _model_spec(value: Any, field: str) -> str:
  """``'cnn'`` -> ``'cnn@1'``, ``'cnn@0.50'`` -> ``'cnn@0.5'``."""
  if not isinstance(value, str):
    raise ConfigError(field, value, 'a "name@width" string')
  with fields.as_fields({}):
    name, width = registry.parse_spec(value, field=field)
  return f'{name}@{width:g}'


def _model_specs(value: Any, field: str) -> tuple[str, ...]:
  value = (value,) if isinstance(value, str) else tuple(value)
  if not value:
    raise ConfigError(field, list(value), 'a non-empty list of "name@width" specs')
  return tuple(_model_spec(v, field) for v in value)


def _server_model(value: Any, field: str) -> str:
  return value if value == '' else _model_spec(value, field)


def _own_or_unit(value: Any, field: str) -> float | None:
  """-1 (each model's own value) as None, else a number in (0, 1)."""
  v = fields.number({field.split('.')[0]: {field.split('.')[1]: value}}, field)
  if v != -1.0 and not 0.0 < v < 1.0:
    raise ConfigError(field, v, "a number in (0, 1), or -1 for each model's own")
  return None if v == -1.0 else v


def _client_chunk(value: Any, field: str) -> int | None:
  """``'auto'`` as None (the memory planner chooses), else a number of clients >= 1."""
  if isinstance(value, str) and value.strip().lower() == 'auto':
    return None
  try:
    n = int(str(value).strip())
  except ValueError:
    n = 0
  if n < 1 or isinstance(value, float) and value != n:
    raise ConfigError(field, value, "'auto' or a number of clients >= 1")
  return n


def _comm_rules(value: Any, field: str) -> str:
  try:
    comm.get_rules(value)
  except ParamError as e:
    raise fields.field_error(e, {'name': field}) from None
  return value


def _accuracies(value: Any, field: str) -> tuple[float, ...]:
  if not isinstance(value, (tuple, list)) or not all(
      isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1 for x in value):
    raise ConfigError(field, value, 'a tuple of accuracies in (0, 1], e.g. (0.5, 0.6)')
  return tuple(float(x) for x in value)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """``data.*``: where the data comes from, how it is split over clients and scaled."""
  group: ClassVar[str] = 'data'
  source: str = option('digits', 'where the rows come from: the embedded digits, synthetic '
                       'rows, an npz file, a tfds data set or a registered source',
                       check=_source, allowed=SOURCES)
  public_source: str = option('', "the open set's source; '' carves it from the training set "
                              '(DS-FL)')
  data_dir: str = option('', "tfds' data_dir")
  num_public: int = option(400, 'rows of the open (public) set', ge=0)
  num_private: int = option(-1, 'rows of the private set; -1: all remaining training rows',
                            ge=-1)
  partition: str = option('shards', "how private rows go to clients ('natural': the "
                          "source's client ids)", choices=partition_lib.SCHEMES)
  alpha: float = option(0.5, 'Dirichlet concentration', gt=0)
  shards_per_client: int = option(2, "'shards': label-sorted shards per client", ge=1)
  classes_per_client: int = option(2, "'classes': classes per client", ge=1)
  min_size: int = option(10, 'per-class Dirichlet: min samples per client', ge=0)
  per_client_test: bool = option(False, "per-client test splits with the clients' label "
                                 'priors')
  val_fraction: float = option(0.0, "per-client validation rows held out of each client's "
                               'rows', ge=0, check=_below_one, allowed='a number in [0, 1)')
  dominant_fraction: float = option(0.9, "'dominant': each client's share of its main class",
                                    gt=0, le=1)
  augment: str = option('none', 'augmentation of training batches',
                        choices=augment_lib.AUGMENTATIONS)
  augment_predict: bool = option(True, 'with data.augment: clients also augment what they '
                                 'predict on')
  label_key: str = option('', "tfds: which ClassLabel feature ('' = the supervised label), "
                          "e.g. 'coarse_label' for CIFAR-100's 20 superclasses")
  normalize: str = option('unit', "input scaling of the [0, 1] sources: 'unit' keeps it, "
                          "'symmetric' maps to [-1, 1], 'standardize' to (x - mean) / std",
                          choices=NORMALIZATIONS)
  mean: tuple[float, ...] = option((), "'standardize': per-channel means; () takes the "
                                   "training set's", check=_channel_numbers)
  std: tuple[float, ...] = option((), "'standardize': per-channel stds; () takes the "
                                  "training set's", check=_channel_numbers)
  noisy_classes: int = option(0, "noisy labels (DS-FL's attack, Sec. 4): each client "
                             'relabels all its rows of C random source classes as C other '
                             'random classes; 0 is off', ge=0)
  public_noise_source: str = option('', "noisy open data (DS-FL's attack): the source whose "
                                    'training rows are added to the open set')
  num_public_noise: int = option(0, 'rows of data.public_noise_source added to the open set '
                                 '(I^n); they carry no true class', ge=0)

  def validate(self, spec, algorithm) -> None:
    del spec, algorithm
    if self.label_key and not self.source.startswith('tfds:'):
      raise ConfigError('data.label_key', self.label_key,
                        "'' (only tfds: sources have several label features)")
    if (self.mean or self.std) and self.normalize != 'standardize':
      raise ConfigError('data.mean' if self.mean else 'data.std', self.mean or self.std,
                        "() unless data.normalize='standardize'")
    if len(self.mean) != len(self.std):
      raise ConfigError('data.std', self.std,
                        f'{len(self.mean)} numbers, one per data.mean channel')
    if any(a <= 0 for a in self.std):
      raise ConfigError('data.std', self.std, 'numbers > 0')
    if self.num_public_noise and not self.public_noise_source:
      raise ConfigError('data.public_noise_source', self.public_noise_source,
                        f'a source (data.num_public_noise={self.num_public_noise} rows are '
                        'drawn from it)')


@dataclasses.dataclass(frozen=True)
class ClientsSpec:
  """``clients.*``: who the clients are and where their state lives."""
  group: ClassVar[str] = 'clients'
  num_clients: int = option(10, 'K, the number of clients', ge=1)
  models: tuple[str, ...] = option(('cnn@1.0',), 'the model specs ("name@width") that '
                                   'clients.assignment hands out; in the spec, the spec of '
                                   'each client, in client order', check=_model_specs,
                                   allowed='a tuple of "name@width" specs')
  assignment: str = option('round_robin', "'round_robin', 'blocks' or model indices "
                           "'0,1,1,0' (one per client)")
  participation: float = option(1.0, 'fraction of the clients selected per round', gt=0, le=1)
  shared_init: bool = option(False, 'True: clients and server start from one draw')
  store: str = option('device', "where client states live between rounds: 'device' "
                      "(stacked on the accelerator), 'host' (host memory) or 'disk' (.npy "
                      'memory maps); for K >> clients per round', choices=STORES)
  store_dir: str = option('', "clients.store='disk': the folder ('' = <workdir>/"
                          'client_store)')
  store_chunk: int = option(256, 'clients per transfer when all are visited (eval, init)',
                            ge=1)
  chunk: int | None = option('auto', 'clients each device trains, predicts and evaluates at '
                             "once, in one program (memory for time); 'auto': the most that "
                             'fit, all where everything fits', check=_client_chunk,
                             allowed="'auto' or a number of clients >= 1")
  listed: tuple[str, ...] = derived((), 'clients.models as the config lists them')

  def validate(self, spec, algorithm) -> ClientsSpec:
    del spec, algorithm
    k, models, assignment = self.num_clients, self.models, self.assignment
    allowed = ("'round_robin', 'blocks' or a comma-separated list of "
               f'{k} model indices in [0, {len(models) - 1}]')
    if assignment == 'round_robin':
      picks = [i % len(models) for i in range(k)]
    elif assignment == 'blocks':
      picks = [i * len(models) // k for i in range(k)]
    else:
      try:
        picks = [int(a) for a in str(assignment).replace(' ', '').strip('[]()').split(',')]
      except ValueError:
        raise ConfigError('clients.assignment', assignment, allowed) from None
      if len(picks) != k or not all(0 <= a < len(models) for a in picks):
        raise ConfigError('clients.assignment', assignment, allowed)
    return dataclasses.replace(self, models=tuple(models[a] for a in picks), listed=models)


@dataclasses.dataclass(frozen=True)
class ServerSpec:
  """``server.*``: the server model (algorithms that have one)."""
  group: ClassVar[str] = 'server'
  model: str = option('', "the server model's spec; '' = the first of clients.models",
                      check=_server_model, allowed='a "name@width" string, or \'\'')

  def validate(self, spec, algorithm) -> ServerSpec:
    del algorithm
    return self if self.model else dataclasses.replace(self, model=spec.clients.listed[0])


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """``model.*``: the options of every model (clients and server)."""
  group: ClassVar[str] = 'model'
  init: str = option('auto', "initializer family: 'auto' is each model's own, the init= it "
                     'is registered with (fedjax_kd.models.entry(name).init)',
                     choices=registry.INIT_CHOICES)
  bn_momentum: float | None = option(
      -1.0, "every BatchNorm's momentum, flax's convention (running = m * running + (1 - m) "
      "* batch: PyTorch's 0.1 is 0.9); -1 keeps each model's own (0.9)", check=_own_or_unit,
      allowed="a number in (0, 1), or -1")
  bn_epsilon: float | None = option(-1.0, "every BatchNorm's epsilon; -1 keeps each model's "
                                    'own (1e-5)', check=_own_or_unit,
                                    allowed='a number in (0, 1), or -1')


@dataclasses.dataclass(frozen=True)
class OptimSpec:
  """``train.*``: the clients' private training and its optimizer."""
  group: ClassVar[str] = 'train'
  optimizer: str = option('sgd', 'the optimizer', choices=OPTIMIZERS)
  learning_rate: float = option(0.1, 'learning rate', gt=0)
  momentum: float = option(0.0, 'momentum (SGD) or beta1 (Adam)', ge=0, le=1)
  weight_decay: float = option(0.0, 'L2 weight decay', ge=0)
  batch_size: int = option(100, 'minibatch size', ge=1)
  epochs: int = option(5, 'local epochs a round', ge=0)
  lr_decay: float = option(1.0, 'the lr of round r is learning_rate * lr_decay ** (r - 1)',
                           gt=0, le=1)
  fresh_optimizer: bool = option(False, 'a new optimizer state every round (NIID-Bench, '
                                 'FedEntOpt)')
  compute_dtype: str = option('float32', "forward-pass dtype: 'bfloat16' is mixed precision "
                              '(params, optimizer state, BatchNorm statistics, losses and '
                              'uploads stay float32), for GPU/TPU', choices=COMPUTE_DTYPES)


@dataclasses.dataclass(frozen=True)
class SelectionSpec:
  """``selection.*``: client selection for every algorithm; M = round(participation * K)."""
  group: ClassVar[str] = 'selection'
  method: str = option('uniform', 'how the M clients of a round are chosen: a method of '
                       'fedjax_kd.selection.METHODS (fedjax_kd.selection.register adds one)')
  buffer: float = option(0.5, 'FedEntOpt: FIFO size Q = floor(buffer * K) <= K - M', ge=0)
  dp: bool = option(False, 'FedEntOpt: Laplace noise on the uploaded label counts')
  epsilon: float = option(0.5, "FedEntOpt: the noise's epsilon", gt=0)
  tie_tol: float = option(1e-5, 'FedEntOpt: entropies within this many bits tie', ge=0)
  tie_break: str = option('lowest', "FedEntOpt: ties go to the 'lowest' client index or a "
                          "'random' one", choices=('lowest', 'random'))
  candidates: int = option(0, 'Power-of-Choice: d candidates (M <= d <= K); 0 = min(K, 2M)',
                           ge=0)
  kl_threshold: float = option(0.0, "KL (Seol & Kim): stop adding clients once the cohort's "
                               'KL divergence to uniform (nats) is below this; 0 = M clients',
                               ge=0)
  dropout: float = option(0.0, 'fraction of the selected clients that drop out', ge=0,
                          check=_below_one, allowed='a number in [0, 1)')
  dropout_mode: str = option('exact', "'exact': round(dropout * M) drop out; 'bernoulli': "
                             'each client with that probability', choices=('exact', 'bernoulli'))
  stragglers: float = option(0.0, 'fraction of the pool that are stragglers', ge=0, le=1)
  straggler_min_epochs: int = option(1, 'a selected straggler runs U{min, train.epochs} epochs',
                                     ge=1)
  m: int = derived(1, 'M, the clients selected a round')
  q: int = derived(0, "FedEntOpt's FIFO size Q")

  def validate(self, spec, algorithm) -> SelectionSpec:
    del algorithm
    k = spec.clients.num_clients
    m = cohort_size(spec.clients.participation, k)
    q = int(math.floor(self.buffer * k + 1e-9))
    if self.buffer >= 1.0:
      raise ConfigError('selection.buffer', self.buffer,
                        f'a fraction in [0, 1) of the {k} clients (Q = floor(buffer * K) must '
                        'be smaller than the number of clients)')
    if self.candidates > k:
      raise ConfigError('selection.candidates', self.candidates, f'an integer in [0, {k}]')
    if self.straggler_min_epochs > max(spec.train.epochs, 1):
      raise ConfigError('selection.straggler_min_epochs', self.straggler_min_epochs,
                        f'an integer in [1, train.epochs = {spec.train.epochs}]')
    return dataclasses.replace(self, m=m, q=q, candidates=self.candidates or min(k, 2 * m))


@dataclasses.dataclass(frozen=True)
class DistillSpec:
  """``distill.*``: distillation on the open samples."""
  group: ClassVar[str] = 'distill'
  optimizer: str | OptimSpec | None = option(
      'same', "'same' shares train's optimizer and its state (as Keras does), else its own "
      "optimizer; in the spec, that optimizer's OptimSpec, or None for 'same'",
      choices=('same',) + OPTIMIZERS)
  learning_rate: float = option(0.1, "its own optimizer's learning rate", gt=0)
  momentum: float = option(0.0, "its own optimizer's momentum", ge=0, le=1)
  weight_decay: float = option(0.0, "its own optimizer's weight decay", ge=0)
  batch_size: int = option(100, 'minibatch size', ge=1)
  epochs: int = option(5, 'distillation epochs a round', ge=0)
  public_per_round: int = option(300, '|o_r|: open samples a round (<= data.num_public)', ge=1)

  def validate(self, spec, algorithm) -> DistillSpec:
    if algorithm is not None and algorithm.uses_public and algorithm.samples_public:
      if self.public_per_round > spec.data.num_public:
        raise ConfigError('distill.public_per_round', self.public_per_round,
                          f'an integer <= data.num_public ({spec.data.num_public}): '
                          'the per-round sample is drawn from the public set')
      if self.batch_size > self.public_per_round:
        raise ConfigError('distill.batch_size', self.batch_size,
                          f'an integer <= distill.public_per_round ({self.public_per_round}): '
                          'a larger batch is padding in every distillation step')
    if self.optimizer == 'same':
      return dataclasses.replace(self, optimizer=None)
    return dataclasses.replace(self, optimizer=OptimSpec(
        optimizer=self.optimizer, learning_rate=self.learning_rate, momentum=self.momentum,
        weight_decay=self.weight_decay, batch_size=self.batch_size, epochs=0))


@dataclasses.dataclass(frozen=True)
class CommSpec:
  """``comm.*``: byte accounting."""
  group: ClassVar[str] = 'comm'
  rules: str = option('paper', "the byte-count rules: 'paper' (the algorithm's own paper) or "
                      'a named rule set', check=_comm_rules,
                      allowed=', '.join(f"`'{r}'`" for r in ('paper',) + tuple(comm.RULES)))
  thresholds: tuple[float, ...] = option((0.8, 0.9), 'ComU@x: the accuracies whose bytes the '
                                         'summary reports', check=_accuracies,
                                         allowed='a tuple of accuracies in (0, 1]')


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """``eval.*``: how often and how much is scored."""
  group: ClassVar[str] = 'eval'
  every: int = option(1, 'rounds between evaluations', ge=1)
  clients: bool = option(True, 'also score every client model')
  chunk: int = option(512, 'test rows a batch', ge=1)


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
  """``checkpoint.*``: saving the run to resume it."""
  group: ClassVar[str] = 'checkpoint'
  every: int = option(10, 'rounds between checkpoints (and at exit); 0 = never', ge=0)
  keep: int = option(2, 'newest checkpoints kept in <workdir>/checkpoints', ge=1)


@dataclasses.dataclass(frozen=True)
class LogSpec:
  """``log.*``: what is logged besides the metrics files."""
  group: ClassVar[str] = 'log'
  tensorboard: bool = option(True, 'scalars in <workdir>/tensorboard')


def cohort_size(participation: float, num_clients: int) -> int:
  """M = round(participation * K), at least 1 (FedEntOpt's cohort size)."""
  return max(1, min(num_clients, int(round(participation * num_clients))))


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
  """The validated experiment: the top-level fields and one field per config group
  (``spec.eval.every`` is ``eval.every``); the algorithm's options are ``options``."""
  group: ClassVar[str] = ''
  algorithm: str = option('dsfl', 'the algorithm (a registered name)')
  seed: int = option(0, 'the seed of everything random', ge=0)
  rounds: int = option(30, 'communication rounds', ge=1)
  data: DataSpec = nested(DataSpec)
  clients: ClientsSpec = nested(ClientsSpec)
  server: ServerSpec = nested(ServerSpec)
  model: ModelOptions = nested(ModelOptions)
  train: OptimSpec = nested(OptimSpec)
  selection: SelectionSpec = nested(SelectionSpec)
  distill: DistillSpec = nested(DistillSpec)
  comm: CommSpec = nested(CommSpec)
  eval: EvalSpec = nested(EvalSpec)
  checkpoint: CheckpointSpec = nested(CheckpointSpec)
  log: LogSpec = nested(LogSpec)
  options: Any = derived(None, "the algorithm's options (its options_class)")
  raw: Any = derived(None, 'the ConfigDict, for writing to the workdir')

  @property
  def partial(self) -> bool:
    """Whether a round can leave clients out (sampling or dropout)."""
    return self.clients.participation < 1.0 or self.selection.dropout > 0
