"""SCARLET: synchronised soft-label caching and Enhanced ERA.

K. Azuma, T. Nishio, Y. Kitagawa, W. Nakano, T. Tanimura, "Soft-Label Caching
and Sharpening for Communication-Efficient Federated Distillation",
arXiv 2504.19602 / IEEE TMC 2026 (Algorithms 1 and 2, Eq. 4).

DS-FL's round (as run by the authors' code) with two
changes:
  * a server cache of aggregated labels with duration ``D``
    (``cache.duration``); clients predict and upload only the requested
    (uncached or expired) samples, the server sends down only fresh labels
    plus one signal per sample, and clients rebuild the rest from their local
    caches (:mod:`fedjax_kd.ops.cache`);
  * Enhanced ERA on the fresh aggregates only: ``mean^beta`` renormalised
    (``scarlet.beta``; cached labels are reused as stored).
Under partial participation each client's cache is brought up to date when it
next participates, and that catch-up traffic is counted.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fedjax_kd import options
from fedjax_kd.algorithms import protocol
from fedjax_kd.ops import aggregate


@dataclasses.dataclass(frozen=True)
class SCARLETOptions:
  """``scarlet.*``."""
  group: ClassVar[str] = 'scarlet'
  beta: float = options.option(2.0, 'Enhanced ERA exponent (1: the plain mean)', gt=0)
  cache: protocol.CacheOptions = options.nested(protocol.CacheOptions)


class SCARLET(protocol.Protocol):
  name = 'scarlet'
  options_class = SCARLETOptions
  cache_by_default = True
  paper_rules = 'scarlet'

  def aggregate(self, probs, mask):
    mean, count = aggregate.uploader_mean(probs, mask)
    return aggregate.power_sharpen(mean, self.options.beta), count > 0, {}
