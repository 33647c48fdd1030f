"""fedjax_kd: federated distillation simulator in JAX/Flax.

``import fedjax_kd`` is cheap; submodules load on first use, so
``fedjax_kd.ops.aggregate.era(...)``, ``fedjax_kd.runner.run(...)`` and
``fedjax_kd.plot.plot_runs(...)`` work after the one import.
"""

import importlib as _importlib
from typing import Callable as _Callable, Sequence as _Sequence

__version__ = '0.1.0'


def lazy_submodules(package: str, names: _Sequence[str]) -> tuple[_Callable, _Callable]:
  """Module-level ``__getattr__`` and ``__dir__`` that import ``names`` on first use."""
  def getattr_(name: str):
    if name in names:
      return _importlib.import_module(f'{package}.{name}')
    raise AttributeError(f'module {package!r} has no attribute {name!r}')

  def dir_():
    return sorted(set(vars(_importlib.import_module(package))) | set(names))

  return getattr_, dir_


_SUBMODULES = ('algorithms', 'config', 'core', 'data', 'errors', 'models', 'ops', 'plot',
               'runner', 'running', 'selection')
__getattr__, __dir__ = lazy_submodules(__name__, _SUBMODULES)
