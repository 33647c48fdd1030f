"""LeNet-5 of LeCun et al., "Gradient-Based Learning Applied to Document Recognition" (Proc. IEEE
1998), in the CIFAR variant used by FedEntOpt (the NIID-Bench "simple-cnn", which matches
the paper's "around 60,000 parameters"): conv5x5(6) VALID -> ReLU -> maxpool2 -> conv5x5(16)
VALID -> ReLU -> maxpool2 -> FC 120 -> ReLU -> FC 84 -> ReLU -> FC C. No BatchNorm.

62,006 parameters for 32x32x3 inputs and C = 10; 62,856 for C = 20.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_kd.models import layers


class LeNet5(nn.Module):
  """LeNet-5 (CIFAR variant). `mask` is accepted and ignored.

  Attributes:
    num_classes: number of output logits.
    width: multiplier of every hidden channel/unit count (6, 16, 120, 84).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
  """
  num_classes: int
  width: float = 1.0
  lowering: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images, H and W at least 16.
      train: unused.
      mask: unused.
      embed: return the [B, 84 * width] input of the final Dense layer (after its activation)
        instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    del train, mask
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    x = layers.max_pool2(nn.relu(layers.Conv(s(6), 5, padding='VALID',
                                             lowering=self.lowering)(x)))
    x = layers.max_pool2(nn.relu(layers.Conv(s(16), 5, padding='VALID',
                                             lowering=self.lowering)(x)))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(s(120))(x))
    x = nn.relu(nn.Dense(s(84))(x))
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)
