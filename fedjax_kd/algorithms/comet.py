"""COMET: clustered knowledge transfer, per public sample.

Y. J. Cho, J. Wang, T. Chirvolu, G. Joshi, "Communication-Efficient and
Model-Heterogeneous Personalized Federated Learning via Clustered Knowledge
Transfer" (COMET), IEEE JSTSP 2023; as the baseline of SCARLET (Azuma et al.,
2025) in its authors' code, which clusters *per public sample*.

Round (shared engine, :mod:`fedjax_kd.algorithms.protocol`): clients upload soft
labels as in DS-FL; for every sample the server runs k-means with
``comet.clusters`` clusters over the client vectors
(:func:`fedjax_kd.ops.cluster.kmeans_per_sample`) and sends the centroids down;
each client distils, with weight ``comet.weight`` (lambda), on the centroid
nearest to its own current (inference-mode) prediction. The server model
distils on the plain mean. Under full participation the centroid downlink is
counted once per client divided by ``c`` (each client effectively receives
its own centroid), as the authors' accounting does. With the cache on, the
server caches mean labels and each client caches its selected centroid.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import protocol
from fedjax_kd.core import rng
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import aggregate, cluster


@dataclasses.dataclass(frozen=True)
class COMETOptions:
  """``comet.*``."""
  group: ClassVar[str] = 'comet'
  clusters: int = options.option(2, 'c, k-means clusters per public sample', ge=1)
  weight: float = options.option(1.0, 'lambda, the distillation loss weight', gt=0)
  cache: protocol.CacheOptions = options.nested(protocol.CacheOptions)

  def validate(self, spec, algorithm) -> None:
    del algorithm
    if self.cache.enabled and spec.partial:
      raise ConfigError('cache.mode', 'on',
                        "'off' for COMET under partial participation (clients cache "
                        'their own centroid choice, which a missed round cannot restore)')


class COMET(protocol.Protocol):
  name = 'comet'
  options_class = COMETOptions
  paper_rules = 'scarlet'
  downlink_is_server_labels = False
  per_client_targets = True

  def payload_shape(self):
    return (self.options.clusters, self.num_classes)

  @property
  def down_elements_per_row(self):
    c = self.options.clusters
    full = not self.spec.partial
    return self.num_classes if full else c * self.num_classes

  def aggregate(self, probs, mask):
    mean, count = aggregate.uploader_mean(probs, mask)
    return mean, count > 0, {}

  def downlink(self, state, r, x, labels, probs, mask):
    del x, labels
    key = rng.server_key(self.ctx.root, r.t, 'server')
    centroids, _ = cluster.kmeans_per_sample(jnp.swapaxes(probs, 0, 1), mask.T,
                                             self.options.clusters, key,
                                             ids=jnp.asarray(r.ids))
    return state, jnp.where(jnp.isfinite(centroids), centroids, 0.0)

  def weighted_targets(self):
    return self.options.weight != 1.0

  def client_targets(self, state, r, x, payload):
    own = self.predict_clients(state, r, x)
    targets = cluster.nearest_centroid(own, payload)
    weights = None
    if self.options.weight != 1.0:
      weights = jnp.full((r.num_clients,), self.options.weight, jnp.float32)
    return targets, weights
