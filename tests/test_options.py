"""fedjax_kd.options: an option declared once gives its default, check, doc and table row."""

import dataclasses
from typing import ClassVar

import ml_collections
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import options
from fedjax_kd.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class _Inner:
  group: ClassVar[str] = 'inner'
  mode: str = options.option('auto', 'on, off or auto', choices=('auto', 'on', 'off'))
  on: bool = options.derived(False, 'the mode resolved')

  def validate(self, spec, algorithm):
    del spec
    return dataclasses.replace(self, on=self.mode == 'on' or (self.mode == 'auto' and algorithm))


@dataclasses.dataclass(frozen=True)
class _Outer:
  group: ClassVar[str] = 'outer'
  k: int = options.option(3, 'how many', gt=0)
  w: float = options.option(0.5, 'a weight', ge=0, le=1)
  name: str = options.option('a', 'a name')
  flag: bool = options.option(False, 'a switch')
  inner: _Inner = options.nested(_Inner)


def _config(**groups):
  return ml_collections.ConfigDict({g: dict(v) for g, v in groups.items()})


def test_groups_defaults_and_a_read():
  assert options.groups(_Outer) == {'inner': {'mode': 'auto'},
                                    'outer': {'k': 3, 'w': 0.5, 'name': 'a', 'flag': False}}
  o = options.read(_Outer, _config(outer={'k': 7, 'w': 1, 'name': 'b', 'flag': True},
                                   inner={'mode': 'auto'}), algorithm=True)
  assert (o.k, o.w, o.name, o.flag, o.inner.mode, o.inner.on) == (7, 1.0, 'b', True, 'auto', True)
  # A field the config lacks (a config.json from before it existed) takes its default.
  o = options.read(_Outer, _config(outer={'k': 2}), algorithm=False)
  assert (o.k, o.w, o.inner.on) == (2, 0.5, False)


@pytest.mark.parametrize('group, field, value, allowed', [
    ('outer', 'k', 0, 'an integer >= 1'),
    ('outer', 'k', 2.0, 'an integer'),
    ('outer', 'w', 1.5, 'a number <= 1'),
    ('outer', 'flag', 1, 'True or False'),
    ('outer', 'name', 3, 'a string'),
    ('inner', 'mode', 'maybe', "'auto', 'on', 'off'"),
])
def test_each_check_names_the_field(group, field, value, allowed):
  with pytest.raises(ConfigError, match=rf'^{group}\.{field}=') as e:
    options.read(_Outer, _config(**{group: {field: value}}))
  assert allowed in str(e.value)


def test_the_table_rows_by_hand():
  assert options.table(_Outer) == [
      "| `outer.k` | `3` | an integer > 0 | how many |",
      "| `outer.w` | `0.5` | a number in [0, 1] | a weight |",
      "| `outer.name` | `'a'` | a string | a name |",
      "| `outer.flag` | `False` | True or False | a switch |",
      "| `inner.mode` | `'auto'` | `'auto'`, `'on'`, `'off'` | on, off or auto |"]
  with pytest.raises(TypeError, match='mutable'):
    options.option([1], 'a list')


def test_the_committed_option_tables_are_generated_from_the_declarations(tmp_path):
  page = tmp_path / 'configs.md'
  page.write_text(open(config_lib.__file__.replace('fedjax_kd/config/__init__.py', 'docs/configs.md'))
                  .read())
  committed = page.read_text()
  config_lib.write_option_tables(str(page))
  assert page.read_text() == committed, (
      'docs/configs.md: python -m fedjax_kd.config --option_tables=docs/configs.md')


def test_the_engine_groups_are_declared_once_and_the_defaults_come_from_them():
  from fedjax_kd.config import spec as spec_lib  # pylint: disable=g-import-not-at-top
  groups = options.groups(spec_lib.ExperimentSpec)
  assert set(groups.pop('')) == {'algorithm', 'seed', 'rounds'}
  c = config_lib.default_config()
  assert len(groups) == 11
  for f in dataclasses.fields(spec_lib.ExperimentSpec):
    if f.metadata.get('nested'):
      assert options.is_options(f.default_factory), f.name
      assert f.default_factory.group == f.name
      assert c[f.name].to_dict() == groups[f.name]
  # One declaration: a changed default moves default_config and the table row with it.
  assert c.train.learning_rate == 0.1 and c.selection.buffer == 0.5
  assert '| `train.learning_rate` | `0.1` | a number > 0 | learning rate |' in (
      config_lib.option_tables())


def test_a_group_sees_the_groups_before_it_checked():
  """``selection`` (after ``clients`` and ``train``) resolves M, Q and the candidates from
  them; ``server`` takes the first listed client model; ``clients`` hands the models out."""
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top
  s = config_lib.validate(tiny_config(**{
      'clients.num_clients': 8, 'clients.participation': 0.25, 'selection.buffer': 0.3,
      'clients.models': ('mlp@0.50', 'mlp@1.0'), 'clients.assignment': 'blocks',
      'server.model': ''}))
  assert (s.selection.m, s.selection.q, s.selection.candidates) == (2, 2, 4)
  assert s.clients.models == ('mlp@0.5',) * 4 + ('mlp@1',) * 4
  assert s.clients.listed == ('mlp@0.5', 'mlp@1') and s.server.model == 'mlp@0.5'
  with pytest.raises(ConfigError, match='selection.straggler_min_epochs'):
    config_lib.validate(tiny_config(**{'selection.straggler_min_epochs': 2}))
