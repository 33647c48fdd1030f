"""Every paper's section, in the report's order (:data:`SECTIONS`, assembled from
:mod:`benchmarks.reproduction.papers`), chosen by ``--only`` (:func:`select`), and each sweep's
engine for :mod:`benchmarks.reproduction.standing` (:func:`sweep_engines`).
"""

from __future__ import annotations

from typing import Sequence

from benchmarks.reproduction.defs import Section
from benchmarks.reproduction.papers import acepfl, dsfl, fedcache2, fedentopt, scarlet
from fedjax_kd.errors import ConfigError

SECTIONS = (dsfl.section(), scarlet.section(), fedcache2.section(), acepfl.section(),
            fedentopt.section())

def select(only: str) -> list[Section]:
  if not only:
    return list(SECTIONS)
  keys = [k.strip() for k in only.split(',') if k.strip()]
  known = {s.key for s in SECTIONS}
  bad = [k for k in keys if k not in known]
  if bad:
    raise ConfigError('--only', ','.join(bad), f'section keys among {", ".join(sorted(known))}')
  return [s for s in SECTIONS if s.key in keys]


_ENGINES = {'fedjax_kd': 'fedjax_kd', 'torch': 'torch', 'scarlet_official': 'official'}


def sweep_engines(sections: Sequence[Section] = ()) -> dict[str, tuple[str, str, str]]:
  """``{sweep: (section key, engine, torch module)}`` for :mod:`benchmarks.reproduction.standing`."""
  return {d.name: (s.key, _ENGINES[d.engine], d.torch_module)
          for s in (sections or SECTIONS) for d in s.sweeps}
