"""The rules every registry of named classes shares (algorithms, selection methods).

A registry is a ``{name: class}`` dict whose built-in entries are fixed when its package
loads. :func:`add` puts a user's class in under its ``name`` where the rules allow;
:func:`remove` takes one out.
"""

from __future__ import annotations

from typing import Any, Callable


def add(table: dict[str, type], cls: Any, *, base: type, base_name: str, built_in: frozenset[str], where: str,
        kind: str, replace: bool = False, identifier: bool = True,
        also: Callable[[type], None] | None = None) -> type:
  """Puts ``cls`` into ``table`` under ``cls.name``; the registries' ``register``.

  Args:
    table: the registry.
    cls: the class, a subclass of ``base``.
    base: what every entry subclasses; ``base_name``: how errors name it
      (``'selection.Method'``).
    built_in: the names the package registers itself, which no class may take.
    where: the function errors name (``'algorithms.register'``).
    kind: what the registry holds, for errors (``'algorithm'``, ``'selection method'``).
    replace: take a name another class holds.
    identifier: the name must be a Python identifier (else any non-empty string).
    also: the registry's own check of ``cls`` (raising ValueError), made before it goes in.

  Returns:
    ``cls``, so that ``register`` can be a class decorator.

  Raises:
    ValueError: not a subclass of ``base``, a name of the wrong form, a built-in name, or a
      name taken by another class (without ``replace``; the same class defined again, as
      when a config file is executed twice, replaces itself).
  """
  if not (isinstance(cls, type) and issubclass(cls, base)):
    raise ValueError(f'{where}: {cls!r} is not a subclass of {base_name}')
  name = getattr(cls, 'name', None)
  if identifier and not (isinstance(name, str) and name.isidentifier()):
    raise ValueError(f'{where}: {cls.__name__}.name must be an identifier, got {name!r}')
  if not identifier and not (isinstance(name, str) and name):
    raise ValueError(f'{where}: {cls.__name__}.name must be a non-empty string')
  _check(table, cls, built_in=built_in, where=where, kind=kind, replace=replace)
  if also is not None:
    also(cls)
  table[name] = cls
  return cls


def _check(table: dict[str, type], cls: Any, *, built_in: frozenset[str], where: str,
          kind: str, replace: bool = False) -> None:
  """Refuses ``cls.name`` where every registry does.

  Args:
    table: the registry.
    cls: the class; its ``name`` is the key.
    built_in: the names the package registers itself, which no class may take.
    where: the function errors name (``'algorithms.register'``).
    kind: what the registry holds, for errors (``'algorithm'``, ``'selection method'``).
    replace: take a name another class holds.

  Raises:
    ValueError: a built-in name, or a name taken by another class (without ``replace``; the
      same class defined again, as when a config file is executed twice, replaces itself).
  """
  name = cls.name
  if name in built_in:
    raise ValueError(f'{where}: {name!r} is a built-in {kind}')
  old = table.get(name)
  if old is not None and old.__qualname__ != cls.__qualname__ and not replace:
    raise ValueError(f'{where}: {name!r} is already registered to '
                     f'{old.__qualname__} (pass replace=True)')


def remove(table: dict[str, type], name: str, *, built_in: frozenset[str]) -> None:
  """Takes ``name`` out of ``table``; built-in names stay."""
  if name not in built_in:
    table.pop(name, None)
