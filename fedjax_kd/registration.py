"""The rules every registry of named classes shares (algorithms, selection methods).

A registry is a ``{name: class}`` dict whose built-in entries are fixed when its package
loads. :func:`check` says whether a user's class may go in under its ``name`` (the caller
then puts it in); :func:`remove` takes one out.
"""

from __future__ import annotations

from typing import Any


def check(table: dict[str, type], cls: Any, *, built_in: frozenset[str], where: str,
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
