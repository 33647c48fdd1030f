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

from fedjax_kd import fields
from fedjax_kd.algorithms import protocol
from fedjax_kd.ops import aggregate


@dataclasses.dataclass(frozen=True)
class SCARLETOptions:
  beta: float
  cache: protocol.CacheOptions


class SCARLET(protocol.Protocol):
  name = 'scarlet'
  config_groups = {'scarlet': {
      'beta': 2.0,                            # Enhanced ERA exponent (> 0; 1 = plain mean)
  }}
  paper_rules = 'scarlet'

  @classmethod
  def options_from_config(cls, config, spec) -> SCARLETOptions:
    return SCARLETOptions(beta=fields.number(config, 'scarlet.beta', 0.0, lo_open=True),
                          cache=protocol.cache_options(config, spec, default_on=True))

  def aggregate(self, probs, mask):
    mean, count = aggregate.uploader_mean(probs, mask)
    return aggregate.power_sharpen(mean, self.options.beta), count > 0, {}
