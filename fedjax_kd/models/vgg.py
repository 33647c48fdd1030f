"""VGG-16 of Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
Recognition" (ICLR 2015), configuration D, in the CIFAR variant of kuangliu/pytorch-cifar
(`models/vgg.py`, 'VGG16').

One of the four image architectures of He, Bai, Li, Chen and Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation" (IEEE/ACM Transactions on
Networking 2025), which take them from kuangliu/pytorch-cifar.

cfg [64, 64, M, 128, 128, M, 256, 256, 256, M, 512, 512, 512, M, 512, 512, 512, M]: every
number is Conv3x3 (padding 1, WITH bias) -> BN -> ReLU, every M a 2x2 max pool with stride 2.
Then (kuangliu's AvgPool2d(1, 1) is a no-op) flatten -> Dense(C): a single classifier layer,
not the three fully connected layers of the ImageNet VGG. A 32x32 input leaves a 1x1x512 map.

Other input sizes: the features are globally average-pooled (the identity on the 1x1 map of a
32x32 input, so width 1 on 32x32 is exactly kuangliu's network), and a max pool is skipped
along a spatial axis whose size is already 1 (so the network takes any side >= 1; e.g. 8x8
digits pool 8 -> 4 -> 2 -> 1 and the last two pools are skipped; 28x28 pools 28 -> 14 -> 7 ->
3 -> 1, the odd trailing row/column dropped as in PyTorch, and the last pool is skipped).

BatchNorm: PyTorch defaults (momentum 0.1, i.e. flax momentum 0.9; epsilon 1e-5). Kaiming-normal
(fan-in) initialization, as `resnet.py`.

Trainable parameters for 10 classes at width 1: 14,728,266 (convs 14,714,688 incl. biases, BN
scale/bias 8,448, Dense 5,130) -- PyTorch's `sum(p.numel() for p in VGG('VGG16').parameters())`.
The BN running statistics add 8,448 more (14,736,714 in all).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_kd.models import layers

_kaiming = nn.initializers.he_normal()

VGG16_CFG: tuple[int | str, ...] = (64, 64, 'M', 128, 128, 'M', 256, 256, 256, 'M', 512, 512,
                                    512, 'M', 512, 512, 512, 'M')


def max_pool2_clamped(x: jax.Array) -> jax.Array:
  """2x2/stride-2 max pool that leaves a spatial axis of size 1 alone.

  Both sides >= 2: `layers.max_pool2` (odd trailing rows/columns dropped, like PyTorch's
  MaxPool2d(2, 2)). Both sides 1: the identity. One side 1: a 2-wide, stride-2 max pool along
  the other axis only.
  """
  h, w = x.shape[-3], x.shape[-2]
  if h >= 2 and w >= 2:
    return layers.max_pool2(x)
  if h == 1 and w == 1:
    return x
  lead, c = x.shape[:-3], x.shape[-1]
  if h >= 2:  # w == 1
    x = x[..., :2 * (h // 2), :, :]
    return x.reshape(lead + (h // 2, 2, w, c)).max(axis=-3)
  x = x[..., :2 * (w // 2), :]  # h == 1
  return x.reshape(lead + (h, w // 2, 2, c)).max(axis=-2)


class VGG(nn.Module):
  """VGG with BatchNorm, CIFAR variant (a single Dense classifier).

  Attributes:
    num_classes: number of output logits.
    cfg: conv channel counts and 'M' (max pool); default VGG-16.
    width: multiplier of every conv channel count (rounded, at least 1).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
  """
  num_classes: int
  cfg: tuple[int | str, ...] = VGG16_CFG
  width: float = 1.0
  lowering: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the pooled features with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images of any size >= 1 (32x32 in the paper).
      train: BatchNorm uses batch statistics (over masked-in rows) and updates its running
        averages if True, else it uses the running averages.
      mask: optional [B] vector of valid samples (nonzero = valid).
      embed: return the [B, 512 * width] pooled features (the input of the final Dense
        layer) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    x = layers.as_image(x)
    for item in self.cfg:
      if item == 'M':
        x = max_pool2_clamped(x)
        continue
      x = layers.Conv(layers.scaled(int(item), self.width), 3, padding=1, use_bias=True,
                      kernel_init=_kaiming, lowering=self.lowering)(x)
      x = nn.relu(layers.BatchNorm(momentum=0.9, epsilon=1e-5)(x, train=train, mask=mask))
    x = jnp.mean(x, axis=(1, 2))
    if embed:
      return x
    return nn.Dense(self.num_classes, kernel_init=_kaiming)(x)


def vgg16(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> VGG:
  """VGG-16 (kuangliu CIFAR variant); 14,728,266 trainable params at C = 10, width 1."""
  return VGG(num_classes=num_classes, cfg=VGG16_CFG, width=width, lowering=lowering)
