"""Selective-FD: selective knowledge sharing with client- and server-side selectors.

J. Shao, F. Wu, J. Zhang, "Selective knowledge sharing for privacy-preserving
federated distillation without a good teacher", Nature Communications 15, 349
(2024); as the baseline of SCARLET (Azuma et al., 2025).

Round (shared engine, :mod:`fedjax_kd.algorithms.protocol`):
  * client-side selector: each client fits a KuLSIF density-ratio estimator
    (private data vs uniform noise) once and uploads soft labels only for the
    public samples it does not flag as outliers
    (:func:`fedjax_kd.ops.density.inlier_masks`, threshold quantile
    ``selective_fd.tau_client``);
  * the server averages each sample over its uploaders and keeps it iff
    ``|| onehot(argmax) - mean ||_1 < selective_fd.tau_server`` (2.0, the
    paper's value, keeps everything); no ERA;
  * the server model and the clients distil on the kept samples only.
The selector masks are a pure function of the seed and the data; they live in
the client table (``ProtocolTable.upload_mask``), so a round with a client store
reads only its participants' rows.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms import protocol
from fedjax_kd.ops import aggregate, density


@dataclasses.dataclass(frozen=True)
class SelectiveFDOptions:
  """``selective_fd.*``."""
  group: ClassVar[str] = 'selective_fd'
  tau_client: float = options.option(0.0625, 'KuLSIF quantile threshold of the client-side '
                                     'selector', ge=0, le=1)
  tau_server: float = options.option(2.0, 'L1 threshold of the server-side selector (2.0 '
                                     'keeps all)', gt=0)
  sigma: float = options.option(5.0, 'Gaussian kernel width', gt=0)
  lambda_exponent: float = options.option(0.5, 'lambda = n_private ** exponent', ge=0)
  cache: protocol.CacheOptions = options.nested(protocol.CacheOptions)


class SelectiveFD(protocol.Protocol):
  name = 'selective_fd'
  options_class = SelectiveFDOptions
  paper_rules = 'scarlet'

  def upload_masks(self):
    """``[K, N_pub]`` client-side selectors: which public samples each client calls inliers."""
    d = self.ctx.data
    idx = np.asarray(d.client_idx)
    o = self.options
    # The selectors see model inputs (pixels mapped on the host, as the kernels map them).
    masks = density.inlier_masks(
        d.normalize.host(np.asarray(d.x_private)),
        [idx[k, :d.client_n[k]] for k in range(d.num_clients)],
        d.normalize.host(np.asarray(d.x_public)), self.spec.seed, tau=o.tau_client,
        sigma=o.sigma, lambda_exponent=o.lambda_exponent)
    return jnp.asarray(masks)

  def aggregate(self, probs, mask):
    mean, count = aggregate.uploader_mean(probs, mask)
    keep = (count > 0) & (aggregate.l1_to_onehot(mean) < self.options.tau_server)
    return mean, keep, {}
