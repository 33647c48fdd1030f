"""Text models: DS-FL's IMDb LSTM and Reuters text-DNN, and LEAF's Shakespeare char-LSTM.

Inputs are token ids (int32 ``[B, L]``, 0 = padding) from a text source
(:mod:`fedjax_kd.data.text`, :mod:`fedjax_kd.data.leaf`); the text-DNN takes the
binary bag of words ``[B, V]`` instead. The engine initialises a model with a
dummy batch of the data's model-input dtype (int32 for token ids,
`FederatedData.model_input_dtype`).

* `LSTMClassifier` ("imdb_lstm"): the IMDb model of Itahara et al., "Distillation-Based
  Semi-Supervised Federated Learning for Communication-Efficient Collaborative Training with
  Non-IID Private Data" (DS-FL, IEEE TMC 2021, §4.1), which follows the Keras IMDb LSTM
  tutorial: Embedding(20,000 words, 32) -> LSTM(32), last hidden state -> Dense(2).
  648,386 parameters (640,000 + 8,320 + 66). The paper reports 646,338, 2,048 fewer (64 rows
  of the embedding table): no variant of the described layers gives that number (a smaller
  LSTM or a GRU gives a non-integer or a different count), so this is the architecture the
  text describes, and the difference is documented rather than forced. Keras' LSTM and Flax's
  have the same parameters (four gates, an input and a recurrent kernel, one bias each).
* `TextDNN` ("text_dnn"): DS-FL's Reuters model, a three-layer perceptron on the 10,000-word
  binary bag of words: Dense(512) -> BN -> ReLU -> Dense(128) -> BN -> ReLU -> Dense(46).
  5,193,390 trainable parameters and 5,194,670 in total with the BatchNorm running statistics,
  the paper's count (it counts the running statistics for this model, and they are exchanged
  by FedAvg too). The text says "activated by ReLU and batch normalized", which has the same
  parameters in either order; BN -> ReLU is the order of the paper's MNIST CNN and the
  default (``relu_before_bn=True`` gives the other).
* `LSTMClassifier` with ``layers=2, hidden=256, embed=8`` ("char_lstm"): the next-character
  model of LEAF's Shakespeare benchmark (Caldas et al., "LEAF: A Benchmark for Federated
  Settings", 2018; McMahan et al. 2017): Embedding(vocabulary, 8) -> LSTM(256) -> LSTM(256),
  last hidden state -> Dense(vocabulary). 818,137 parameters on LEAF's 80-character
  vocabulary plus one out-of-vocabulary id (81 ids and 81 classes).

The vocabulary size comes from the data (`get_model(..., vocab_size=...)`), so the embedding
table always covers every id the source can produce.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_kd.models import layers


class LSTMClassifier(nn.Module):
  """Embedding -> ``layers`` stacked LSTMs -> the last time step's hidden state -> Dense(C).

  Attributes:
    num_classes: number of output logits.
    vocab_size: rows of the embedding table (ids ``0 .. vocab_size - 1``).
    width: multiplier of the embedding and hidden sizes.
    embed_dim: embedding size at width 1.
    hidden: LSTM units at width 1.
    layers: number of stacked LSTMs.
  """
  num_classes: int
  vocab_size: int
  width: float = 1.0
  embed_dim: int = 32
  hidden: int = 32
  layers: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the last hidden state with `embed=True`.

    Args:
      x: [B, L] int token ids.
      train: unused (no dropout or BatchNorm).
      mask: unused.
      embed: return the [B, hidden * width] last hidden state instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    del train, mask
    tokens = x.reshape((x.shape[0], -1))
    h = nn.Embed(self.vocab_size, layers.scaled(self.embed_dim, self.width))(tokens)
    units = layers.scaled(self.hidden, self.width)
    for _ in range(self.layers):
      h = nn.RNN(nn.OptimizedLSTMCell(units))(h)
    h = h[:, -1]
    if embed:
      return h
    return nn.Dense(self.num_classes)(h)


class TextDNN(nn.Module):
  """DS-FL's Reuters text-DNN: [Dense -> BN -> ReLU] x (512, 128) -> Dense(C).

  Attributes:
    num_classes: number of output logits.
    width: multiplier of the hidden sizes (512, 128).
    relu_before_bn: ReLU -> BN instead of BN -> ReLU (same parameters).
  """
  num_classes: int
  width: float = 1.0
  relu_before_bn: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False, mask: jax.Array | None = None,
               embed: bool = False) -> jax.Array:
    """Computes logits, or the penultimate features with `embed=True`.

    Args:
      x: [B, V] binary bag-of-words vectors (any trailing shape is flattened).
      train: BatchNorm uses batch statistics (over masked-in rows) and updates its running
        averages if True, else it uses the running averages.
      mask: optional [B] vector of valid samples (nonzero = valid).
      embed: return the [B, 128 * width] input of the final Dense layer instead of the logits.

    Returns:
      [B, num_classes] logits, or [B, d] features if `embed`.
    """
    x = x.reshape((x.shape[0], -1))
    for units in (512, 128):
      x = nn.Dense(layers.scaled(units, self.width))(x)
      if self.relu_before_bn:
        x = layers.BatchNorm()(nn.relu(x), train=train, mask=mask)
      else:
        x = nn.relu(layers.BatchNorm()(x, train=train, mask=mask))
    if embed:
      return x
    return nn.Dense(self.num_classes)(x)
