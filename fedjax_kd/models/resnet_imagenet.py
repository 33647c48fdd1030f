"""ResNet-34 and ResNet-50 of He et al., "Deep Residual Learning for Image Recognition" (CVPR
2016, Table 1: the ImageNet-depth ResNets), in the CIFAR variant of kuangliu/pytorch-cifar
(`models/resnet.py`, 'ResNet34' and 'ResNet50').

Two of the four image architectures of He, Bai, Li, Chen and Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation" (IEEE/ACM Transactions on
Networking 2025), which take them from kuangliu/pytorch-cifar.

The CIFAR variant replaces the ImageNet stem (7x7/2 convolution and 3x3/2 max pool) by one
Conv3x3(64, stride 1, padding 1, no bias) -> BN -> ReLU, so a 32x32 input leaves a 4x4 map
after the four stages. Stages [3, 4, 6, 3] with 64, 128, 256, 512 planes and strides 1, 2, 2,
2 (on the first block of the stage), global average pool (kuangliu's avg_pool2d(4) on that 4x4
map), Dense(512 * expansion -> C).

* ResNet-34: basic blocks (expansion 1): Conv3x3(stride) -> BN -> ReLU -> Conv3x3 -> BN,
  + shortcut, -> ReLU.
* ResNet-50: bottleneck blocks (expansion 4): Conv1x1(planes) -> BN -> ReLU ->
  Conv3x3(planes, stride) -> BN -> ReLU -> Conv1x1(4 * planes) -> BN, + shortcut, -> ReLU
  (the stride sits on the 3x3 convolution, as in kuangliu and torchvision's "ResNet v1.5").

Shortcuts (He et al. option B): identity, or where the stride or channel count changes a
projection Conv1x1(stride, no bias) -> BN. All convolutions have no bias and pad 3x3 kernels
by one pixel on each side (PyTorch semantics). BatchNorm: PyTorch defaults (momentum 0.1, i.e.
flax momentum 0.9; epsilon 1e-5). Kaiming-normal (fan-in) initialization, as `resnet.py`.

With a width multiplier every plane count is scaled (`layers.scaled`, at least 1) and the
bottleneck output is `4 * scaled(planes)`, so the block structure (which blocks project) is
the same at every width.

Trainable parameters for 10 classes at width 1 (PyTorch's `sum(p.numel() for p in
model.parameters())` for kuangliu's models):

* resnet34: 21,282,122 (BN running statistics add 17,024: 21,299,146 in all).
* resnet50: 23,520,842 (BN running statistics add 53,120: 23,573,962 in all).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_kd.models import layers

_kaiming = nn.initializers.he_normal()

BLOCKS = ('basic', 'bottleneck')


def _bn(x: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
  return layers.BatchNorm(momentum=0.9, epsilon=1e-5)(x, train=train, mask=mask)


class ProjBlock(nn.Module):
  """A basic or bottleneck residual block with a Conv1x1 + BN projection shortcut.

  Attributes:
    planes: the block's inner channel count; it outputs `planes * expansion` channels
      (expansion 1 for 'basic', 4 for 'bottleneck').
    strides: 1, or 2 to halve the spatial size.
    block: 'basic' (two 3x3 convs) or 'bottleneck' (1x1, 3x3, 1x1).
    lowering: convolution lowering, see `layers.Conv`.
  """
  planes: int
  strides: int = 1
  block: str = 'basic'
  lowering: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
    """Applies the block to x [B, H, W, Cin]; returns [B, H', W', planes * expansion]."""
    if self.block not in BLOCKS:
      raise ValueError(f'block must be one of {BLOCKS}, got {self.block!r}')
    conv = lambda f, k, s: layers.Conv(f, k, strides=s, padding=(k - 1) // 2, use_bias=False,
                                       kernel_init=_kaiming, lowering=self.lowering)
    if self.block == 'basic':
      out_feats = self.planes
      y = nn.relu(_bn(conv(self.planes, 3, self.strides)(x), train, mask))
      y = _bn(conv(self.planes, 3, 1)(y), train, mask)
    else:
      out_feats = 4 * self.planes
      y = nn.relu(_bn(conv(self.planes, 1, 1)(x), train, mask))
      y = nn.relu(_bn(conv(self.planes, 3, self.strides)(y), train, mask))
      y = _bn(conv(out_feats, 1, 1)(y), train, mask)
    shortcut = x
    if self.strides != 1 or x.shape[-1] != out_feats:
      shortcut = _bn(conv(out_feats, 1, self.strides)(x), train, mask)
    return nn.relu(y + shortcut)


class ResNet(nn.Module):
  """kuangliu's CIFAR ResNet (ResNet-18/34/50/101/152 family).

  Attributes:
    num_classes: number of output logits.
    stages: blocks per stage ((3, 4, 6, 3) for ResNet-34 and ResNet-50).
    block: 'basic' (ResNet-34) or 'bottleneck' (ResNet-50).
    width: multiplier of the plane counts (64, 128, 256, 512) and of the stem.
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
  """
  num_classes: int
  stages: Sequence[int] = (3, 4, 6, 3)
  block: str = 'basic'
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
      embed: return the [B, 512 * expansion * width] globally average-pooled features (the
        input of the final Dense layer) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    x = layers.Conv(s(64), 3, padding=1, use_bias=False, kernel_init=_kaiming,
                    lowering=self.lowering)(x)
    x = nn.relu(_bn(x, train, mask))
    for stage, (planes, n) in enumerate(zip((64, 128, 256, 512), self.stages)):
      for b in range(n):
        strides = 2 if stage > 0 and b == 0 else 1
        x = ProjBlock(s(planes), strides, self.block, self.lowering)(x, train, mask)
    x = jnp.mean(x, axis=(1, 2))
    if embed:
      return x
    return nn.Dense(self.num_classes, kernel_init=_kaiming)(x)


def resnet34(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> ResNet:
  """ResNet-34 (kuangliu CIFAR variant); 21,282,122 trainable params at C = 10, width 1."""
  return ResNet(num_classes=num_classes, stages=(3, 4, 6, 3), block='basic', width=width,
                lowering=lowering)


def resnet50(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> ResNet:
  """ResNet-50 (kuangliu CIFAR variant); 23,520,842 trainable params at C = 10, width 1."""
  return ResNet(num_classes=num_classes, stages=(3, 4, 6, 3), block='bottleneck', width=width,
                lowering=lowering)
