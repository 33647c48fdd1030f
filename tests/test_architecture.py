"""The package's import structure: layers, no circles, ops as leaves.

Read from the source (every ``import``, function-level ones included), so a
circle hidden inside a function counts too.
"""

from __future__ import annotations

import ast
import pathlib
import re

import numpy as np

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'fedjax_kd'

# Lowest first. A module may import its own layer and the layers below it, never above.
LAYERS = (
    ('errors', 'fields', 'options', 'ops', 'metric_names', 'registration'),   # leaves
    ('core', 'data', 'models'),                    # the engine, the data, the models
    ('algorithms', 'selection'),                   # the papers
    ('config', 'running'),                         # a config; what a run is made of
    ('runner', 'plot', 'sweep', 'main'),           # the faces
)


def _module_name(path: pathlib.Path) -> str:
  rel = path.relative_to(PACKAGE.parent).with_suffix('')
  parts = list(rel.parts)
  if parts[-1] == '__init__':
    parts = parts[:-1]
  return '.'.join(parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in PACKAGE.rglob('*.py')}


def imports() -> dict[str, set[str]]:
  """``module -> fedjax_kd modules it imports`` (the package root excluded)."""
  mods = _modules()
  graph: dict[str, set[str]] = {}
  for name, path in mods.items():
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        # ``from x import y`` imports module x.y if there is one, else names in x.
        targets = [f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in mods
                   else node.module for a in node.names]
      else:
        continue
      out.update(t for t in targets if t in mods and t != 'fedjax_kd')
    graph[name] = out
  return graph


def _layer(module: str) -> int:
  top = module.split('.')[1] if '.' in module else ''
  for i, names in enumerate(LAYERS):
    if top in names:
      return i
  raise AssertionError(f'{module} is in no layer: add it to LAYERS in {__file__}')


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_no_import_circle():
  assert cycles(imports()) == []


def test_cycles_finds_a_circle():
  assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
  assert cycles({'a': {'b'}, 'b': set()}) == []


def test_every_import_goes_down_or_sideways():
  upward = [(m, t) for m, ts in imports().items() if m != 'fedjax_kd'
            for t in ts if _layer(t) > _layer(m)]
  assert upward == []


def test_ops_are_leaves_and_know_no_config_field():
  graph = imports()
  ops = [m for m in graph if m.startswith('fedjax_kd.ops')]
  assert len(ops) > 10
  outside = [(m, t) for m in ops for t in graph[m] if not t.startswith('fedjax_kd.ops')]
  assert outside == []
  for m in ops:
    text = _modules()[m].read_text()
    assert 'ConfigError' not in text, m


def test_the_data_layer_imports_no_spec():
  # data/ sits beside spec: it reads options through its own DataRequest protocol, so
  # building the data never reaches back up to the config's classes.
  graph = imports()
  data = [m for m in graph if m.startswith('fedjax_kd.data')]
  assert len(data) > 5
  assert [(m, t) for m in data for t in graph[m] if t == 'fedjax_kd.config.spec'] == []


def test_every_option_the_data_layer_reads_is_a_declared_data_option():
  import dataclasses
  import typing
  from fedjax_kd.data.prepare import DataRequest
  from fedjax_kd.config.spec import DataSpec
  declared = {f.name: f.type for f in dataclasses.fields(DataSpec)}
  wanted = typing.get_type_hints(DataRequest)
  assert len(wanted) > 15
  assert {k: str(v) for k, v in wanted.items()} == {
      k: str(typing.get_type_hints(DataSpec)[k]) for k in wanted}
  assert set(wanted) <= set(declared)
  # ... and every option prepare.py reads is in the protocol.
  tree = ast.parse((PACKAGE / 'data' / 'prepare.py').read_text())
  read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
          and isinstance(n.value, ast.Name) and n.value.id == 'spec'}
  assert read and read <= set(wanted), read - set(wanted)


def test_no_config_error_below_the_config_layer():
  # The engine, ops, data and model libraries name their own parameters (ParamError); the
  # layers that feed them a config's values name the field (fields.as_fields).
  below = [m for m in _modules() if m.split('.')[1:2] and m.split('.')[1] in
           ('ops', 'core', 'data', 'models')]
  assert len(below) > 30
  assert [m for m in below if 'ConfigError' in _modules()[m].read_text()] == []


def test_the_design_notes_name_every_layer_as_the_test_does():
  # docs/design.md's layer table is the layering this file enforces, module for module.
  text = (PACKAGE.parent / 'docs' / 'design.md').read_text()
  rows = re.findall(r'^\| (\d) \| (.*?) \|', text, flags=re.M)
  named = tuple(tuple(n.split('/')[0] for n in re.findall(r'`([a-z_/*]+)`', cell))
                for _, cell in sorted(rows))
  assert [set(n) for n in named] == [set(layer) for layer in LAYERS]


def test_a_data_error_maps_to_the_config_field():
  import pytest  # pylint: disable=g-import-not-at-top
  from fedjax_kd import fields  # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import experiment
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.data import partition, prepare  # pylint: disable=g-import-not-at-top
  from fedjax_kd.errors import ConfigError  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops.errors import ParamError  # pylint: disable=g-import-not-at-top
  labels = np.array([0, 1, 0, 1, 0, 1])
  # The partition library names its own parameter ...
  with pytest.raises(ParamError, match=r'^shards_per_client=0 is not allowed') as e:
    partition.partition('shards', labels, 3, num_classes=2, seed=0, shards_per_client=0)
  assert not isinstance(e.value, ConfigError)
  # ... data.prepare names the DataSpec field (here the partition's dominant_fraction, which
  # the partition library calls fraction) ...
  c = config_lib.default_config()
  c.data.partition, c.data.dominant_fraction = 'dominant', 0.05
  spec = config_lib.validate(c)
  with pytest.raises(ParamError, match=r'^dominant_fraction=0\.05 is not allowed') as e:
    prepare.prepare(spec.data, num_clients=spec.clients.num_clients, seed=spec.seed)
  assert not isinstance(e.value, ConfigError)
  # ... and the build names the config field.
  with pytest.raises(ConfigError, match=r'^data\.dominant_fraction=0\.05 is not allowed'):
    experiment.build(spec)
  # A ConfigError (already a field) passes through as_fields as it is.
  with pytest.raises(ConfigError, match=r'^clients\.models='):
    with fields.as_fields({'spec': 'nope'}):
      raise ConfigError('clients.models', 'x', 'y')


def test_the_graph_sees_function_level_imports():
  graph = imports()
  assert 'fedjax_kd.algorithms' in graph['fedjax_kd.config']       # inside validate()
  assert 'fedjax_kd.fields' in graph['fedjax_kd.algorithms.acepfl']


def test_uniform_selection_stream_is_the_engines():
  from fedjax_kd import selection  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import rng  # pylint: disable=g-import-not-at-top
  want = rng.host_rng(3, 7, 'select').choice(50, size=5, replace=False)
  np.testing.assert_array_equal(selection.uniform_round(50, 5, 3, 7), want)


def test_an_op_error_maps_to_the_config_field():
  import pytest  # pylint: disable=g-import-not-at-top
  from fedjax_kd import fields  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops import temperature  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops.errors import ParamError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ParamError, match=r"^t0=-1\.0 is not allowed: expected a finite") as e:
    temperature.validate_temperature(-1.0, 0.1, 0.1, 10)
  err = fields.field_error(e.value, {'t0': 'acepfl.t0'})
  assert str(err) == 'acepfl.t0=-1.0 is not allowed: expected a finite number > 0.'


def private_uses(source: str, modules: set[str]) -> list[str]:
  """The private names (``_x``, not ``__x__``) that ``source`` takes from other package
  modules: ``from fedjax_kd.m import _x`` and ``alias._x`` where ``alias`` is a module of the
  package that ``source`` imported."""
  private = lambda n: n.startswith('_') and not n.endswith('__')
  tree = ast.parse(source)
  found, aliases = [], set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
        node.module.split('.')[0] == 'fedjax_kd'):
      for a in node.names:
        if private(a.name):
          found.append(f'{node.module}.{a.name}')
        elif f'{node.module}.{a.name}' in modules:
          aliases.add(a.asname or a.name)
    elif isinstance(node, ast.Import):
      aliases.update(a.asname for a in node.names if a.asname and a.name in modules)
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in aliases and private(node.attr)):
      found.append(f'{node.value.id}.{node.attr}')
  return found


def test_no_module_takes_another_modules_private_names():
  mods = _modules()
  names = set(mods)
  taken = {m: private_uses(p.read_text(), names) for m, p in mods.items()}
  assert {m: t for m, t in taken.items() if t} == {}
  # The check finds both forms.
  assert private_uses('from fedjax_kd.core import kernels\nkernels._apply(1)\n'
                      'from fedjax_kd.algorithms.base import _nanmean\n', names) == [
                          'fedjax_kd.algorithms.base._nanmean', 'kernels._apply']


def test_pyproject_installs_every_package():
  """A plain ``pip install .`` ships every package folder (the list is explicit)."""
  import tomllib  # pylint: disable=g-import-not-at-top
  listed = set(tomllib.loads((PACKAGE.parent / 'pyproject.toml').read_text())
               ['tool']['setuptools']['packages'])
  found = {_module_name(p.parent / '__init__.py') for p in PACKAGE.rglob('__init__.py')}
  assert found <= listed, f'add to pyproject.toml packages: {sorted(found - listed)}'
