"""CIFAR ResNets of He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), §4.2.

ResNet-(6n+2): Conv3x3(16) -> BN -> ReLU -> 3 stages of n basic blocks with 16, 32, 64
channels (the first block of stages 2 and 3 has stride 2) -> global average pool ->
Dense(C). Basic block: Conv3x3 -> BN -> ReLU -> Conv3x3 -> BN, + shortcut, -> ReLU. Shortcuts
are option A of the paper: identity, and where the shape changes, stride-2 subsampling with
zero-padded extra channels, so they have no parameters. Convolutions have no bias and pad one
pixel on each side (PyTorch semantics, which keeps stride-2 windows centred on the subsampled
pixels). BatchNorm: PyTorch defaults (momentum 0.1, i.e. flax momentum 0.9; epsilon 1e-5).
Kaiming-normal (fan-in) initialization, as in the common PyTorch implementation.

Parameter counts for 10 classes and width 1 (trainable = weights + BN scale/bias; total adds
the BN running mean/var):

* resnet20 (n = 3): 269,722 trainable, 271,098 total. The often quoted "0.27M" is this model.
  The figure 272,474 belongs to option-B shortcuts (1x1 conv + BN projections on the two
  stride-2 blocks: 16*32 + 32*64 + 2*(32 + 64) = 2,752 more parameters).
* resnet32 (n = 5): 464,154 trainable, 466,426 total ("0.46M").

The ResNets of Pan et al., "FedCache 2.0: Federated Edge Learning with Knowledge Caching and
Dataset Distillation" (arXiv 2405.13378, Table XIV) are the same network with 2, 3, 4 or 5
blocks per stage (ResNet-T/S/M/L) and a different shortcut where the shape changes: a 1x1
stride-2 convolution without bias and without BatchNorm (`shortcut='conv'`; identity
elsewhere). Trainable parameters for 10 classes, width 1 and 32x32x3 inputs (the paper's
Table XIV gives them in K = 1024):

* resnet_t (2, 2, 2): 175,066 (171.0K).
* resnet_s (3, 3, 3): 272,282 (265.9K); resnet20 + 16*32 + 32*64 = 2,560 projection weights.
* resnet_m (4, 4, 4): 369,498 (360.8K).
* resnet_l (5, 5, 5): 466,714 (455.8K).

Every model returns the pooled 64 * width features (the input of the final Dense layer) with
`embed=True`: the feature extractor F_f of FedCache 2.0.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_kd.models import layers

_kaiming = nn.initializers.he_normal()

SHORTCUTS = ('a', 'conv')


class BasicBlock(nn.Module):
  """Two 3x3 convolutions with a residual shortcut.

  Attributes:
    features: output channels.
    strides: 1, or 2 to halve the spatial size.
    lowering: convolution lowering, see `layers.Conv`.
    shortcut: where the shape changes, 'a' (He et al. option A: subsample and zero-pad the
      extra channels, no parameters) or 'conv' (a 1x1 convolution with the block's stride, no
      bias, no BatchNorm; FedCache 2.0). Identity where the shape is unchanged.
  """
  features: int
  strides: int = 1
  lowering: str = 'auto'
  shortcut: str = 'a'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
    """Applies the block to x [B, H, W, Cin]; returns [B, H', W', features]."""
    bn = lambda: layers.BatchNorm(momentum=0.9, epsilon=1e-5)
    conv = lambda s: layers.Conv(self.features, 3, strides=s, padding=1, use_bias=False,
                                 kernel_init=_kaiming, lowering=self.lowering)
    y = nn.relu(bn()(conv(self.strides)(x), train=train, mask=mask))
    y = bn()(conv(1)(y), train=train, mask=mask)
    if self.shortcut not in SHORTCUTS:
      raise ValueError(f'shortcut must be one of {SHORTCUTS}, got {self.shortcut!r}')
    shortcut = x
    if self.shortcut == 'conv' and (self.strides != 1 or self.features != x.shape[-1]):
      shortcut = layers.Conv(self.features, 1, strides=self.strides, padding=0, use_bias=False,
                             kernel_init=_kaiming, lowering=self.lowering)(x)
      return nn.relu(y + shortcut)
    if self.strides != 1:
      shortcut = shortcut[:, ::self.strides, ::self.strides, :]
    extra = self.features - shortcut.shape[-1]
    if extra > 0:
      shortcut = jnp.pad(shortcut, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
    elif extra < 0:
      raise ValueError(f'option-A shortcut cannot reduce channels ({x.shape[-1]} -> '
                       f'{self.features})')
    return nn.relu(y + shortcut)


class CifarResNet(nn.Module):
  """ResNet-(6n+2) for small images.

  Attributes:
    num_classes: number of output logits.
    blocks_per_stage: n (3 for ResNet-20, 5 for ResNet-32; 2 to 5 for FedCache 2.0's
      ResNet-T/S/M/L).
    width: multiplier of the channel counts (16, 32, 64).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
    shortcut: 'a' (option A, He et al.) or 'conv' (1x1 projection without BatchNorm,
      FedCache 2.0) where a block changes the shape; see `BasicBlock`.
    block: the block's module class: `BasicBlock`, or a transform of it with the same
      variables, e.g. ``nn.remat(BasicBlock, static_argnums=(2,))`` (benchmarks/performance/remat.py).
  """
  num_classes: int
  blocks_per_stage: int = 3
  width: float = 1.0
  lowering: str = 'auto'
  shortcut: str = 'a'
  block: type[nn.Module] = BasicBlock

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the pooled features with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images of any size (32x32 in the paper).
      train: BatchNorm uses batch statistics (over masked-in rows) and updates its running
        averages if True, else it uses the running averages.
      mask: optional [B] vector of valid samples (nonzero = valid).
      embed: return the [B, 64 * width] globally average-pooled features (the input of the
        final Dense layer) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    x = layers.Conv(s(16), 3, padding=1, use_bias=False, kernel_init=_kaiming,
                    lowering=self.lowering)(x)
    x = nn.relu(layers.BatchNorm(momentum=0.9, epsilon=1e-5)(x, train=train, mask=mask))
    for stage, feats in enumerate((16, 32, 64)):
      for block in range(self.blocks_per_stage):
        strides = 2 if stage > 0 and block == 0 else 1
        i = stage * self.blocks_per_stage + block   # named BasicBlock_<i> whatever `block` is
        x = self.block(s(feats), strides, self.lowering, self.shortcut, name=f'BasicBlock_{i}')(
            x, train, mask)
    x = jnp.mean(x, axis=(1, 2))
    if embed:
      return x
    return nn.Dense(self.num_classes, kernel_init=_kaiming)(x)


def resnet20(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> CifarResNet:
  """ResNet-20 (n = 3)."""
  return CifarResNet(num_classes=num_classes, blocks_per_stage=3, width=width,
                     lowering=lowering)


def resnet32(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> CifarResNet:
  """ResNet-32 (n = 5)."""
  return CifarResNet(num_classes=num_classes, blocks_per_stage=5, width=width,
                     lowering=lowering)


def _fedcache_resnet(n: int, num_classes: int, width: float, lowering: str) -> CifarResNet:
  return CifarResNet(num_classes=num_classes, blocks_per_stage=n, width=width,
                     lowering=lowering, shortcut='conv')


def resnet_t(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> CifarResNet:
  """FedCache 2.0 ResNet-T: (2, 2, 2) blocks, 1x1-conv shortcuts; 175,066 params at C = 10."""
  return _fedcache_resnet(2, num_classes, width, lowering)


def resnet_s(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> CifarResNet:
  """FedCache 2.0 ResNet-S: (3, 3, 3) blocks, 1x1-conv shortcuts; 272,282 params at C = 10."""
  return _fedcache_resnet(3, num_classes, width, lowering)


def resnet_m(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> CifarResNet:
  """FedCache 2.0 ResNet-M: (4, 4, 4) blocks, 1x1-conv shortcuts; 369,498 params at C = 10."""
  return _fedcache_resnet(4, num_classes, width, lowering)


def resnet_l(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> CifarResNet:
  """FedCache 2.0 ResNet-L: (5, 5, 5) blocks, 1x1-conv shortcuts; 466,714 params at C = 10."""
  return _fedcache_resnet(5, num_classes, width, lowering)
