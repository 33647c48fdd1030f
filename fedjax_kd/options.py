"""Config options declared once: a frozen dataclass whose fields carry default, check and doc.

An algorithm's options are one frozen dataclass; each field is an :func:`option` holding its
default, its one-line doc and its check (``choices``, bounds or a ``check`` function), and
the class names its config group::

  @dataclasses.dataclass(frozen=True)
  class MedianOptions:
    group: ClassVar[str] = 'median_distill'
    quantile: float = options.option(0.5, 'the quantile taken over the clients', ge=0, le=1)
    temperature: float = options.option(1.0, 'softmax temperature', gt=0)

Everything else is derived from that declaration:

* :func:`groups`: the ``{group: {field: default}}`` that ``config.default_config`` adds, so
  ``--config.median_distill.quantile=0.25`` works and a misspelt field is refused by name;
* :func:`read`: the checked, frozen options from a config (a bad value raises
  :class:`~fedjax_kd.errors.ConfigError` naming ``group.field``), then the class's
  ``validate(spec, algorithm)`` for the rules that span fields or groups;
* :func:`table`: the group's rows of ``docs/configs.md``'s option tables.

A field whose type is another options class with a ``group`` of its own is read from that
group (the protocol family's shared ``cache`` group); a :func:`derived` field is not in the
config: ``validate`` computes it (``cache.enabled`` from ``cache.mode`` and the algorithm).
A leaf module below the algorithms.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Callable, Iterator, Sequence

import ml_collections

from fedjax_kd import fields
from fedjax_kd.errors import ConfigError

_MISSING = dataclasses.MISSING


def option(default: Any, doc: str, *, choices: Sequence[Any] | None = None,
           ge: float | None = None, gt: float | None = None, le: float | None = None,
           check: Callable[[Any, str], Any] | None = None, allowed: str | None = None) -> Any:
  """A config option: a dataclass field with its default, one-line doc and check.

  Args:
    default: the value of ``default_config`` (a tuple for a sequence).
    doc: one line, shown in the option tables.
    choices: the allowed values (strings).
    ge, gt, le: bounds of a number (``gt`` excludes its bound).
    check: ``check(value, field) -> value`` for anything else (after the type and bounds);
      raises ConfigError; what it returns is the option's value.
    allowed: what the option accepts, in words, for the tables (default: from the type,
      ``choices`` and bounds).
  """
  if isinstance(default, (list, dict, set)):
    raise TypeError(f'option: a default of {type(default).__name__} is mutable; use a tuple')
  return dataclasses.field(default=default, metadata={
      'doc': doc, 'choices': tuple(choices) if choices is not None else None,
      'lo': gt if gt is not None else ge, 'lo_open': gt is not None, 'hi': le, 'check': check,
      'allowed': allowed})


def derived(default: Any, doc: str) -> Any:
  """A field of the options that the config does not hold: ``validate`` sets it."""
  return dataclasses.field(default=default, metadata={'doc': doc, 'derived': True})


def nested(cls: type) -> Any:
  """A field holding another options class, read from that class's own ``group``."""
  return dataclasses.field(default_factory=cls, metadata={'nested': True})


def _group(cls: type) -> str:
  """The config group of ``cls``; '' for the top level (``seed``, ``rounds``)."""
  group = getattr(cls, 'group', None)
  if not isinstance(group, str):
    raise TypeError(f'{cls.__name__}.group must be a string naming its config group')
  return group


def _path(cls: type, name: str) -> str:
  group = _group(cls)
  return f'{group}.{name}' if group else name


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _own(cls: type) -> Iterator[dataclasses.Field]:
  """The fields of ``cls`` that are options of its own group."""
  for f in dataclasses.fields(cls):
    if not (f.metadata.get('derived') or f.metadata.get('nested')):
      yield f


def _nested(cls: type) -> Iterator[tuple[dataclasses.Field, type]]:
  for f in dataclasses.fields(cls):
    if f.metadata.get('nested'):
      yield f, _hints(cls)[f.name]


def is_options(cls: Any) -> bool:
  """Whether ``cls`` is a frozen dataclass of options (every field declared here)."""
  return (isinstance(cls, type) and dataclasses.is_dataclass(cls)
          and cls.__dataclass_params__.frozen
          and all(f.metadata.get('doc') or f.metadata.get('nested')
                  for f in dataclasses.fields(cls)))


def groups(cls: type | None) -> dict[str, dict[str, Any]]:
  """``{group: {field: default}}`` of ``cls`` and the classes it nests."""
  if cls is None:
    return {}
  out: dict[str, dict[str, Any]] = {}
  for _, sub in _nested(cls):
    out.update(groups(sub))
  own = {f.name: f.default for f in _own(cls)}
  if own:
    out[_group(cls)] = own
  return out


def _value_check(hint: Any, value: Any, field: str, meta: Any) -> Any:
  """One field's value, checked by its declared type and bounds (``fedjax_kd.fields``'
  readers, so the messages are the engine's own)."""
  node: dict[str, Any] = {}
  *path, last = field.split('.')
  leaf = node
  for part in path:
    leaf = leaf.setdefault(part, {})
  leaf[last] = value
  lo, lo_open, hi = meta['lo'], meta['lo_open'], meta['hi']
  if meta['choices'] is not None:
    return fields.choice(node, field, meta['choices'])
  if hint is bool:
    return fields.boolean(node, field)
  if hint is int:
    return fields.integer(node, field, None if lo is None else int(lo) + bool(lo_open), hi)
  if hint is float:
    return fields.number(node, field, None if lo is None else float(lo), lo_open=lo_open,
                         hi=None if hi is None else float(hi))
  if hint is str and not isinstance(value, str):
    raise ConfigError(field, value, 'a string')
  return value


def _range(lo: float | None, lo_open: bool, hi: float | None) -> str:
  if lo is not None and hi is not None:
    return f'in {"(" if lo_open else "["}{lo:g}, {hi:g}]'
  if lo is not None:
    return f'{">" if lo_open else ">="} {lo:g}'
  return f'<= {hi:g}'


def read(cls: type, config: ml_collections.ConfigDict, spec: Any = None,
         algorithm: Any = None, *, check_rules: bool = True) -> Any:
  """The options ``cls`` declares, read from ``config`` and checked.

  A field the config lacks (a run's ``config.json`` from before the field existed) takes
  its default. After the fields, each nested group's ``validate`` runs, in field order, and
  then ``cls.validate(spec, algorithm)`` (if defined): the rules across fields and groups. A
  ``validate`` may return the options with their derived fields set. A nested group is
  validated against ``spec``, or, reading the top of the spec (``spec`` None), against the
  spec being read, holding the groups before it already validated.

  Raises:
    ConfigError: naming ``group.field``, the value and what is allowed.
  """
  hints = _hints(cls)
  values = {}
  for f in _own(cls):
    name = _path(cls, f.name)
    try:
      value = fields.get(config, name)
    except ConfigError:
      value = f.default
    if isinstance(value, list):
      value = tuple(value)
    value = _value_check(hints[f.name], value, name, dict(f.metadata))
    if f.metadata['check'] is not None:
      value = f.metadata['check'](value, name)
    values[f.name] = value
  subs = list(_nested(cls))
  for f, sub in subs:
    values[f.name] = read(sub, config, spec, algorithm, check_rules=False)
  out = cls(**values)
  for f, _ in subs:
    checked = _rules(getattr(out, f.name), out if spec is None else spec, algorithm)
    out = dataclasses.replace(out, **{f.name: checked})
  return _rules(out, spec, algorithm) if check_rules else out


def _rules(value: Any, spec: Any, algorithm: Any) -> Any:
  """``value.validate(spec, algorithm)``, or ``value`` where it returns None or has none."""
  validate = getattr(value, 'validate', None)
  return value if validate is None else (validate(spec, algorithm) or value)


def _cell(v: Any) -> str:
  if isinstance(v, str):
    return f"`'{v}'`"
  if isinstance(v, tuple):
    return '`' + repr(v) + '`'
  return f'`{v!r}`'


def allowed(cls: type, name: str) -> str:
  """What a field of ``cls`` accepts, in words."""
  f = next(f for f in dataclasses.fields(cls) if f.name == name)
  meta, hint = f.metadata, _hints(cls)[name]
  if meta.get('allowed'):
    return meta['allowed']
  if meta.get('choices') is not None:
    return ', '.join(_cell(c) for c in meta['choices'])
  kind = {bool: 'True or False', int: 'an integer', float: 'a number', str: 'a string'}.get(
      hint, 'a tuple' if typing.get_origin(hint) is tuple else str(hint))
  if meta.get('lo') is not None or meta.get('hi') is not None:
    kind += ' ' + _range(meta.get('lo'), meta.get('lo_open'), meta.get('hi'))
  return kind


def table(cls: type, with_nested: bool = True,
          registered: dict[str, Sequence[str]] | None = None) -> list[str]:
  """Markdown rows ``| field | default | allowed | what |`` of ``cls`` and (``with_nested``) the
  classes it nests, each field by its config path.

  Args:
    registered: ``{config path: names}`` for fields whose values a registry holds (the
      layers above know the registries): their allowed column lists those names.
  """
  registered = registered or {}
  rows = []
  for f in _own(cls):
    path = _path(cls, f.name)
    ok = (', '.join(f'`{n!r}`' for n in registered[path]) if path in registered
          else allowed(cls, f.name))
    rows.append(f'| `{path}` | {_cell(f.default)} | {ok} | {f.metadata["doc"]} |')
  for _, sub in (_nested(cls) if with_nested else ()):
    rows += table(sub, registered=registered)
  return rows


TABLE_HEADER = ('| field | default | allowed | what it does |', '|---|---|---|---|')
