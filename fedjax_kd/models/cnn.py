"""Small CNNs for 28x28 (and 8x8) grayscale images, and BlazeFL's CIFAR-10 CNN.

* `CNN` ("cnn"): the small CNN of the throughput benchmarks (the MNIST CNN family of McMahan et
  al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS
  2017, with 16/32 channels and 128 hidden units): Conv5x5(16) SAME -> ReLU -> MaxPool2 ->
  Conv5x5(32) SAME -> ReLU -> MaxPool2 -> Dense(128) -> ReLU -> Dense(C). No BatchNorm.
  215,370 parameters on 28x28x1 with 10 classes; 31,050 on 8x8x1 (sklearn digits).
* `DSFLCNN` ("dsfl_cnn") and `DSFLFMNISTCNN` ("dsfl_fmnist_cnn"): the MNIST and Fashion-MNIST
  CNNs of Itahara et al., "Distillation-Based Semi-Supervised Federated Learning for
  Communication-Efficient Collaborative Training with Non-IID Private Data" (DS-FL, IEEE TMC
  2021), reconstructed from the parameter counts the paper reports: 583,242 trainable /
  584,458 total and 2,760,228 trainable / 2,762,272 total. BatchNorm with PyTorch's defaults
  (momentum 0.1, i.e. 0.9 in flax's convention; epsilon 1e-5); the registry draws their
  Dense/Conv layers with PyTorch's default init (they are registered with `init='torch'`). Keras' defaults
  (BatchNorm momentum 0.99, epsilon 1e-3, Glorot init), the other reading of the paper, are
  `model.bn_momentum=0.99, model.bn_epsilon=1e-3, model.init='keras'`: they leave the
  inference-mode model predicting one class for the first few hundred steps (the running
  variance starts at 1 while conv1's output variance is ~0.01), which stalls DS-FL, whose
  clients upload and whose server is scored in inference mode.
* "blazefl_cnn": `CNN(features=(32, 64), hidden=512, padding='VALID')`, the CIFAR-10 CNN of McMahan et al. 2017 as implemented by
  FedLab's `CNN_CIFAR10` (Conv5x5(32) VALID -> ReLU -> MaxPool2 -> Conv5x5(64) VALID -> ReLU
  -> MaxPool2 -> Dense(512) -> ReLU -> Dense(C)), which is the architecture as we understand
  BlazeFL's quickstart-fedavg `models.cnn.CNN` (kitsuyaazuma/BlazeFL), used by
  benchmarks/performance/speed.py to reproduce BlazeFL's published rounds/minute. 878,538 parameters
  on 32x32x3 with 10 classes (2,432 + 51,264 + 819,712 + 5,130). No BatchNorm, no dropout.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_kd.models import layers


class CNN(nn.Module):
  """Two conv5x5-ReLU-MaxPool2 blocks, a hidden Dense-ReLU and the logits. `mask` is ignored.

  The defaults are the small "cnn"; ``features=(32, 64), hidden=512,
  padding='VALID'`` is BlazeFL's CIFAR-10 CNN ("blazefl_cnn").

  Attributes:
    num_classes: number of output logits.
    width: multiplier of the hidden sizes (``features`` and ``hidden``).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
    features: channels of the two convolutions.
    hidden: units of the hidden Dense layer.
    padding: 'SAME' or 'VALID' convolutions.
  """
  num_classes: int
  width: float = 1.0
  lowering: str = 'auto'
  features: tuple[int, int] = (16, 32)
  hidden: int = 128
  padding: str = 'SAME'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images; H and W at least 4 ('SAME') or 16 ('VALID').
      train: unused.
      mask: unused.
      embed: return the [B, hidden * width] input of the final Dense layer (after its
        activation) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    del train, mask
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    for feats in self.features:
      x = layers.Conv(s(feats), 5, padding=self.padding, lowering=self.lowering)(x)
      x = layers.max_pool2(nn.relu(x))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(s(self.hidden))(x))
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)


def _bn_act(x: jax.Array, train: bool, mask: jax.Array | None,
            relu_first: bool) -> jax.Array:
  bn = layers.BatchNorm(momentum=0.9, epsilon=1e-5)
  if relu_first:
    return bn(nn.relu(x), train=train, mask=mask)
  return nn.relu(bn(x, train=train, mask=mask))


class DSFLCNN(nn.Module):
  """DS-FL MNIST CNN (§4.1): Conv5x5(32) VALID -> BN -> ReLU -> MaxPool2 -> Conv5x5(64) VALID
  -> BN -> ReLU -> MaxPool2 -> Dense(512) -> BN -> ReLU -> Dense(C).

  Attributes:
    num_classes: number of output logits.
    width: multiplier of the hidden sizes (32, 64, 512).
    relu_before_bn: ReLU -> BN instead of BN -> ReLU (the order the paper's text gives for
      its Fashion-MNIST and Reuters models; same parameters).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
  """
  num_classes: int
  width: float = 1.0
  relu_before_bn: bool = False
  lowering: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images, H and W at least 16 (28 in the paper).
      train: BatchNorm uses batch statistics (over masked-in rows) and updates its running
        averages if True, else it uses the running averages.
      mask: optional [B] vector of valid samples (nonzero = valid).
      embed: return the [B, 512 * width] input of the final Dense layer (after its
        BatchNorm and ReLU) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    for feats in (32, 64):
      x = layers.Conv(s(feats), 5, padding='VALID',
                      lowering=self.lowering)(x)
      x = layers.max_pool2(_bn_act(x, train, mask, self.relu_before_bn))
    x = x.reshape((x.shape[0], -1))
    x = _bn_act(nn.Dense(s(512))(x), train, mask, self.relu_before_bn)
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)


class DSFLFMNISTCNN(nn.Module):
  """DS-FL Fashion-MNIST CNN (§4.1): [Conv3x3(32) SAME -> BN -> ReLU] x2 -> MaxPool2 ->
  [Conv3x3(64) -> BN -> ReLU] x2 -> MaxPool2 -> [Conv3x3(128) -> BN -> ReLU] x2 -> Dense(382)
  -> BN -> ReLU -> Dense(192) -> BN -> ReLU -> Dense(C). Only two pools (the parameter count
  rules out a third).

  Attributes:
    num_classes: number of output logits.
    width: multiplier of the hidden sizes (32, 64, 128, 382, 192).
    relu_before_bn: ReLU -> BN instead of BN -> ReLU (the order the paper's text gives for
      this model; same parameters).
    lowering: convolution lowering ('auto', 'im2col' or 'xla'), see `layers.Conv`.
  """
  num_classes: int
  width: float = 1.0
  relu_before_bn: bool = False
  lowering: str = 'auto'

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, H, W, C] (or [B, H, W]) images, H and W at least 4 (28 in the paper).
      train: BatchNorm uses batch statistics (over masked-in rows) and updates its running
        averages if True, else it uses the running averages.
      mask: optional [B] vector of valid samples (nonzero = valid).
      embed: return the [B, 192 * width] input of the final Dense layer (after its
        BatchNorm and ReLU) instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    s = lambda n: layers.scaled(n, self.width)
    x = layers.as_image(x)
    for stage, feats in enumerate((32, 64, 128)):
      for _ in range(2):
        x = layers.Conv(s(feats), 3, padding='SAME',
                        lowering=self.lowering)(x)
        x = _bn_act(x, train, mask, self.relu_before_bn)
      if stage < 2:
        x = layers.max_pool2(x)
    x = x.reshape((x.shape[0], -1))
    for units in (382, 192):
      x = _bn_act(nn.Dense(s(units))(x), train, mask,
                  self.relu_before_bn)
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)
