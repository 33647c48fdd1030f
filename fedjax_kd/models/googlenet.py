"""GoogLeNet (Inception v1) of Szegedy et al., "Going Deeper with Convolutions" (CVPR 2015), in
the CIFAR variant of kuangliu/pytorch-cifar (`models/googlenet.py`).

One of the four image architectures of He, Bai, Li, Chen and Du, "ACE-pFL: Accurate, Efficient
Personalized Federated Learning With Knowledge Distillation" (IEEE/ACM Transactions on
Networking 2025), which take them from kuangliu/pytorch-cifar.

Network: pre-layers Conv3x3(192) -> BN -> ReLU (instead of the ImageNet 7x7/2 stem, max pools
and local response normalization) -> a3 -> b3 -> MaxPool3x3/2 -> a4 -> b4 -> c4 -> d4 -> e4 ->
MaxPool3x3/2 -> a5 -> b5 -> global average pool (kuangliu's AvgPool2d(8) on the 8x8 map of a
32x32 input) -> Dense(1024 -> C). No auxiliary classifiers and no dropout.

Inception module (in: n1x1, n3x3red, n3x3, n5x5red, n5x5, pool_planes), four branches
concatenated on the channel axis in this order:

* b1: Conv1x1(n1x1);
* b2: Conv1x1(n3x3red) -> Conv3x3(n3x3);
* b3: Conv1x1(n5x5red) -> Conv3x3(n5x5) -> Conv3x3(n5x5) (kuangliu's two stacked 3x3
  convolutions in place of the paper's 5x5);
* b4: MaxPool3x3/1 (padding 1) -> Conv1x1(pool_planes);

every convolution WITH bias and followed by BN -> ReLU; 3x3 convolutions pad one pixel.

| module | in | n1x1 | n3x3red | n3x3 | n5x5red | n5x5 | pool |
|---|---|---|---|---|---|---|---|
| a3 | 192 | 64 | 96 | 128 | 16 | 32 | 32 |
| b3 | 256 | 128 | 128 | 192 | 32 | 96 | 64 |
| a4 | 480 | 192 | 96 | 208 | 16 | 48 | 64 |
| b4 | 512 | 160 | 112 | 224 | 24 | 64 | 64 |
| c4 | 512 | 128 | 128 | 256 | 24 | 64 | 64 |
| d4 | 512 | 112 | 144 | 288 | 32 | 64 | 64 |
| e4 | 528 | 256 | 160 | 320 | 32 | 128 | 128 |
| a5 | 832 | 256 | 160 | 320 | 32 | 128 | 128 |
| b5 | 832 | 384 | 192 | 384 | 48 | 128 | 128 |

The max pools are 3x3 windows padded by one pixel with -inf (PyTorch's MaxPool2d(3, stride,
padding=1)); the stride-2 ones map a side n to ceil(n / 2), so any side >= 1 works (32 -> 16
-> 8). They are computed as a separable max of shifted slices (fast on CPU, unlike
`lax.reduce_window`). The global average pool is kuangliu's AvgPool2d(8) on 32x32 inputs and
works for any other size.

BatchNorm: PyTorch defaults (momentum 0.1, i.e. flax momentum 0.9; epsilon 1e-5). Kaiming-normal
(fan-in) initialization, as `resnet.py`; zero biases.

Trainable parameters for 10 classes at width 1: 6,166,250 (PyTorch's `sum(p.numel() for p in
GoogLeNet().parameters())`); the BN running statistics add 15,808 (6,182,058 in all).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_kd.models import layers

_kaiming = nn.initializers.he_normal()

# (n1x1, n3x3red, n3x3, n5x5red, n5x5, pool_planes) of a3, b3, a4, b4, c4, d4, e4, a5, b5.
INCEPTION_CFG: dict[str, tuple[int, int, int, int, int, int]] = {
    'a3': (64, 96, 128, 16, 32, 32),
    'b3': (128, 128, 192, 32, 96, 64),
    'a4': (192, 96, 208, 16, 48, 64),
    'b4': (160, 112, 224, 24, 64, 64),
    'c4': (128, 128, 256, 24, 64, 64),
    'd4': (112, 144, 288, 32, 64, 64),
    'e4': (256, 160, 320, 32, 128, 128),
    'a5': (256, 160, 320, 32, 128, 128),
    'b5': (384, 192, 384, 48, 128, 128),
}

# The network: Inception module names and 'M' (3x3 stride-2 max pool).
GOOGLENET_LAYOUT = ('a3', 'b3', 'M', 'a4', 'b4', 'c4', 'd4', 'e4', 'M', 'a5', 'b5')


def max_pool3(x: jax.Array, strides: int = 1) -> jax.Array:
  """3x3 max pool with one pixel of -inf padding (PyTorch's MaxPool2d(3, strides, 1)).

  Args:
    x: [B, H, W, C].
    strides: 1 or 2.

  Returns:
    [B, (H - 1) // strides + 1, (W - 1) // strides + 1, C].
  """
  b, h, w, c = x.shape
  oh, ow = (h - 1) // strides + 1, (w - 1) // strides + 1
  xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-jnp.inf)
  rows = [xp[:, i:i + (oh - 1) * strides + 1:strides, :, :] for i in range(3)]
  r = jnp.maximum(jnp.maximum(rows[0], rows[1]), rows[2])
  cols = [r[:, :, j:j + (ow - 1) * strides + 1:strides, :] for j in range(3)]
  return jnp.maximum(jnp.maximum(cols[0], cols[1]), cols[2])


class Inception(nn.Module):
  """Inception module (kuangliu variant: two 3x3 convolutions in place of the 5x5).

  Attributes:
    n1x1, n3x3red, n3x3, n5x5red, n5x5, pool_planes: branch channel counts (already scaled).
    lowering: convolution lowering, see `layers.Conv`.
  """
  n1x1: int
  n3x3red: int
  n3x3: int
  n5x5red: int
  n5x5: int
  pool_planes: int
  lowering: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None) -> jax.Array:
    """Applies the module to x [B, H, W, Cin]; returns [B, H, W, sum of branch outputs]."""

    def cbr(y, feats, k):
      y = layers.Conv(feats, k, padding=(k - 1) // 2, use_bias=True, kernel_init=_kaiming,
                      lowering=self.lowering)(y)
      return nn.relu(layers.BatchNorm(momentum=0.9, epsilon=1e-5)(y, train=train, mask=mask))

    y1 = cbr(x, self.n1x1, 1)
    y2 = cbr(cbr(x, self.n3x3red, 1), self.n3x3, 3)
    y3 = cbr(cbr(cbr(x, self.n5x5red, 1), self.n5x5, 3), self.n5x5, 3)
    y4 = cbr(max_pool3(x, 1), self.pool_planes, 1)
    return jnp.concatenate([y1, y2, y3, y4], axis=-1)


class GoogLeNet(nn.Module):
  """kuangliu's CIFAR GoogLeNet.

  Attributes:
    num_classes: number of output logits.
    width: multiplier of every conv channel count (stem 192 and all branch sizes).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
  """
  num_classes: int
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
      embed: return the [B, 1024 * width (sum of b5's scaled branches)] globally
        average-pooled features (the input of the final Dense layer) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    x = layers.Conv(s(192), 3, padding=1, use_bias=True, kernel_init=_kaiming,
                    lowering=self.lowering)(x)
    x = nn.relu(layers.BatchNorm(momentum=0.9, epsilon=1e-5)(x, train=train, mask=mask))
    for item in GOOGLENET_LAYOUT:
      if item == 'M':
        x = max_pool3(x, 2)
      else:
        x = Inception(*(s(n) for n in INCEPTION_CFG[item]), lowering=self.lowering,
                      name=f'Inception_{item}')(x, train, mask)
    x = jnp.mean(x, axis=(1, 2))
    if embed:
      return x
    return nn.Dense(self.num_classes, kernel_init=_kaiming)(x)


def googlenet(num_classes: int, width: float = 1.0, lowering: str = 'auto') -> GoogLeNet:
  """GoogLeNet (kuangliu CIFAR variant); 6,166,250 trainable params at C = 10, width 1."""
  return GoogLeNet(num_classes=num_classes, width=width, lowering=lowering)
