"""Experiment configuration: loading config files, defaults, validation, option tables.

A config is an ``ml_collections.ConfigDict`` (config files in ``configs/`` call
:func:`default_config` and override fields). Every option is declared once, in
``fedjax_kd/config/spec.py`` (the engine's groups) or an algorithm's ``options_class``; the
defaults, the field-name and type checks, the misspelt-field hints and ``docs/configs.md``'s
tables are generated here from those declarations. :func:`validate` checks every field
*before any data is loaded or compiled* and returns the frozen
:class:`~fedjax_kd.config.spec.ExperimentSpec`; a bad value raises
:class:`~fedjax_kd.errors.ConfigError` naming the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import ml_collections
import numpy as np

from fedjax_kd import fields
from fedjax_kd import options
from fedjax_kd.config.spec import ExperimentSpec
from fedjax_kd.errors import ConfigError


def default_config() -> ml_collections.ConfigDict:
  """Every field with its default; config files override what they need.

  The engine's groups are the fields of :class:`~fedjax_kd.config.spec.ExperimentSpec` (declared,
  with their docs and checks, in ``fedjax_kd/config/spec.py``); each algorithm's own group (dsfl,
  scarlet, cache, ..., and those of algorithms you register) is its ``options_class``.
  """
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  engine = options.groups(ExperimentSpec)
  c = ml_collections.ConfigDict(dict(engine.pop('')))
  for group, defaults in engine.items():
    c[group] = ml_collections.ConfigDict(dict(defaults))
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
    folder = pathlib.Path(__file__).resolve().parents[2] / 'configs'
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
  of a shipped config (``default``, ``dsfl_mnist``, ...) as its installed file. A folder
  named like a shipped config (a workdir ``./default``) is not a config file: the name wins."""
  import os  # pylint: disable=g-import-not-at-top
  if not isinstance(path, str) or not path:
    return path
  if os.path.isfile(_file_and_arg(path)[0]):
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


def validate(config: ml_collections.ConfigDict) -> ExperimentSpec:
  """Checks every field and returns the frozen spec; raises ConfigError naming the field.

  The field names and types first (:func:`check_fields`), then the algorithm's and the
  selection method's names, then every group's declared checks and rules
  (:func:`fedjax_kd.options.read` of :class:`~fedjax_kd.config.spec.ExperimentSpec`), then the
  selection method's rules and the algorithm's own options.
  """
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_kd import selection  # pylint: disable=g-import-not-at-top
  check_fields(config)
  cls = algorithms.ALGORITHMS[fields.choice(config, 'algorithm', tuple(algorithms.ALGORITHMS))]
  method = selection.METHODS[fields.choice(config, 'selection.method',
                                           tuple(selection.METHODS))]
  spec = dataclasses.replace(options.read(ExperimentSpec, config, algorithm=cls), raw=config)
  method.validate(spec)
  return dataclasses.replace(spec, options=cls.options_from_config(config, spec))


OPTION_TABLES_BEGIN = '<!-- options: python -m fedjax_kd.config --option_tables=FILE -->'
OPTION_TABLES_END = '<!-- end of the options -->'


def option_tables() -> str:
  """The markdown tables of every option, generated from their declarations: the engine's
  (the top level and one table per group of :class:`~fedjax_kd.config.spec.ExperimentSpec`), then
  every registered algorithm's (``options_class``)."""
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_kd import selection  # pylint: disable=g-import-not-at-top
  registered = {'algorithm': tuple(algorithms.ALGORITHMS),
                'selection.method': tuple(selection.METHODS)}
  out = ['**The top level**', '', *options.TABLE_HEADER,
         *options.table(ExperimentSpec, with_nested=False, registered=registered), '']
  for f in dataclasses.fields(ExperimentSpec):
    if f.metadata.get('nested'):
      group = f.default_factory
      what = group.__doc__.splitlines()[0].split(': ', 1)[-1]
      out += [f'**`{group.group}`** (`{group.__name__}`): {what}', '',
              *options.TABLE_HEADER, *options.table(group, registered=registered), '']
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
