"""Experiment configuration: defaults, validation and the typed, frozen spec.

A config is an ``ml_collections.ConfigDict`` (config files in ``configs/`` call
:func:`default_config` and override fields). :func:`validate` checks every
field *before any data is loaded or compiled* and returns an
:class:`ExperimentSpec`; a bad value raises
:class:`~fedjax_kd.errors.ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

import ml_collections
import numpy as np

from fedjax_kd import fields
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops.errors import ParamError
from fedjax_kd.spec import (
    CheckpointSpec, ClientsSpec, CommSpec, DataSpec, DistillSpec, EvalSpec, ExperimentSpec,
    LogSpec, ModelOptions, OptimSpec, ServerSpec, SelectionSpec)

# The readers, under the short names this module uses (fedjax_kd.fields documents them).
_get, _int, _float, _bool, _choice = (fields.get, fields.integer, fields.number,
                                      fields.boolean, fields.choice)

OPTIMIZERS = ('sgd', 'adam')
COMPUTE_DTYPES = ('float32', 'bfloat16')   # train.compute_dtype (core.kernels.COMPUTE_DTYPES)


def default_config() -> ml_collections.ConfigDict:
  """Every field with its default; config files override what they need."""
  c = ml_collections.ConfigDict()
  c.algorithm = 'dsfl'
  c.seed = 0
  c.rounds = 30

  c.data = ml_collections.ConfigDict()
  c.data.source = 'digits'          # digits | synthetic[:N] | npz:<path> | tfds:<name> | registered
  c.data.public_source = ''         # '' = carve public from the training set (DS-FL)
  c.data.data_dir = ''              # tfds data_dir
  c.data.num_public = 400
  c.data.num_private = -1           # -1: all remaining training samples
  c.data.partition = 'shards'       # see fedjax_kd.data.partition.SCHEMES ('natural': client ids)
  c.data.alpha = 0.5                # Dirichlet concentration
  c.data.shards_per_client = 2
  c.data.classes_per_client = 2
  c.data.dominant_fraction = 0.9    # 'dominant': each client's share of its main class
  c.data.min_size = 10              # per-class Dirichlet: min samples per client
  c.data.per_client_test = False    # per-client test splits with the same priors
  c.data.val_fraction = 0.0         # per-client validation rows held out of each shard
  c.data.label_key = ''             # tfds: which ClassLabel feature ('' = supervised label),
                                    # e.g. 'coarse_label' for CIFAR-100's 20 superclasses
  c.data.augment = 'none'           # 'none' | 'flip_crop' | 'jitter_flip_gray' (training batches)
  c.data.augment_predict = True     # with data.augment: clients also augment what they predict on
  # Input scaling after loading (sources give [0, 1]): 'unit' keeps [0, 1]; 'symmetric' maps
  # to [-1, 1] (2x - 1); 'standardize' maps each channel to (x - mean) / std with data.mean and
  # data.std, or, where they are empty, the per-channel mean/std of the source's training set.
  c.data.normalize = 'unit'
  c.data.mean = ()
  c.data.std = ()

  c.clients = ml_collections.ConfigDict()
  c.clients.num_clients = 10
  c.clients.models = ('cnn@1.0',)    # tuples, so --config.x="('a','b')" can override
  c.clients.assignment = 'round_robin'   # 'round_robin', 'blocks' or model indices '0,1,1,0'
  c.clients.participation = 1.0          # fraction of clients selected per round, in (0, 1]
  c.clients.shared_init = False          # True: clients and server start from one draw
  # Where client states live between rounds: 'device' (stacked on the accelerator),
  # 'host' (host memory; only a round's participants go to the device) or 'disk'
  # (.npy memory maps in store_dir, default <workdir>/client_store). For K >> clients per round.
  c.clients.store = 'device'
  c.clients.store_dir = ''
  c.clients.store_chunk = 256            # clients per transfer when all are visited (eval, init)

  c.server = ml_collections.ConfigDict()
  c.server.model = ''                    # '' = the first client model spec

  # Options of every model (clients and server). init: 'auto' (each model's own choice, the
  # init= it is registered with: fedjax_kd.models.entry(name).init) | 'torch' | 'keras' |
  # 'flax' | 'he' | 'module'.
  # bn_momentum (flax convention: running = m * running + (1 - m) * batch; PyTorch's 0.1 is
  # 0.9) and bn_epsilon for every BatchNorm; -1 keeps each model's own (0.9 and 1e-5).
  c.model = ml_collections.ConfigDict()
  c.model.init = 'auto'
  c.model.bn_momentum = -1.0
  c.model.bn_epsilon = -1.0

  c.train = ml_collections.ConfigDict()
  c.train.optimizer = 'sgd'
  c.train.learning_rate = 0.1
  c.train.momentum = 0.0
  c.train.weight_decay = 0.0
  c.train.batch_size = 100
  c.train.epochs = 5
  c.train.lr_decay = 1.0                 # lr of round r = learning_rate * lr_decay ** (r - 1)
  c.train.fresh_optimizer = False        # new optimizer state every round (NIID-Bench, FedEntOpt)
  # Forward-pass dtype: 'float32' | 'bfloat16' (mixed precision: params, optimizer state,
  # BatchNorm statistics, losses and the predictions sent to aggregation stay float32).
  # bfloat16 is meant for GPU/TPU; on XLA:CPU it is slower than float32 (docs/performance.md,
  # "Precision and compilation").
  c.train.compute_dtype = 'float32'

  # Client selection for every algorithm (FedEntOpt's layer); M = round(participation * K).
  c.selection = ml_collections.ConfigDict()
  c.selection.method = 'uniform'         # 'uniform' | 'fedentopt' | 'power_of_choice'
  c.selection.buffer = 0.5               # FedEntOpt FIFO size Q = floor(buffer * K) <= K - M
  c.selection.dp = False                 # FedEntOpt: Laplace noise on the uploaded label counts
  c.selection.epsilon = 0.5              # ... its epsilon (> 0)
  c.selection.tie_tol = 1e-5             # FedEntOpt: entropies within this many bits tie
  c.selection.tie_break = 'lowest'       # ... 'lowest' client index | 'random'
  c.selection.candidates = 0             # Power-of-Choice d (M <= d <= K); 0 = min(K, 2M)
  c.selection.dropout = 0.0              # fraction of the selected clients that drop out
  c.selection.dropout_mode = 'exact'     # 'exact' round(dropout * M) | 'bernoulli' per client
  c.selection.stragglers = 0.0           # fraction of the pool that are stragglers
  c.selection.straggler_min_epochs = 1   # a selected straggler runs U{min, train.epochs} epochs

  c.distill = ml_collections.ConfigDict()
  c.distill.optimizer = 'same'           # 'same' shares the train optimizer state (as Keras)
  c.distill.learning_rate = 0.1
  c.distill.momentum = 0.0
  c.distill.weight_decay = 0.0
  c.distill.batch_size = 100
  c.distill.epochs = 5
  c.distill.public_per_round = 300       # |o_r| (<= data.num_public)

  c.comm = ml_collections.ConfigDict()
  c.comm.rules = 'paper'
  c.comm.thresholds = (0.8, 0.9)         # ComU@x reported in the summary

  c.eval = ml_collections.ConfigDict()
  c.eval.every = 1
  c.eval.clients = True                  # also score every client model
  c.eval.chunk = 512

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 10                # rounds between checkpoints (and at exit); 0 = never
  c.checkpoint.keep = 2                  # newest checkpoints kept in <workdir>/checkpoints

  c.log = ml_collections.ConfigDict()
  c.log.tensorboard = True               # scalars in <workdir>/tensorboard
  # Each algorithm's own group (dsfl, scarlet, cache, comet, selective_fd, fedcache2, acepfl,
  # fedmd, fedprox, fd, and those of algorithms you register) is declared with its class.
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  for group, defaults in algorithms.config_groups().items():
    if group in c:
      raise ValueError(f'the config group {group!r} of an algorithm is a group of the engine '
                       f'(fields: {", ".join(sorted(c[group]))}): rename it')
    c[group] = ml_collections.ConfigDict(dict(defaults))
  return c


def override(config: ml_collections.ConfigDict, fields: dict[str, Any]) -> ml_collections.ConfigDict:
  """Sets dotted fields in place, e.g. ``{'cache.duration': 25}``; returns ``config``."""
  for field, value in fields.items():
    node = config
    *path, last = field.split('.')
    for part in path:
      node = node[part]
    node[last] = value
  return config


NORMALIZATIONS = ('unit', 'symmetric', 'standardize')
SELECTORS = ('uniform', 'fedentopt', 'power_of_choice')

# FedEntOpt's whole [rounds, clients a round] int64 schedule is computed (and written to
# selection.json) up front; a config that would need more than this is refused.
MAX_SCHEDULE_BYTES = 64 * 2**20


def _type_name(v: Any) -> str:
  if isinstance(v, bool):
    return 'True or False'
  if isinstance(v, int):
    return 'an integer'
  if isinstance(v, float):
    return 'a number'
  if isinstance(v, str):
    return 'a string'
  return 'a tuple'


def _same_kind(v: Any, default: Any) -> bool:
  """Whether ``v`` may replace ``default`` (ints for floats, lists for tuples)."""
  if default is None:
    return True
  if isinstance(default, (bool, np.bool_)):
    return isinstance(v, (bool, np.bool_))
  if isinstance(default, int):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
  if isinstance(default, float):
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
  if isinstance(default, str):
    return isinstance(v, str)
  if isinstance(default, (tuple, list)):
    return isinstance(v, (tuple, list))
  return True


def shipped_configs() -> dict[str, str]:
  """The configs installed with the package (``fedjax_kd.configs``): name -> file path.

  Run from a source tree (``python -m fedjax_kd.main`` in a checkout imports the checkout's
  ``fedjax_kd/``, which holds no ``configs`` package), they are the repository's ``configs/``.
  """
  import importlib.resources  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  try:
    folder = importlib.resources.files('fedjax_kd.configs')
  except ModuleNotFoundError:
    folder = pathlib.Path(__file__).resolve().parent.parent / 'configs'
    if not folder.is_dir():
      return {}
  return {f.name[:-3]: str(f) for f in sorted(folder.iterdir(), key=lambda f: f.name)
          if f.name.endswith('.py') and not f.name.startswith('_')}


def _file_and_arg(path: str) -> tuple[str, str | None]:
  """``'dir/c.py:ARG'`` -> ``('dir/c.py', 'ARG')``; ``'dir/c.py'`` -> ``('dir/c.py', None)``."""
  file, sep, arg = path.partition('.py:')
  return (file + '.py', arg) if sep else (file, None)


def resolve_path(path: str) -> str:
  """A ``--config`` value as a file path: an existing file as given, else ``NAME[:ARG]``
  of a shipped config (``default``, ``dsfl_mnist``, ...) as its installed file."""
  import os  # pylint: disable=g-import-not-at-top
  if not isinstance(path, str) or not path:
    return path
  if os.path.exists(_file_and_arg(path)[0]):
    return path
  name, colon, arg = path.partition(':')
  if name and not name.endswith('.py') and '/' not in name and os.sep not in name:
    shipped = shipped_configs()
    if name in shipped:
      return shipped[name] + (f':{arg}' if colon else '')
  return path


def absolute_path(path: str) -> str:
  """A ``--config`` value as ``/absolute/file.py[:ARG]`` (a shipped name as its installed
  file), so that another process in another folder loads the same file."""
  import os  # pylint: disable=g-import-not-at-top
  file, arg = _file_and_arg(resolve_path(path))
  return os.path.abspath(file) + (f':{arg}' if arg is not None else '')


# The config files this process has executed (absolute_path), by load_file.
_EXECUTED: set[str] = set()


def run_file_once(path: str) -> None:
  """Executes a config file (``load_file``) unless this process already did, so that what
  it registers (algorithms, models, data sources) exists here; a sweep's workers call it.

  Raises:
    ConfigError: as :func:`load_file`.
  """
  if absolute_path(path) not in _EXECUTED:
    load_file(path)


def load_file(path: str) -> ml_collections.ConfigDict:
  """A config file's ``get_config()``, as ``ml_collections.config_flags`` loads it.

  Args:
    path: ``file.py`` or ``file.py:ARG`` (``ARG`` is passed to ``get_config``), or
      ``NAME[:ARG]`` of a shipped config (:func:`shipped_configs`).

  Raises:
    ConfigError: (field ``--config``) the file is missing or not a file, does not import
      (the error and its line are named), has no ``get_config``, or ``get_config`` fails or
      returns something other than a ConfigDict.
  """
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  given, path = path, resolve_path(path)
  file, arg = _file_and_arg(path)
  if not os.path.isfile(file):
    bare = '/' not in given and os.sep not in given and not given.endswith('.py')
    raise ConfigError('--config', given, 'an existing config file' + (
        f' ({file} is a directory)' if os.path.isdir(file) else f' ({file} does not exist)')
        + (f' or a shipped config name: {", ".join(shipped_configs())}' if bare else ''))
  name = f'_fedjax_kd_config_{abs(hash(os.path.abspath(file)))}'
  try:
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
      raise ImportError('not a Python file')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ConfigError('--config', path, f'a Python file that imports (SyntaxError at line '
                      f'{e.lineno}: {e.msg})') from None
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError('--config', path, f'a Python file that imports ({type(e).__name__}: '
                      f'{" ".join(str(e).split())})') from None
  if not callable(getattr(module, 'get_config', None)):
    raise ConfigError('--config', path, 'a file defining get_config()')
  try:
    config = module.get_config(arg) if arg else module.get_config()
  except Exception as e:  # pylint: disable=broad-except
    raise ConfigError('--config', path, f'a get_config() that runs ({type(e).__name__}: '
                      f'{" ".join(str(e).split())})') from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError('--config', path, 'a get_config() returning a ConfigDict (it returned '
                      f'{type(config).__name__})')
  _EXECUTED.add(absolute_path(path))
  return config


def _unknown(field: str, value: Any, ref: ml_collections.ConfigDict, prefix: str
             ) -> ConfigError:
  """The error for a field ``ref`` (the group at ``prefix``) does not have."""
  key = field[len(prefix):].split('.', 1)[0]
  near = difflib.get_close_matches(key, list(ref.keys()), n=1)
  hint = f' (did you mean {prefix}{near[0]}?)' if near else ''
  where = f"group '{prefix[:-1]}'" if prefix else 'the top level'
  return ConfigError(f'{prefix}{key}', value, f'a known field of {where}: '
                     + ', '.join(sorted(ref.keys())) + hint)


def check_field_name(config: ml_collections.ConfigDict, field: str, value: Any = None
                     ) -> None:
  """``field`` (dotted, e.g. ``train.learning_rate``) names a field of ``config``.

  Raises:
    ConfigError: a part of the path is not in its group (the closest name is suggested),
      or a group is named as if it were a field or the reverse.
  """
  node, prefix = config, ''
  parts = field.split('.')
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict):
      raise ConfigError(field, value, f"a known field ('{prefix[:-1]}' is a field, not a "
                        'group)')
    if part not in node:
      raise _unknown(field, value, node, prefix)
    node, prefix = node[part], f'{prefix}{part}.'
  if isinstance(node, ml_collections.ConfigDict) and i == len(parts) - 1:
    raise ConfigError(field, value, f'a field (\'{field}\' is a group with fields '
                      f'{", ".join(sorted(node.keys()))})')


def check_fields(config: ml_collections.ConfigDict) -> None:
  """Every field of ``config`` exists in :func:`default_config` and has its type.

  Catches typos (``train.learing_rate``) and wrong types (``'0.1'`` for a
  number, ``1`` for a flag) in every group, also those the chosen algorithm
  does not read; ranges and cross-field rules are checked by :func:`validate`.

  Raises:
    ConfigError: naming the field, what was given and what is allowed.
  """
  def walk(node, ref, prefix):
    for key in node.keys():
      field = f'{prefix}{key}'
      value = node[key]
      if key not in ref:
        raise _unknown(field, value, ref, prefix)
      default = ref[key]
      if isinstance(default, ml_collections.ConfigDict):
        if not isinstance(value, ml_collections.ConfigDict):
          raise ConfigError(field, value, f'a group with fields {", ".join(sorted(default))}')
        walk(value, default, f'{field}.')
      elif not _same_kind(value, default):
        raise ConfigError(field, value, _type_name(default))
  walk(config, default_config(), '')


def _val_fraction(c) -> float:
  v = _float(c, 'data.val_fraction', 0.0)
  if v >= 1.0:
    raise ConfigError('data.val_fraction', v, 'a number in [0, 1)')
  return v


def _dominant_fraction(c) -> float:
  # Configs written before the field existed (a resumed run's config.json) lack it.
  if 'dominant_fraction' not in c.data:
    return 0.9
  return _float(c, 'data.dominant_fraction', 0.0, lo_open=True, hi=1.0)


def _label_key(c, source: str) -> str:
  v = _get(c, 'data.label_key') or ''
  if not isinstance(v, str):
    raise ConfigError('data.label_key', v, "a feature name string or ''")
  if v and not source.startswith('tfds:'):
    raise ConfigError('data.label_key', v,
                      "'' (only tfds: sources have several label features)")
  return v


def _normalization(c) -> tuple[str, tuple[float, ...], tuple[float, ...]]:
  mode = _choice(c, 'data.normalize', NORMALIZATIONS)
  stats = []
  for field in ('data.mean', 'data.std'):
    v = _get(c, field)
    if not isinstance(v, (tuple, list)) or not all(
        isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in v):
      raise ConfigError(field, v, 'a tuple of per-channel numbers, or () to use the data')
    stats.append(tuple(float(a) for a in v))
  mean, std = stats
  if (mean or std) and mode != 'standardize':
    raise ConfigError('data.mean' if mean else 'data.std', mean or std,
                      "() unless data.normalize='standardize'")
  if len(mean) != len(std):
    raise ConfigError('data.std', std, f'{len(mean)} numbers, one per data.mean channel')
  if any(a <= 0 for a in std):
    raise ConfigError('data.std', std, 'numbers > 0')
  return mode, mean, std


def _model_options(c) -> ModelOptions:
  from fedjax_kd.models import registry  # pylint: disable=g-import-not-at-top
  init = _choice(c, 'model.init', registry.INIT_CHOICES)
  out = {}
  for name in ('bn_momentum', 'bn_epsilon'):
    v = _float(c, f'model.{name}')
    if v != -1.0 and not 0.0 < v < 1.0:
      raise ConfigError(f'model.{name}', v, "a number in (0, 1), or -1 for each model's own")
    out[name] = None if v == -1.0 else v
  return ModelOptions(init=init, **out)


def _canonical(registry, spec, field: str) -> str:
  """``'cnn'`` -> ``'cnn@1'``, ``'cnn@0.50'`` -> ``'cnn@0.5'``; validates the name."""
  if not isinstance(spec, str):
    raise ConfigError(field, spec, 'a "name@width" string')
  with fields.as_fields({}):
    name, width = registry.parse_spec(spec, field=field)
  return f'{name}@{width:g}'


def _optim(c, group: str, with_epochs: bool = True) -> OptimSpec:
  extra = {}
  if group == 'train':
    extra = dict(lr_decay=_float(c, 'train.lr_decay', 0.0, lo_open=True, hi=1.0),
                 fresh_optimizer=_bool(c, 'train.fresh_optimizer'),
                 compute_dtype=_choice(c, 'train.compute_dtype', COMPUTE_DTYPES))
  return OptimSpec(
      optimizer=_choice(c, f'{group}.optimizer', OPTIMIZERS),
      learning_rate=_float(c, f'{group}.learning_rate', 0.0, lo_open=True),
      momentum=_float(c, f'{group}.momentum', 0.0, hi=1.0),
      weight_decay=_float(c, f'{group}.weight_decay', 0.0),
      batch_size=_int(c, f'{group}.batch_size', 1),
      epochs=_int(c, f'{group}.epochs', 0) if with_epochs else 0, **extra)


def cohort_size(participation: float, num_clients: int) -> int:
  """M = round(participation * K), at least 1 (FedEntOpt's cohort size)."""
  return max(1, min(num_clients, int(round(participation * num_clients))))


def _selection(c, num_clients: int, participation: float) -> SelectionSpec:
  """Validates ``selection.*`` against K and M before anything is built."""
  k = num_clients
  m = cohort_size(participation, k)
  method = _choice(c, 'selection.method', SELECTORS)
  buffer = _float(c, 'selection.buffer', 0.0)
  if buffer >= 1.0:
    raise ConfigError('selection.buffer', buffer,
                      f'a fraction in [0, 1) of the {k} clients (Q = floor(buffer * K) must '
                      'be smaller than the number of clients)')
  q = int(math.floor(buffer * k + 1e-9))
  if method == 'fedentopt' and q > k - m:
    raise ConfigError('selection.buffer', buffer,
                      f'a fraction with Q = floor(buffer * K) <= K - M = {k} - {m} = {k - m} '
                      f'(got Q = {q}); otherwise fewer than M clients can be available in a '
                      f'round; i.e. buffer <= {(k - m) / k:g}')
  epsilon = _float(c, 'selection.epsilon', 0.0, lo_open=True)
  candidates = _int(c, 'selection.candidates', 0, k)
  if method == 'power_of_choice' and 0 < candidates < m:
    raise ConfigError('selection.candidates', candidates,
                      f'0 (= min(K, 2M)) or an integer in [M, K] = [{m}, {k}]')
  dropout = _float(c, 'selection.dropout', 0.0)
  if dropout >= 1.0:
    raise ConfigError('selection.dropout', dropout, 'a fraction in [0, 1)')
  return SelectionSpec(
      method=method, m=m, q=q, dp=_bool(c, 'selection.dp'), epsilon=epsilon,
      tie_tol=_float(c, 'selection.tie_tol', 0.0),
      tie_break=_choice(c, 'selection.tie_break', ('lowest', 'random')),
      candidates=candidates or min(k, 2 * m), dropout=dropout,
      dropout_mode=_choice(c, 'selection.dropout_mode', ('exact', 'bernoulli')),
      stragglers=_float(c, 'selection.stragglers', 0.0, hi=1.0),
      straggler_min_epochs=_int(c, 'selection.straggler_min_epochs', 1))


def validate(config: ml_collections.ConfigDict) -> ExperimentSpec:
  """Checks every field and returns the frozen spec; raises ConfigError."""
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_kd.data import augment as augment_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.data import partition as partition_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.models import registry  # pylint: disable=g-import-not-at-top

  check_fields(config)
  algorithm = _choice(config, 'algorithm', tuple(algorithms.ALGORITHMS))
  seed = _int(config, 'seed', 0)
  rounds = _int(config, 'rounds', 1)

  source = _get(config, 'data.source')
  if not isinstance(source, str) or not source:
    raise ConfigError('data.source', source,
                      "'digits', 'synthetic[:N]', 'npz:<path>' or 'tfds:<name>'")
  num_private = _int(config, 'data.num_private', -1)
  data = DataSpec(
      source=source,
      public_source=str(_get(config, 'data.public_source') or ''),
      data_dir=str(_get(config, 'data.data_dir') or ''),
      num_public=_int(config, 'data.num_public', 0),
      num_private=None if num_private < 0 else num_private,
      partition=_choice(config, 'data.partition', partition_lib.SCHEMES),
      alpha=_float(config, 'data.alpha', 0.0, lo_open=True),
      shards_per_client=_int(config, 'data.shards_per_client', 1),
      classes_per_client=_int(config, 'data.classes_per_client', 1),
      dominant_fraction=_dominant_fraction(config),
      min_size=_int(config, 'data.min_size', 0),
      per_client_test=_bool(config, 'data.per_client_test'),
      val_fraction=_val_fraction(config),
      augment=_choice(config, 'data.augment', augment_lib.AUGMENTATIONS),
      augment_predict=_bool(config, 'data.augment_predict'),
      label_key=_label_key(config, source))
  normalize, mean, std = _normalization(config)
  data = dataclasses.replace(data, normalize=normalize, mean=mean, std=std)

  num_clients = _int(config, 'clients.num_clients', 1)
  models = _get(config, 'clients.models')
  if isinstance(models, str):
    models = [models]
  models = list(models)
  if not models:
    raise ConfigError('clients.models', models, 'a non-empty list of "name@width" specs')
  models = [_canonical(registry, m, 'clients.models') for m in models]
  assignment = _get(config, 'clients.assignment')
  allowed = ("'round_robin', 'blocks' or a comma-separated list of "
             f'{num_clients} model indices in [0, {len(models) - 1}]')
  if assignment == 'round_robin':
    client_models = [models[k % len(models)] for k in range(num_clients)]
  elif assignment == 'blocks':
    client_models = [models[k * len(models) // num_clients] for k in range(num_clients)]
  else:
    try:
      picks = [int(a) for a in str(assignment).replace(' ', '').strip('[]()').split(',')]
    except ValueError:
      raise ConfigError('clients.assignment', assignment, allowed) from None
    if len(picks) != num_clients or not all(0 <= a < len(models) for a in picks):
      raise ConfigError('clients.assignment', assignment, allowed)
    client_models = [models[a] for a in picks]
  participation = _float(config, 'clients.participation', 0.0, lo_open=True, hi=1.0)
  server_model = _get(config, 'server.model') or models[0]
  server_model = _canonical(registry, server_model, 'server.model')

  train = _optim(config, 'train')
  selection = _selection(config, num_clients, participation)
  if selection.method == 'fedentopt' and rounds * selection.m * 8 > MAX_SCHEDULE_BYTES:
    raise ConfigError('rounds', rounds, f'at most {MAX_SCHEDULE_BYTES // (8 * selection.m):,} '
                      f'with selection.method=\'fedentopt\' and {selection.m} clients a round: '
                      'its schedule is computed up front and would take '
                      f'{rounds * selection.m * 8 / 2**30:.1f} GiB (the limit is '
                      f'{MAX_SCHEDULE_BYTES // 2**20} MiB)')
  if selection.straggler_min_epochs > max(train.epochs, 1):
    raise ConfigError('selection.straggler_min_epochs', selection.straggler_min_epochs,
                      f'an integer in [1, train.epochs = {train.epochs}]')
  if _get(config, 'distill.optimizer') == 'same':
    distill = None
  else:
    distill = _optim(config, 'distill', with_epochs=False)
  distill_batch = _int(config, 'distill.batch_size', 1)
  distill_epochs = _int(config, 'distill.epochs', 0)
  public_per_round = _int(config, 'distill.public_per_round', 1)

  comm_rules = _get(config, 'comm.rules')
  from fedjax_kd.ops import comm  # pylint: disable=g-import-not-at-top
  try:
    comm.get_rules(comm_rules)  # validates
  except ParamError as e:
    raise fields.field_error(e, {'name': 'comm.rules'}) from None
  thresholds = _get(config, 'comm.thresholds')
  if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 1
             for x in thresholds):
    raise ConfigError('comm.thresholds', thresholds,
                      'a tuple of accuracies in (0, 1], e.g. (0.5, 0.6)')
  thresholds = tuple(float(x) for x in thresholds)

  spec = ExperimentSpec(
      algorithm=algorithm, seed=seed, rounds=rounds, data=data,
      clients=ClientsSpec(
          num_clients=num_clients, models=tuple(client_models), participation=participation,
          shared_init=_bool(config, 'clients.shared_init'),
          store=_choice(config, 'clients.store', ('device', 'host', 'disk')),
          store_dir=str(_get(config, 'clients.store_dir') or ''),
          store_chunk=_int(config, 'clients.store_chunk', 1)),
      server=ServerSpec(model=server_model), train=train,
      distill=DistillSpec(optimizer=distill, batch_size=distill_batch, epochs=distill_epochs,
                          public_per_round=public_per_round),
      comm=CommSpec(rules=comm_rules, thresholds=thresholds),
      eval=EvalSpec(every=_int(config, 'eval.every', 1), clients=_bool(config, 'eval.clients'),
                    chunk=_int(config, 'eval.chunk', 1)),
      checkpoint=CheckpointSpec(every=_int(config, 'checkpoint.every', 0),
                                keep=_int(config, 'checkpoint.keep', 1)),
      log=LogSpec(tensorboard=_bool(config, 'log.tensorboard')), selection=selection,
      model=_model_options(config), raw=config)
  cls = algorithms.ALGORITHMS[algorithm]
  if cls.uses_public and cls.samples_public and public_per_round > data.num_public:
    raise ConfigError('distill.public_per_round', public_per_round,
                      f'an integer <= data.num_public ({data.num_public}): '
                      'the per-round sample is drawn from the public set')
  if cls.uses_public and cls.samples_public and distill_batch > public_per_round:
    raise ConfigError('distill.batch_size', distill_batch,
                      f'an integer <= distill.public_per_round ({public_per_round}): a '
                      'larger batch is padding in every distillation step')
  options = algorithms.ALGORITHMS[algorithm].options_from_config(config, spec)
  return dataclasses.replace(spec, options=options)


OPTION_TABLES_BEGIN = '<!-- algorithm options: python -m fedjax_kd.config --option_tables=FILE -->'
OPTION_TABLES_END = '<!-- end of the algorithm options -->'


def option_tables() -> str:
  """The markdown tables of every registered algorithm's options, generated from their
  declarations (``options_class``), one table per algorithm."""
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_kd import options  # pylint: disable=g-import-not-at-top
  out = []
  for cls in dict.fromkeys(algorithms.ALGORITHMS.values()):
    if cls.options_class is None:
      continue
    names = ', '.join(f'`{n}`' for n, c in algorithms.ALGORITHMS.items() if c is cls)
    out += [f'**{names}** (`{cls.options_class.__name__}`)', '', *options.TABLE_HEADER,
            *options.table(cls.options_class), '']
  return '\n'.join(out).rstrip('\n') + '\n'


def write_option_tables(path: str) -> None:
  """Replaces the block between :data:`OPTION_TABLES_BEGIN` and :data:`OPTION_TABLES_END` of
  ``path`` with :func:`option_tables`."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  head, sep, rest = text.partition(OPTION_TABLES_BEGIN + '\n')
  _, sep2, tail = rest.partition(OPTION_TABLES_END)
  if not (sep and sep2):
    raise ValueError(f'{path}: no {OPTION_TABLES_BEGIN} ... {OPTION_TABLES_END} block')
  with open(path, 'w', encoding='utf-8') as f:
    f.write(head + sep + option_tables() + sep2 + tail)


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top
  _args = [a for a in sys.argv[1:] if a.startswith('--option_tables=')]
  if len(_args) != 1 or len(sys.argv) != 2:
    sys.exit('usage: python -m fedjax_kd.config --option_tables=docs/configs.md')
  write_option_tables(_args[0].partition('=')[2])
  print(f'wrote the algorithm option tables into {_args[0].partition("=")[2]}')
