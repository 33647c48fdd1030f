"""Two-hidden-layer perceptron ("2NN") of McMahan et al., "Communication-Efficient Learning of
Deep Networks from Decentralized Data" (AISTATS 2017): Flatten -> Dense(200) -> ReLU ->
Dense(200) -> ReLU -> Dense(C). 199,210 parameters for 28x28 inputs and 10 classes.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_kd.models import layers


class MLP(nn.Module):
  """The 2NN. Has no BatchNorm: `mask` is accepted and ignored.

  Attributes:
    num_classes: number of output logits.
    width: multiplier of the hidden sizes (200 * width, rounded, at least 1).
    hidden: hidden size at width 1.
  """
  num_classes: int
  width: float = 1.0
  hidden: int = 200

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, ...] inputs, flattened per example.
      train: unused (no dropout or BatchNorm).
      mask: unused.
      embed: return the [B, 200 * width] input of the final Dense layer (after its activation)
        instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    del train, mask
    h = layers.scaled(self.hidden, self.width)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(h)(x))
    x = nn.relu(nn.Dense(h)(x))
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)
