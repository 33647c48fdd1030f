"""The validated experiment: typed, frozen dataclasses.

:func:`fedjax_kd.config.validate` builds an :class:`ExperimentSpec` from a
config; everything below the config layer (the experiment, the algorithms,
client selection) reads this spec, never the config. A leaf module: it
imports nothing from the package.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class DataSpec:
  source: str
  public_source: str
  data_dir: str
  num_public: int
  num_private: int | None
  partition: str
  alpha: float
  shards_per_client: int
  classes_per_client: int
  min_size: int
  per_client_test: bool
  val_fraction: float = 0.0
  dominant_fraction: float = 0.9
  augment: str = 'none'
  augment_predict: bool = True
  label_key: str = ''
  normalize: str = 'unit'
  mean: tuple[float, ...] = ()
  std: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """``model.*``: initializer family and BatchNorm options (None: each model's own)."""
  init: str = 'auto'
  bn_momentum: float | None = None
  bn_epsilon: float | None = None


@dataclasses.dataclass(frozen=True)
class OptimSpec:
  optimizer: str
  learning_rate: float
  momentum: float
  weight_decay: float
  batch_size: int
  epochs: int
  lr_decay: float = 1.0
  fresh_optimizer: bool = False
  compute_dtype: str = 'float32'


@dataclasses.dataclass(frozen=True)
class SelectionSpec:
  """Client selection (``selection.*``); ``m`` clients a round, FedEntOpt buffer ``q``."""
  method: str = 'uniform'
  m: int = 1
  q: int = 0
  dp: bool = False
  epsilon: float = 0.5
  tie_tol: float = 1e-5
  tie_break: str = 'lowest'
  candidates: int = 0
  dropout: float = 0.0
  dropout_mode: str = 'exact'
  stragglers: float = 0.0
  straggler_min_epochs: int = 1


@dataclasses.dataclass(frozen=True)
class ClientsSpec:
  """``clients.*``: who the clients are and where their state lives."""
  num_clients: int
  models: tuple[str, ...]             # clients.models, one spec per client (clients.assignment)
  participation: float
  shared_init: bool
  store: str = 'device'               # 'device' | 'host' | 'disk'
  store_dir: str = ''
  store_chunk: int = 256


@dataclasses.dataclass(frozen=True)
class ServerSpec:
  """``server.*``."""
  model: str                          # server.model ('' in the config: the first client model)


@dataclasses.dataclass(frozen=True)
class DistillSpec:
  """``distill.*``: distillation on the open samples."""
  optimizer: OptimSpec | None         # None for distill.optimizer='same': train's optimizer
  batch_size: int
  epochs: int
  public_per_round: int


@dataclasses.dataclass(frozen=True)
class CommSpec:
  """``comm.*``: byte accounting."""
  rules: str
  thresholds: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """``eval.*``."""
  every: int
  clients: bool
  chunk: int


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
  """``checkpoint.*``."""
  every: int
  keep: int = 2


@dataclasses.dataclass(frozen=True)
class LogSpec:
  """``log.*``."""
  tensorboard: bool = True


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
  """The validated experiment, one field per config group (``spec.eval.every`` is
  ``eval.every``); algorithm options live in ``options``."""
  algorithm: str
  seed: int
  rounds: int
  data: DataSpec
  clients: ClientsSpec
  server: ServerSpec
  train: OptimSpec
  distill: DistillSpec
  comm: CommSpec
  eval: EvalSpec
  checkpoint: CheckpointSpec
  log: LogSpec = LogSpec()
  selection: SelectionSpec = SelectionSpec()
  model: ModelOptions = ModelOptions()
  options: Any = None
  raw: Any = None                     # the ConfigDict, for writing to the workdir

  @property
  def partial(self) -> bool:
    """Whether a round can leave clients out (sampling or dropout)."""
    return self.clients.participation < 1.0 or self.selection.dropout > 0
