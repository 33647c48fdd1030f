"""VGG-16 and VGG-11 of Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale
Image Recognition" (ICLR 2015). VGG-16: configuration D, in the CIFAR variant of
kuangliu/pytorch-cifar (`models/vgg.py`, 'VGG16'). VGG-11: configuration A without BN, see
the end of this docstring.

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

VGG-11 (configuration A) without BatchNorm, the large client model of FedEntOpt (arXiv
2411.01240 v2, "Boosting Federated Learning with FedEntOpt", §V; the paper says only "VGG-11"
with "over 4 million parameters", so configuration A without BN is our reading), in the
NIID-Bench / pytorch-vgg-cifar10 style: cfg [64, M, 128, M, 256, 256, M, 512,
512, M, 512, 512, M], every number Conv3x3 (padding 1, WITH bias) -> ReLU (no BN), then the
512-d features -> Dropout(0.5) -> Dense 512 -> ReLU -> Dropout(0.5) -> Dense 512 -> ReLU ->
Dense C. Same pooling rules for other input sizes as VGG-16 above. Initialization: the same
Kaiming-normal (fan-in) kernels and zero biases as VGG-16, for convs and Dense layers alike
(pytorch-vgg-cifar10 draws conv kernels from N(0, 2 / fan-out) and keeps PyTorch's default
Linear init; the scale differs only by the fan-in/fan-out choice). Dropout is active only with
`train=True` and draws from the 'dropout' rng stream.

Trainable parameters at width 1 on 32x32x3: 9,750,922 for 10 classes (convs 9,220,480 incl.
biases, hidden Dense 2 x 262,656, final Dense 5,130); 9,756,052 for 20 classes (final Dense
512 * 20 + 20 = 10,260). No BN statistics.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_kd.models import layers

_kaiming = nn.initializers.he_normal()

VGG16_CFG: tuple[int | str, ...] = (64, 64, 'M', 128, 128, 'M', 256, 256, 256, 'M', 512, 512,
                                    512, 'M', 512, 512, 512, 'M')
VGG11_CFG: tuple[int | str, ...] = (64, 'M', 128, 'M', 256, 256, 'M', 512, 512, 'M', 512, 512,
                                    'M')
VGG11_HIDDEN: tuple[int, ...] = (512, 512)


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
  """VGG, CIFAR variant: convs (with or without BatchNorm), then an optional MLP classifier.

  The defaults are kuangliu's VGG-16 (BN, a single Dense classifier); `vgg11` sets
  `batch_norm=False` and `hidden=(512, 512)` (FedEntOpt's VGG-11).

  Attributes:
    num_classes: number of output logits.
    cfg: conv channel counts and 'M' (max pool); default VGG-16.
    width: multiplier of every conv channel count and hidden Dense size (rounded, at least 1).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
    batch_norm: BatchNorm after every conv (before the ReLU) if True.
    hidden: sizes of the hidden Dense layers between the pooled features and the final Dense
      layer; each is preceded by Dropout(`dropout_rate`) and followed by a ReLU.
    dropout_rate: dropout probability before each hidden Dense layer (unused if `hidden` is
      empty).
  """
  num_classes: int
  cfg: tuple[int | str, ...] = VGG16_CFG
  width: float = 1.0
  lowering: str = 'auto'
  batch_norm: bool = True
  hidden: tuple[int, ...] = ()
  dropout_rate: float = 0.5

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the input of the final Dense layer with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images of any size >= 1 (32x32 in the papers).
      train: BatchNorm uses batch statistics (over masked-in rows) and updates its running
        averages if True, else it uses the running averages; dropout (with `hidden`) is active
        only if True and then needs the 'dropout' rng.
      mask: optional [B] vector of valid samples (nonzero = valid); only BatchNorm uses it.
      embed: return the [B, d] input of the final Dense layer instead of the logits: the pooled
        features (d = 512 * width) without `hidden`, else the output of the last hidden ReLU
        (d = hidden[-1] * width).

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
      if self.batch_norm:
        x = layers.BatchNorm(momentum=0.9, epsilon=1e-5)(x, train=train, mask=mask)
      x = nn.relu(x)
    x = jnp.mean(x, axis=(1, 2))
    for units in self.hidden:
      x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
      x = nn.relu(nn.Dense(layers.scaled(units, self.width), kernel_init=_kaiming)(x))
    if embed:
      return x
    return nn.Dense(self.num_classes, kernel_init=_kaiming)(x)


def vgg16(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> VGG:
  """VGG-16 (kuangliu CIFAR variant); 14,728,266 trainable params at C = 10, width 1."""
  return VGG(num_classes=num_classes, cfg=VGG16_CFG, width=width, lowering=lowering)


def vgg11(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> VGG:
  """VGG-11 without BN, classifier 512-512-C with dropout 0.5 (our reading of FedEntOpt's);
  9,750,922 trainable params at C = 10, width 1, 32x32x3."""
  return VGG(num_classes=num_classes, cfg=VGG11_CFG, width=width, lowering=lowering,
             batch_norm=False, hidden=VGG11_HIDDEN, dropout_rate=0.5)
