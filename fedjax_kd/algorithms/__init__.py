"""Algorithms, one module per paper; ``ALGORITHMS`` maps config names to classes."""

from fedjax_kd import options as options_lib
from fedjax_kd import registration
from fedjax_kd.algorithms.acepfl import ACEPFL, FedMD
from fedjax_kd.algorithms.base import AlgState, Algorithm, Context, Round, RoundOutput
from fedjax_kd.algorithms.centralized import Centralized
from fedjax_kd.algorithms.cfd import CFD
from fedjax_kd.algorithms.comet import COMET
from fedjax_kd.algorithms.dsfl import DSFL
from fedjax_kd.algorithms.fd import FD
from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.algorithms.fedcache import FedCache
from fedjax_kd.algorithms.fedala import FedALA
from fedjax_kd.algorithms.fedcache2 import FedCache2
from fedjax_kd.algorithms.fedkd import FedKD
from fedjax_kd.algorithms.feddf import FedDF
from fedjax_kd.algorithms.fedconcat import FedConcat
from fedjax_kd.algorithms.fedlc import FedLC
from fedjax_kd.algorithms.fednova import FedNova
from fedjax_kd.algorithms.fedprox import FedProx
from fedjax_kd.algorithms.fedrs import FedRS
from fedjax_kd.algorithms.knn_per import KNNPer
from fedjax_kd.algorithms.per_fedavg import PerFedAvg
from fedjax_kd.algorithms.pfedme import PFedMe
from fedjax_kd.algorithms.mtfl import MTFL
from fedjax_kd.algorithms.scaffold import SCAFFOLD
from fedjax_kd.algorithms.scarlet import SCARLET
from fedjax_kd.algorithms.scdpfl import SCDPFL
from fedjax_kd.algorithms.kt_pfl import KTPFL
from fedjax_kd.algorithms.selective_fd import SelectiveFD
from fedjax_kd.algorithms.single import Single

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (DSFL, FedAvg, FD, Single, SCARLET, CFD, COMET, SelectiveFD,
                              Centralized, FedCache2, ACEPFL, FedMD, FedProx, SCAFFOLD,
                              FedNova, FedCache, FedRS, FedLC, MTFL, SCDPFL, FedALA, KTPFL,
                              FedConcat, KNNPer, FedDF, PFedMe, PerFedAvg, FedKD)
}
ALGORITHMS['individual'] = Single   # SCARLET's name for the same baseline
_BUILT_IN = frozenset(ALGORITHMS)


def config_groups() -> dict[str, dict]:
  """Every registered algorithm's config groups, ``{group: {field: default}}``, in
  registration order (from each one's ``options_class``, :mod:`fedjax_kd.options`).

  ``config.default_config`` adds them to the engine's groups, so their fields can be set
  from a config file or the command line, and a misspelt one is refused by name.
  """
  out: dict[str, dict] = {}
  for cls in dict.fromkeys(ALGORITHMS.values()):
    for group, defaults in options_lib.groups(cls.options_class).items():
      out.setdefault(group, defaults)
  return out


def _check_groups(cls: type[Algorithm]) -> None:
  """Refuses an ``options_class`` that is not an options dataclass, or whose group another
  algorithm declares with other fields."""
  own = cls.options_class
  if own is not None and not options_lib.is_options(own):
    raise ValueError(f'algorithms.register: {cls.__name__}.options_class must be a frozen '
                     'dataclass whose fields are fedjax_kd.options.option(...) (or None)')
  taken = {g: (c, d) for c in ALGORITHMS.values() if c.__qualname__ != cls.__qualname__
           for g, d in options_lib.groups(c.options_class).items()}
  for group, defaults in options_lib.groups(own).items():
    if not group.isidentifier():
      raise ValueError(f'algorithms.register: {cls.__name__}: the group {group!r} is not a '
                       'name')
    other = taken.get(group)
    if other is not None and other[1] != defaults:
      raise ValueError(f'algorithms.register: {cls.__name__} declares the config group '
                       f'{group!r}, which {other[0].__qualname__} declares with other fields; '
                       'name your group after your algorithm')


def register(cls: type[Algorithm], *, replace: bool = False) -> type[Algorithm]:
  """Adds an algorithm of your own under ``cls.name`` (usable as a class decorator).

  ``config.algorithm = cls.name`` then runs it like a built-in one: the command
  line, the sweep (register in the config file), checkpoints and byte
  accounting. Its ``options_class``'s group becomes part of ``config.default_config()``
  (register before calling it), so ``--config.<group>.<field>`` sets its options.
  ``docs/custom_algorithm.md`` walks through one.

  Raises:
    ValueError: not an ``Algorithm`` subclass, an empty ``name``, a built-in
      name, or a name taken by another class (without ``replace``; the same class
      defined again, as when a config file is executed twice, replaces itself);
      an ``options_class`` that is not an options dataclass, or whose group another
      algorithm declares otherwise.
  """
  return registration.add(ALGORITHMS, cls, base=Algorithm, base_name='Algorithm',
                          built_in=_BUILT_IN, where='algorithms.register', kind='algorithm',
                          replace=replace, identifier=False, also=_check_groups)


def unregister(name: str) -> None:
  """Removes an algorithm added with :func:`register` (built-in ones stay)."""
  registration.remove(ALGORITHMS, name, built_in=_BUILT_IN)
