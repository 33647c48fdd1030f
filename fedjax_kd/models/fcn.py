"""Fully connected network for audio and sensor features of Pan et al., "FedCache 2.0: Federated
Edge Learning with Knowledge Caching and Dataset Distillation" (arXiv 2405.13378, Table XIV):
Flatten -> Dense(512) -> ReLU -> Dense(256) -> ReLU -> Dropout(0.5) -> Dense(C). No BatchNorm.

Trainable parameters (all parameters are trainable):

* FCN-U (UrbanSound8K, 40 features, 10 classes): 154,890 (the paper's 151.3K, K = 1024).
* FCN-T (TMD, 65 features, 5 classes): 166,405 (the paper's 162.5K). The paper does not spell
  out FCN-T's shape; this is the same FCN on the TMD feature vector, which matches the reported
  count. The authors' own TMD network (TMDNet) is smaller, so treat this as a reconstruction.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_kd.models import layers


class FCN(nn.Module):
  """The FCN. Has no BatchNorm: `mask` is accepted and ignored.

  Dropout is active only with `train=True` and then draws from the 'dropout' rng stream
  (`module.apply(..., train=True, rngs={'dropout': key})`).

  Attributes:
    num_classes: number of output logits.
    width: multiplier of the hidden sizes (512 and 256, rounded, at least 1).
    dropout_rate: dropout probability after the second hidden layer.
  """
  num_classes: int
  width: float = 1.0
  dropout_rate: float = 0.5

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, ...] inputs (e.g. [B, 40] audio features), flattened per example.
      train: applies dropout (needs the 'dropout' rng) if True.
      mask: unused.
      embed: return the [B, 256 * width] input of the final Dense layer (after ReLU and
        dropout) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    del mask
    s = lambda n: layers.scaled(n, self.width)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(s(512))(x))
    x = nn.relu(nn.Dense(s(256))(x))
    x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)
