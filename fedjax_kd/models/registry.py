"""Model registry: builds a model from a spec string "name@width".

`get_model('cnn@0.5', num_classes=10, input_shape=(28, 28, 1))` returns a `flax.linen.Module`
whose `__call__(x, train=False, mask=None, embed=False)` maps a batch [B, *input_shape] to
logits [B, num_classes]. BatchNorm models take a [B] `mask` of valid rows (the others ignore
it); models with dropout ('fcn', 'vgg11') apply it only with `train=True`, drawing from the
'dropout' rng. With `embed=True` every model returns instead its penultimate representation
[B, d]: the exact input of its final Dense layer (after that layer's activation, pooling and
dropout), so that `logits == embed_output @ W + b` with the final Dense parameters (FedCache
2.0's feature extractor).

Every model, built-in or a user's, is one `ModelEntry` added with `register`: the built-in ones
at the end of this module, each declaring its initializer family for `init='auto'`, whether it
has BatchNorm, what inputs it takes ('image' with a smallest side, 'tokens' or 'any') and
whether its builder takes the convolution lowering. `parse_spec`, `init_family` and `get_model`
read the entry; `entry(name)` returns it and `available()` lists the names. See the model
modules for the papers behind each architecture:

| name | module | paper |
|---|---|---|
| mlp | `mlp.MLP` | McMahan et al. 2017 (2NN) |
| cnn | `cnn.CNN` | McMahan et al. 2017 CNN family (the calibration CNN) |
| dsfl_cnn | `cnn.DSFLCNN` | Itahara et al. 2021 (DS-FL), MNIST |
| dsfl_fmnist_cnn | `cnn.DSFLFMNISTCNN` | Itahara et al. 2021 (DS-FL), Fashion-MNIST |
| blazefl_cnn | `cnn.CNN` (32/64 VALID, 512) | McMahan et al. 2017 CIFAR CNN (FedLab `CNN_CIFAR10`; BlazeFL) |
| resnet20, resnet32 | `resnet.CifarResNet` | He et al. 2016, §4.2 |
| lenet5 | `lenet.LeNet5` | LeCun et al. 1998 (CIFAR variant) |
| resnet_t/s/m/l | `resnet.CifarResNet` | Pan et al., FedCache 2.0, arXiv 2405.13378, Table XIV |
| fcn | `fcn.FCN` | Pan et al., FedCache 2.0, arXiv 2405.13378, Table XIV (FCN-U, FCN-T) |
| googlenet | `googlenet.GoogLeNet` | Szegedy et al. 2015; ACE-pFL (He et al. 2025) |
| vgg16 | `vgg.VGG` | Simonyan & Zisserman 2015; ACE-pFL (He et al. 2025) |
| vgg11 | `vgg.VGG` | Simonyan & Zisserman 2015 (config. A, no BN); FedEntOpt, arXiv 2411.01240 |
| resnet34, resnet50 | `resnet_imagenet.ResNet` | He et al. 2016; ACE-pFL (He et al. 2025) |
| imdb_lstm | `text.LSTMClassifier` | Itahara et al. 2021 (DS-FL), IMDb |
| text_dnn | `text.TextDNN` | Itahara et al. 2021 (DS-FL), Reuters |
| char_lstm | `text.LSTMClassifier` (2 x 256) | LEAF Shakespeare (Caldas et al. 2018) |
| leaf_cnn | `cnn.CNN` (32/64 SAME, 2048) | LEAF FEMNIST (Caldas et al. 2018) |

The FedCache 2.0 ResNets (ResNet-T/S/M/L: 2, 3, 4, 5 blocks per stage) differ from resnet20/32
only in their 1x1-convolution shortcuts (`shortcut='conv'`, no BatchNorm) where a block changes
the shape.

googlenet, vgg16, resnet34 and resnet50 are the four image models of ACE-pFL (K. He, H. Bai,
Y. Li, J. Chen, R. Du, "ACE-pFL: Accurate, Efficient Personalized Federated Learning With
Knowledge Distillation", IEEE/ACM Transactions on Networking 2025), in the CIFAR variants of
kuangliu/pytorch-cifar (3x3 stems, no initial max pool, 32x32 inputs; global average pooling
so that they take any side >= 1). Trainable parameters for 10 classes at width 1: 6,166,250,
14,728,266, 21,282,122 and 23,520,842.

vgg11 is the large client model of FedEntOpt (arXiv 2411.01240 v2, its model-heterogeneity
experiments): VGG-11 configuration A without BatchNorm, then Dropout(0.5) -> Dense 512 -> ReLU ->
Dropout(0.5) -> Dense 512 -> ReLU -> Dense C (NIID-Bench / pytorch-vgg-cifar10 style), with the
same pooling as vgg16 for other input sizes; 9,750,922 trainable parameters for 10 classes at
width 1. Its dropout draws from the 'dropout' rng with `train=True`.

leaf_cnn is the FEMNIST CNN of LEAF's reference models (Caldas et al., "LEAF: A Benchmark for
Federated Settings", 2018): Conv5x5(32) SAME -> ReLU -> MaxPool2 -> Conv5x5(64) SAME -> ReLU ->
MaxPool2 -> Dense(2048) -> ReLU -> Dense(C); 6,603,710 parameters on 28x28x1 with 62 classes.
The text models (imdb_lstm, text_dnn, char_lstm) are described in `text`.

blazefl_cnn is the CIFAR-10 CNN of McMahan et al. 2017 in FedLab's `CNN_CIFAR10` form, the
architecture as we understand BlazeFL's quickstart `models.cnn.CNN`
(benchmarks/performance/speed.py): 878,538 trainable parameters on 32x32x3 with 10 classes at width
1.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_kd.ops.errors import ParamError
from fedjax_kd.models import (cnn, fcn, googlenet, layers, lenet, mlp, resnet,
                              resnet_imagenet, text, vgg)

# A builder makes a module from the spec's width and the data: it is called as
# ``builder(num_classes=..., width=..., input_shape=...)``, plus ``lowering=...`` and
# ``vocab_size=...`` when its entry declares them (see `ModelEntry`).
Builder = Callable[..., nn.Module]

# What a model takes (`ModelEntry.inputs`): 'any' (it flattens whatever it gets, or checks the
# shape itself), 'image' ([H, W] or [H, W, C] with sides >= `ModelEntry.min_side`) or 'tokens'
# (token ids [L] of a text source; the builder is given the vocabulary size).
INPUTS: tuple[str, ...] = ('any', 'image', 'tokens')
INIT_CHOICES: tuple[str, ...] = ('auto',) + tuple(f for f in layers.INIT_FAMILIES)

_NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyz0123456789_')


@dataclasses.dataclass(frozen=True)
class ModelEntry:
  """One model of the registry: its builder and what it declares about itself.

  Built-in models and models added with :func:`register` are entries alike; every lookup
  (:func:`parse_spec`, :func:`init_family`, :func:`get_model`) reads the entry.

  Attributes:
    name: the name a spec uses ('cnn' in 'cnn@0.5').
    builder: makes the module, called as ``builder(num_classes=C, width=w, input_shape=shape)``
      plus ``lowering=`` when `lowering` and ``vocab_size=`` when `inputs` is 'tokens'.
    init: the initializer family `model.init='auto'` draws the model from (one of
      `layers.INIT_FAMILIES`; 'module': the module's own initializers).
    batch_norm: the model has BatchNorm layers (`model.bn_momentum` and `model.bn_epsilon`
      act on them; they take the ``mask`` of valid rows).
    inputs: what the model takes, one of `INPUTS`: 'any', 'image' or 'tokens'.
    min_side: the smallest image height and width the model accepts (``inputs='image'``).
    lowering: the builder takes ``lowering=``, the convolution lowering of :func:`get_model`
      ('auto', 'im2col' or 'xla'), for its `layers.Conv` layers.
    builtin: the model ships with fedjax_kd; it cannot be replaced or unregistered.
  """
  name: str
  builder: Builder
  init: str = 'module'
  batch_norm: bool = False
  inputs: str = 'any'
  min_side: int = 1
  lowering: bool = False
  builtin: bool = False


_ENTRIES: dict[str, ModelEntry] = {}


def register(name: str, builder: Builder | None = None, *, replace: bool = False,
             init: str = 'module', batch_norm: bool = False, inputs: str = 'any',
             min_side: int = 1, lowering: bool = False):
  """Adds a model under ``name``, usable in every model field of a config.

  Every built-in model is added by this function too (at the end of this module), with the
  properties it declares; a model of your own is looked up and built the same way.

  ``builder(num_classes=C, width=w, input_shape=shape)`` returns an unbound
  ``flax.linen.Module`` whose ``__call__(x, train=False, mask=None, embed=False)``
  follows the engine's contract: ``x`` is a batch ``[B, *input_shape]`` of model
  inputs (pixels already scaled to [0, 1]); it returns logits ``[B, C]``; ``mask``
  (``[B]`` bool, or None) marks the real rows of a padded training batch and is
  only needed by BatchNorm (pass it to :class:`fedjax_kd.models.BatchNorm`, or
  ignore it); ``embed=True`` returns the input of the final Dense layer (only
  FedCache 2.0 asks for it); dropout draws from the ``'dropout'`` rng when
  ``train=True``. ``width`` is the number after ``@`` in the spec (1.0 when
  absent), to scale hidden sizes or to ignore.

  Register in the config file (it is Python) or before building an experiment;
  a sweep's workers run the config file, so they see it too::

    from fedjax_kd import models

    @models.register('tiny_mlp')
    def tiny_mlp(num_classes, width, input_shape):
      return models.MLP(num_classes=num_classes, width=0.25 * width)

    config.clients.models = ['tiny_mlp', 'tiny_mlp@2']

  Args:
    name: lower-case letters, digits and ``_``, not a built-in model name.
    builder: the builder; omitted, ``register`` returns a decorator.
    replace: allow replacing another model registered earlier under ``name`` (the
      same builder defined again, as when a config file is executed twice, always
      replaces itself).
    init: the initializer family `model.init='auto'` gives the model: 'module' (its
      own initializers), 'torch', 'keras', 'flax' or 'he' (see `layers.reinit`).
    batch_norm: the model has BatchNorm layers (reported by :func:`entry`).
    inputs: 'any' (no check: the model flattens its input, or checks it itself),
      'image' (``get_model`` requires an input of shape (H, W) or (H, W, C) with sides
      >= ``min_side``) or 'tokens' (token ids [L] of a text source; the builder is
      also given ``vocab_size=``, the number of token ids).
    min_side: the smallest image side the model accepts, for ``inputs='image'``.
    lowering: the builder also takes ``lowering=`` ('auto', 'im2col' or 'xla'), to
      pass to its :class:`fedjax_kd.models.Conv` layers.

  Returns:
    ``builder`` (or the decorator).

  Raises:
    ValueError: a bad name, a built-in name, a name taken by another builder
      (without ``replace``), a builder that is not callable, or a bad property.
  """
  if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
    raise ValueError(f'models.register: name {name!r}: lower-case letters, digits and _ only')
  current = _ENTRIES.get(name)
  if current is not None and current.builtin:
    raise ValueError(f'models.register: {name!r} is a built-in model; choose another name')
  if init not in layers.INIT_FAMILIES:
    raise ValueError(f'models.register: init={init!r} of {name!r}: one of '
                     f'{layers.INIT_FAMILIES}')
  if inputs not in INPUTS:
    raise ValueError(f'models.register: inputs={inputs!r} of {name!r}: one of {INPUTS}')
  if isinstance(min_side, bool) or not isinstance(min_side, int) or min_side < 1:
    raise ValueError(f'models.register: min_side={min_side!r} of {name!r}: an int >= 1')
  if min_side != 1 and inputs != 'image':
    raise ValueError(f"models.register: min_side of {name!r} applies to inputs='image' only")
  for what, v in (('batch_norm', batch_norm), ('lowering', lowering)):
    if not isinstance(v, bool):
      raise ValueError(f'models.register: {what}={v!r} of {name!r}: True or False')

  def add(fn: Builder) -> Builder:
    if not callable(fn):
      raise ValueError(f'models.register: the builder of {name!r} is not callable')
    prev = _ENTRIES.get(name)
    # The same builder defined again (a config file is executed more than once) replaces itself.
    if prev is not None and _qualname(prev.builder) != _qualname(fn) and not replace:
      raise ValueError(f'models.register: {name!r} is already registered to '
                       f'{_qualname(prev.builder)} (pass replace=True)')
    _ENTRIES[name] = ModelEntry(name=name, builder=fn, init=init, batch_norm=batch_norm,
                                inputs=inputs, min_side=min_side, lowering=lowering)
    return fn

  return add if builder is None else add(builder)


def _qualname(fn: Any) -> str:
  return getattr(fn, '__qualname__', type(fn).__qualname__)


def unregister(name: str) -> None:
  """Removes a model added with :func:`register` (no-op when absent or built-in)."""
  e = _ENTRIES.get(name)
  if e is not None and not e.builtin:
    del _ENTRIES[name]


def available() -> tuple[str, ...]:
  """Every model name a spec may use: the built-in ones, then the registered ones."""
  return (tuple(n for n, e in _ENTRIES.items() if e.builtin) +
          tuple(sorted(n for n, e in _ENTRIES.items() if not e.builtin)))


def _spec_help() -> str:
  return ("'name' or 'name@width' with name one of " + ', '.join(available()) +
          ' and width a number > 0')


def parse_spec(spec: str, field: str = 'spec') -> tuple[str, float]:
  """Splits "name@width" into (name, width); width defaults to 1.0.

  Args:
    spec: the model spec, e.g. 'resnet20', 'cnn@0.5'.
    field: the config field the spec came from (named in errors).

  Returns:
    (name, width) with name in :func:`available` and width a finite float > 0.

  Raises:
    ParamError: unknown name, or a width that is not a number > 0.
  """
  if not isinstance(spec, str):
    raise ParamError(field, spec, _spec_help())
  name, sep, w = spec.strip().partition('@')
  name = name.strip().lower()
  if name not in _ENTRIES:
    raise ParamError(field, spec, _spec_help())
  width = 1.0
  if sep:
    try:
      width = float(w.strip())
    except ValueError:
      raise ParamError(field, spec, _spec_help()) from None
    if not math.isfinite(width) or width <= 0:
      raise ParamError(field, spec, _spec_help())
  return name, width


def entry(spec: str, field: str = 'spec') -> ModelEntry:
  """The registry entry of the model a spec names ('cnn', 'cnn@0.5', a registered name).

  Raises:
    ParamError: as :func:`parse_spec`.
  """
  return _ENTRIES[parse_spec(spec, field)[0]]


def init_family(spec: str, init: str = 'auto') -> str:
  """The initializer family a model is drawn from: ``init``, or the model's own for 'auto'."""
  if init not in INIT_CHOICES:
    raise ParamError('init', init, INIT_CHOICES)
  if init != 'auto':
    return init
  return entry(spec).init


def _check_input(e: ModelEntry, shape: tuple[int, ...], field: str, spec: str,
                 vocab_size: int | None) -> None:
  """Raises ParamError when the model of ``e`` cannot take inputs of ``shape``."""
  if e.inputs == 'tokens':
    if vocab_size is None or len(shape) != 1:
      raise ParamError(field, spec, f"token ids [L] from a text source for '{e.name}' (imdb:, "
                        f'reuters:, shakespeare: or a tokenized npz); got input_shape={shape}'
                        + ('' if vocab_size else ' without a vocabulary'))
  elif e.inputs == 'image':
    if len(shape) not in (2, 3):
      raise ParamError(field, spec, f"an input of shape (H, W) or (H, W, C) for '{e.name}'; "
                        f'got input_shape={shape}')
    if min(shape[0], shape[1]) < e.min_side:
      raise ParamError(field, spec, f'images of at least {e.min_side}x{e.min_side} '
                        f"pixels for '{e.name}'; got input_shape={shape}")


def get_model(spec: str, *, num_classes: int, input_shape: tuple[int, ...],
              field: str = 'spec', lowering: str = 'auto', init: str = 'auto',
              bn_momentum: float | None = None,
              bn_epsilon: float | None = None, vocab_size: int | None = None) -> nn.Module:
  """Builds the model named by a spec.

  Built-in and registered models go the same way: the input is checked against the model's
  entry (`ModelEntry.inputs`, `ModelEntry.min_side`), its builder makes the module, and the
  init/BatchNorm options wrap it.

  Args:
    spec: "name@width" (width: multiplier of every hidden channel/unit count, rounded, at
      least 1; default 1.0).
    num_classes: number of output logits (>= 1).
    input_shape: shape of one example, without the batch axis: (H, W, C) or (H, W) for the
      image models, anything for 'mlp' and 'fcn'.
    field: the config field the spec came from (named in errors).
    lowering: convolution lowering for the conv models ('auto', 'im2col', 'xla').
    init: initializer family of the Dense/Conv layers: 'auto' (the model's own,
      `ModelEntry.init`), 'module', 'torch', 'keras', 'flax' or 'he' (see `layers.reinit`).
    bn_momentum: running-average decay of every BatchNorm (flax convention, PyTorch's 0.1 is
      0.9); None keeps the model's (0.9 for every model here).
    bn_epsilon: epsilon of every BatchNorm; None keeps the model's (1e-5 for every model here).
    vocab_size: the number of token ids of a text source (models with ``inputs='tokens'``
      need it: it sizes their embedding table); None for other inputs.

  Returns:
    An unbound flax module (wrapped in `layers.WithOptions` when an option differs from the
    module's own; the variables are the same); `module.apply(variables, x, train=..., mask=...)` gives logits
    (`embed=True`: the input of the final Dense layer).

  Raises:
    ParamError: bad spec, num_classes, input_shape, an input the model cannot take, or a
      builder that fails or returns something other than a flax module.
  """
  name, width = parse_spec(spec, field)
  e = _ENTRIES[name]
  if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
    raise ParamError('num_classes', num_classes, 'an int >= 1')
  shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else None
  if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                          for d in shape):
    raise ParamError('input_shape', input_shape, 'a non-empty tuple of positive ints')
  layers.resolve_lowering(lowering)
  _check_input(e, shape, field, spec, vocab_size)
  options: dict[str, Any] = {}
  if e.lowering:
    options['lowering'] = lowering
  if e.inputs == 'tokens':
    options['vocab_size'] = int(vocab_size)
  try:
    module = e.builder(num_classes=num_classes, width=width, input_shape=shape, **options)
  except (ParamError, TypeError, ValueError) as err:
    raise ParamError(field, spec, f"a model its builder can make for input_shape={shape} "
                      f"and num_classes={num_classes} (the builder of '{name}' raised "
                      f'{type(err).__name__}: {err})') from None
  if not isinstance(module, nn.Module):
    raise ParamError(field, spec, f"a builder returning a flax.linen.Module (the builder of "
                      f"'{name}' returned {type(module).__name__})")
  return _with_options(module, init_family(spec, init), bn_momentum, bn_epsilon)


def _with_options(module: nn.Module, family: str, bn_momentum: float | None,
                  bn_epsilon: float | None) -> nn.Module:
  """``module``, wrapped in ``layers.WithOptions`` when an option differs from its own."""
  for what, v in (('bn_momentum', bn_momentum), ('bn_epsilon', bn_epsilon)):
    if v is not None and not (isinstance(v, (int, float)) and 0 < v < 1):
      raise ParamError(what, v, 'a number in (0, 1)')
  if family != 'module' or bn_momentum is not None or bn_epsilon is not None:
    module = layers.WithOptions(module, init_family=family, bn_momentum=bn_momentum,
                                bn_epsilon=bn_epsilon)
  return module


# ------------------------------------------------------------------------------ built-ins

def _builder(make: Callable[..., nn.Module], **fixed: Any) -> Builder:
  """The builder ``make(num_classes=C, width=w, **options, **fixed)`` (input_shape unused)."""

  def build(*, num_classes: int, width: float, input_shape: tuple[int, ...],
            **options: Any) -> nn.Module:
    del input_shape
    return make(num_classes=num_classes, width=width, **options, **fixed)

  return build


# The built-in models, in the order `available` lists them. Image sides: a VALID conv5 ->
# pool2 -> conv5 -> pool2 stack (dsfl_cnn, lenet5, blazefl_cnn) needs 16, two pool2s (cnn,
# dsfl_fmnist_cnn, leaf_cnn) 4; the others pool globally and take any side.
#
# The DS-FL CNNs draw PyTorch's layer defaults (init='torch'): with Keras' Glorot init,
# BatchNorm momentum 0.99 and epsilon 1e-3 (the other reading of the paper), conv1's outputs
# have a variance of ~0.01 while the running variance starts at 1 and decays as 0.99^n, so for
# the first few hundred steps every inference-mode prediction is one class; DS-FL exchanges
# inference-mode predictions, and its server model then stalls at 0.12-0.20 for the first
# rounds on MNIST where a PyTorch DS-FL reaches ~0.78 by round 2. Every other model keeps the
# init its module draws ('module', documented in its module).
register('mlp', _builder(mlp.MLP))
register('cnn', _builder(cnn.CNN), inputs='image', min_side=4, lowering=True)
register('dsfl_cnn', _builder(cnn.DSFLCNN), init='torch', batch_norm=True, inputs='image',
         min_side=16, lowering=True)
register('dsfl_fmnist_cnn', _builder(cnn.DSFLFMNISTCNN), init='torch', batch_norm=True,
         inputs='image', min_side=4, lowering=True)
register('resnet20', _builder(resnet.resnet20), batch_norm=True, inputs='image', lowering=True)
register('resnet32', _builder(resnet.resnet32), batch_norm=True, inputs='image', lowering=True)
register('lenet5', _builder(lenet.LeNet5), inputs='image', min_side=16, lowering=True)
register('resnet_t', _builder(resnet.resnet_t), batch_norm=True, inputs='image', lowering=True)
register('resnet_s', _builder(resnet.resnet_s), batch_norm=True, inputs='image', lowering=True)
register('resnet_m', _builder(resnet.resnet_m), batch_norm=True, inputs='image', lowering=True)
register('resnet_l', _builder(resnet.resnet_l), batch_norm=True, inputs='image', lowering=True)
register('fcn', _builder(fcn.FCN))
register('googlenet', _builder(googlenet.googlenet), batch_norm=True, inputs='image',
         lowering=True)
register('vgg16', _builder(vgg.vgg16), batch_norm=True, inputs='image', lowering=True)
register('resnet34', _builder(resnet_imagenet.resnet34), batch_norm=True, inputs='image',
         lowering=True)
register('resnet50', _builder(resnet_imagenet.resnet50), batch_norm=True, inputs='image',
         lowering=True)
register('vgg11', _builder(vgg.vgg11), inputs='image', lowering=True)
register('blazefl_cnn', _builder(cnn.CNN, features=(32, 64), hidden=512, padding='VALID'),
         inputs='image', min_side=16, lowering=True)
register('imdb_lstm', _builder(text.LSTMClassifier), inputs='tokens')
register('text_dnn', _builder(text.TextDNN), batch_norm=True)
register('char_lstm', _builder(text.LSTMClassifier, embed_dim=8, hidden=256, layers=2),
         inputs='tokens')
register('leaf_cnn', _builder(cnn.CNN, features=(32, 64), hidden=2048, padding='SAME'),
         inputs='image', min_side=4, lowering=True)
# Everything registered above ships with fedjax_kd: neither replaceable nor removable.
_ENTRIES.update({n: dataclasses.replace(e, builtin=True) for n, e in _ENTRIES.items()})


# A model's initialisation runs once a run, so its program is compiled with LLVM's lighter
# optimisation level: several times faster to compile, and on the CPU the same bits as the
# default level (tests/test_models.py compares them). Level 0 is not the same: it leaves
# multiplies and adds uncontracted. Other backends keep their defaults (not measured there).
INIT_COMPILER_OPTIONS = {'xla_backend_optimization_level': 1}


def init_compiler_options(value: Any = None) -> dict[str, Any] | None:
  """``compiler_options=`` for a jit that initialises models from ``value`` (its keys):
  `INIT_COMPILER_OPTIONS` on the CPU; None on other backends, and when ``value`` is traced
  inside another transformation (vmap, eval_shape, jit), where JAX refuses options on the
  inner jit and the outer program decides how it is compiled."""
  if isinstance(value, jax.core.Tracer) or jax.default_backend() != 'cpu':
    return None
  return INIT_COMPILER_OPTIONS


def init_variables(module: nn.Module, key: jax.Array, input_shape: tuple[int, ...],
                   dtype: Any = jnp.float32) -> dict[str, Any]:
  """Initializes a model's variables from a dummy batch of one example.

  Traceable, so `jax.vmap(lambda k: init_variables(m, k, shape))(keys)` gives per-client
  variables.

  Args:
    module: a model from `get_model`.
    key: PRNG key.
    input_shape: shape of one example (without the batch axis).
    dtype: of the dummy batch: float32 model inputs, or int32 for the token models.

  Returns:
    {'params': ...} plus {'batch_stats': ...} for BatchNorm models.
  """
  x = jnp.zeros((1,) + tuple(input_shape), dtype)
  return dict(jax.jit(functools.partial(module.init, train=False),
                     compiler_options=init_compiler_options(key))(key, x))


def count_params(variables: Mapping[str, Any]) -> tuple[int, int]:
  """Counts the numbers in one model's variables.

  Args:
    variables: {'params': ..., 'batch_stats': ...} of one model (not stacked over clients);
      arrays or `jax.ShapeDtypeStruct`s (e.g. from `jax.eval_shape`).

  Returns:
    (trainable, total): the size of 'params', and of all collections (incl. 'batch_stats').
  """
  size = lambda tree: sum(int(math.prod(getattr(a, 'shape', None) or jnp.shape(a)))
                          for a in jax.tree.leaves(tree))
  return size(variables.get('params', {})), size(dict(variables))
