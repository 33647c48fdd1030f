"""Layers shared by the model zoo: a CPU-fast convolution, max pooling and a masked BatchNorm.

The convolution layer `Conv` has the same parameters as `flax.linen.Conv` ('kernel' of shape
[kh, kw, Cin, Cout] and 'bias' of shape [Cout]) and the same 'SAME'/'VALID'/explicit padding
semantics as XLA, but it can lower the convolution in two ways:

* 'xla': `lax.conv_general_dilated` (the fast path on GPU and TPU).
* 'im2col': explicit patches and one matrix product (the fast path on XLA:CPU, where the
  native convolution of small NHWC images is several times slower;
  benchmarks/performance/conv_lowering.py measures both).

The im2col lowering (`conv_im2col`) is tuned for many small clients trained under
`jax.vmap`:

* Patches are built from `kh * kw` shifted (and strided) slices, concatenated on the channel
  axis in (row, column, channel) order, so the kernel reshapes to [kh*kw*Cin, Cout] for free.
* The function has a `jax.custom_vjp`. The forward pass saves only the input and the kernel;
  the backward pass rebuilds the patches, takes dW = P^T g, dP = g W^T and folds dP back to
  the input (col2im) as two fused sums of shifted (interior-padded for strides) pads (columns,
  then rows).
* Forward and backward kernels work on chunks of the batch (about 2 MiB of patches each) so
  that patches stay in the CPU cache, and a `jax.custom_batching.custom_vmap` rule turns a
  `vmap` over clients into a loop over clients instead of one huge batched matrix product.

The im2col lowering supports reverse-mode differentiation (grad, vjp) and vmap, not
forward-mode (jvp) or higher-order derivatives; use lowering='xla' for those.
"""

from __future__ import annotations

import contextvars
import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from fedjax_kd.ops.errors import ParamError

Array = jax.Array
PaddingLike = str | int | Sequence[int] | Sequence[tuple[int, int]]

LOWERINGS = ('auto', 'im2col', 'xla')

# Tuning knobs of the im2col lowering. benchmarks/performance/conv_lowering.py varies them; library
# code should leave them alone. `chunk_bytes` bounds the size of one chunk of patches.
IM2COL_CONFIG: dict[str, Any] = {'chunk_bytes': 2 << 20}


def int_pair(v: int | Sequence[int], name: str) -> tuple[int, int]:
  if isinstance(v, int):
    return (v, v)
  v = tuple(v)
  if len(v) != 2 or not all(isinstance(a, int) for a in v):
    raise ParamError(name, v, 'an int or a pair of ints')
  return (int(v[0]), int(v[1]))


def resolve_padding(
    padding: PaddingLike,
    in_hw: tuple[int, int],
    kernel_hw: tuple[int, int],
    strides: tuple[int, int],
) -> tuple[tuple[int, int], tuple[int, int]]:
  """Explicit (low, high) padding per spatial dim, with XLA's semantics.

  Args:
    padding: 'SAME', 'VALID', an int p (p on every side), a pair of ints (p_h, p_w), or a pair
      of (low, high) pairs.
    in_hw: input height and width.
    kernel_hw: kernel height and width.
    strides: strides along height and width.

  Returns:
    ((low_h, high_h), (low_w, high_w)). 'SAME' gives ceil(n / stride) outputs and puts the odd
    pixel of padding at the high end, like `lax.padtype_to_pads`.
  """
  if isinstance(padding, str):
    p = padding.upper()
    if p == 'VALID':
      return ((0, 0), (0, 0))
    if p == 'SAME':
      pads = []
      for n, k, s in zip(in_hw, kernel_hw, strides):
        out = -(-n // s)
        total = max((out - 1) * s + k - n, 0)
        pads.append((total // 2, total - total // 2))
      return (pads[0], pads[1])
    raise ParamError('padding', padding, ['SAME', 'VALID', 'an int', 'pairs of ints'])
  if isinstance(padding, int):
    pads = ((padding, padding), (padding, padding))
  else:
    items = tuple(padding)
    if len(items) == 2 and all(isinstance(a, int) for a in items):
      pads = ((items[0], items[0]), (items[1], items[1]))
    elif len(items) == 2 and all(len(tuple(a)) == 2 for a in items):
      pads = tuple((int(a[0]), int(a[1])) for a in items)
    else:
      raise ParamError('padding', padding, ['SAME', 'VALID', 'an int', 'pairs of ints'])
  if any(p < 0 for pair in pads for p in pair):
    raise ParamError('padding', padding, 'non-negative padding')
  return pads  # type: ignore[return-value]


def conv_output_hw(
    in_hw: tuple[int, int],
    kernel_hw: tuple[int, int],
    strides: tuple[int, int],
    padding: PaddingLike,
) -> tuple[int, int]:
  """Output height and width of a convolution (may be <= 0 when the input is too small)."""
  pads = resolve_padding(padding, in_hw, kernel_hw, strides)
  return tuple(  # type: ignore[return-value]
      (n + lo + hi - k) // s + 1 if n + lo + hi >= k else 0
      for n, k, s, (lo, hi) in zip(in_hw, kernel_hw, strides, pads))


# ---------------------------------------------------------------------------------------------
# im2col convolution
# ---------------------------------------------------------------------------------------------


def im2col_patches(xp: Array, kh: int, kw: int, oh: int, ow: int, sh: int, sw: int) -> Array:
  """[B, Hp, Wp, C] padded input -> [B, oh, ow, kh*kw*C] patches in (i, j, c) order."""
  cols = [
      xp[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw, :]
      for i in range(kh) for j in range(kw)
  ]
  return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


def _col2im(dp: Array, kh: int, kw: int, hp: int, wp: int, sh: int, sw: int) -> Array:
  """Adjoint of `im2col_patches`: [B, oh, ow, kh*kw*C] -> [B, hp, wp, C].

  Two passes of shifted (interior-padded for strides) pads: first the kw column taps of each
  kernel row are summed into a [B, oh, wp, C] row image, then the kh row images are summed
  into the output. Each output element reads kh + kw taps instead of kh * kw, which is about
  a third less time for a 5x5 kernel on XLA:CPU (benchmarks/performance/conv_lowering.py).
  """
  b, oh, ow, _ = dp.shape
  c = dp.shape[-1] // (kh * kw)
  dp = dp.reshape(b, oh, ow, kh, kw, c)
  zero = jnp.zeros((), dp.dtype)
  out = None
  for i in range(kh):
    row = None
    for j in range(kw):
      t = jax.lax.pad(dp[:, :, :, i, j, :], zero,
                      ((0, 0, 0), (0, 0, 0), (j, wp - j - (ow - 1) * sw - 1, sw - 1), (0, 0, 0)))
      row = t if row is None else row + t
    t = jax.lax.pad(row, zero,
                    ((0, 0, 0), (i, hp - i - (oh - 1) * sh - 1, sh - 1), (0, 0, 0), (0, 0, 0)))
    out = t if out is None else out + t
  return out


def _chunking(batch: int, bytes_per_example: int, chunk_bytes: int) -> tuple[int, int]:
  """(number of chunks, examples per chunk) so that a chunk has about chunk_bytes of patches."""
  per = max(1, min(batch, chunk_bytes // max(bytes_per_example, 1)))
  n = -(-batch // per)
  return n, -(-batch // n)


def _split(a: Array, n: int, per: int) -> Array:
  pad = n * per - a.shape[0]
  if pad:
    a = jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1))
  return a.reshape((n, per) + a.shape[1:])


def _map_rule(kernel: Callable[..., Any], n_out: int, fold_fwd: bool):
  """custom_vmap rule: loop over the vmapped axis (clients) instead of batching it.

  With `fold_fwd`, a vmapped input with an unbatched kernel is folded into the batch axis.
  """

  def rule(axis_size, in_batched, *args):
    del axis_size
    if fold_fwd and in_batched[0] and not any(in_batched[1:]):
      x = args[0]
      y = kernel(x.reshape((-1,) + x.shape[2:]), *args[1:])
      return y.reshape(x.shape[:2] + y.shape[1:]), True
    batched = tuple(a for a, b in zip(args, in_batched) if b)

    def body(bargs):
      it = iter(bargs)
      return kernel(*[next(it) if b else a for a, b in zip(args, in_batched)])

    out = jax.lax.map(body, batched)
    return out, ((True,) * n_out if n_out > 1 else True)

  return rule


@functools.lru_cache(maxsize=None)
def _im2col_fn(strides: tuple[int, int], pads: tuple[tuple[int, int], tuple[int, int]],
               chunk_bytes: int) -> Callable[[Array, Array], Array]:
  """Builds the differentiable, vmappable conv for one (strides, padding, chunk) config."""
  sh, sw = strides
  (ph0, ph1), (pw0, pw1) = pads

  def geometry(x, w):
    kh, kw, c, o = w.shape
    b, h, wd, _ = x.shape
    hp, wp = h + ph0 + ph1, wd + pw0 + pw1
    oh, ow = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    return b, h, wd, c, kh, kw, o, hp, wp, oh, ow

  def fwd_kernel(x, w):
    b, h, wd, c, kh, kw, o, hp, wp, oh, ow = geometry(x, w)
    wm = w.reshape(kh * kw * c, o)

    def one(xc):
      xp = jnp.pad(xc, ((0, 0), (ph0, ph1), (pw0, pw1), (0, 0)))
      p = im2col_patches(xp, kh, kw, oh, ow, sh, sw)
      return jnp.einsum('bhwk,ko->bhwo', p, wm, preferred_element_type=p.dtype)

    n, per = _chunking(b, oh * ow * kh * kw * c * x.dtype.itemsize, chunk_bytes)
    if n == 1:
      return one(x)
    y = jax.lax.map(one, _split(x, n, per))
    return y.reshape((n * per,) + y.shape[2:])[:b]

  def bwd_kernel(x, w, g):
    b, h, wd, c, kh, kw, o, hp, wp, oh, ow = geometry(x, w)
    wm = w.reshape(kh * kw * c, o)

    def one(dw, xg):
      xc, gc = xg
      xp = jnp.pad(xc, ((0, 0), (ph0, ph1), (pw0, pw1), (0, 0)))
      p = im2col_patches(xp, kh, kw, oh, ow, sh, sw)
      dw = dw + jnp.einsum('bhwk,bhwo->ko', p, gc, preferred_element_type=dw.dtype)
      dp = jnp.einsum('bhwo,ko->bhwk', gc, wm, preferred_element_type=gc.dtype)
      dxp = _col2im(dp, kh, kw, hp, wp, sh, sw)
      return dw, dxp[:, ph0:ph0 + h, pw0:pw0 + wd, :]

    n, per = _chunking(b, oh * ow * kh * kw * c * x.dtype.itemsize, chunk_bytes)
    dw0 = jnp.zeros(wm.shape, jnp.result_type(x.dtype, g.dtype))
    if n == 1:
      dw, dx = one(dw0, (x, g))
    else:
      dw, dx = jax.lax.scan(one, dw0, (_split(x, n, per), _split(g, n, per)))
      dx = dx.reshape((n * per,) + dx.shape[2:])[:b]
    return dx.astype(x.dtype), dw.reshape(w.shape).astype(w.dtype)

  fwd_k = custom_vmap(lambda x, w: fwd_kernel(x, w))
  fwd_k.def_vmap(_map_rule(fwd_k, 1, fold_fwd=True))
  bwd_k = custom_vmap(lambda x, w, g: bwd_kernel(x, w, g))
  bwd_k.def_vmap(_map_rule(bwd_k, 2, fold_fwd=False))

  @jax.custom_vjp
  def conv(x, w):
    return fwd_k(x, w)

  def conv_fwd(x, w):
    return fwd_k(x, w), (x, w)

  def conv_bwd(res, g):
    x, w = res
    dx, dw = bwd_k(x, w, g)
    return dx, dw

  conv.defvjp(conv_fwd, conv_bwd)
  return conv


def conv_im2col(x: Array, kernel: Array, strides: int | Sequence[int] = 1,
                padding: PaddingLike = 'SAME') -> Array:
  """2-D convolution (cross-correlation, NHWC x HWIO) lowered to im2col matrix products.

  Numerically the same function as `lax.conv_general_dilated(x, kernel, strides, padding,
  dimension_numbers=('NHWC', 'HWIO', 'NHWC'))`.

  Args:
    x: input [B, H, W, Cin].
    kernel: [kh, kw, Cin, Cout].
    strides: int or (sh, sw).
    padding: 'SAME', 'VALID' or explicit padding (see `resolve_padding`).

  Returns:
    [B, Ho, Wo, Cout].
  """
  st = int_pair(strides, 'strides')
  kh, kw = kernel.shape[:2]
  if x.ndim != 4 or kernel.ndim != 4 or x.shape[-1] != kernel.shape[2]:
    raise ValueError(f'expected x [B, H, W, C] and kernel [kh, kw, C, O], got {x.shape} and '
                     f'{kernel.shape}')
  pads = resolve_padding(padding, x.shape[1:3], (kh, kw), st)
  if min(conv_output_hw(x.shape[1:3], (kh, kw), st, pads)) < 1:
    raise ValueError(f'input {x.shape[1:3]} is too small for a {kh}x{kw} kernel with padding '
                     f'{pads}')
  fn = _im2col_fn(st, pads, int(IM2COL_CONFIG['chunk_bytes']))
  return fn(x, kernel)


def conv_xla(x: Array, kernel: Array, strides: int | Sequence[int] = 1,
             padding: PaddingLike = 'SAME') -> Array:
  """The same convolution through `lax.conv_general_dilated` (fast on GPU/TPU)."""
  st = int_pair(strides, 'strides')
  pads = resolve_padding(padding, x.shape[1:3], kernel.shape[:2], st)
  return jax.lax.conv_general_dilated(x, kernel, st, pads,
                                      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def resolve_lowering(lowering: str) -> str:
  """'auto' -> 'im2col' on CPU, 'xla' on GPU/TPU; other values are checked and returned."""
  if lowering not in LOWERINGS:
    raise ParamError('lowering', lowering, LOWERINGS)
  if lowering == 'auto':
    return 'im2col' if jax.default_backend() == 'cpu' else 'xla'
  return lowering


class Conv(nn.Module):
  """2-D convolution with the parameters of `flax.linen.Conv` and a selectable lowering.

  Attributes:
    features: number of output channels.
    kernel_size: int or (kh, kw).
    strides: int or (sh, sw).
    padding: 'SAME', 'VALID', an int, (p_h, p_w) or ((lo_h, hi_h), (lo_w, hi_w)).
    use_bias: whether to add a bias.
    lowering: 'auto' (im2col on CPU, XLA's convolution elsewhere), 'im2col' or 'xla'.
    kernel_init: initializer of the [kh, kw, Cin, Cout] kernel.
    bias_init: initializer of the bias.
    param_dtype: dtype of the parameters.
  """
  features: int
  kernel_size: int | Sequence[int]
  strides: int | Sequence[int] = 1
  padding: PaddingLike = 'SAME'
  use_bias: bool = True
  lowering: str = 'auto'
  kernel_init: Callable[..., Array] = nn.initializers.lecun_normal()
  bias_init: Callable[..., Array] = nn.initializers.zeros_init()
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """Applies the convolution.

    Args:
      x: [..., H, W, Cin] with any number of leading batch dims (at least one).

    Returns:
      [..., Ho, Wo, features].
    """
    kh, kw = int_pair(self.kernel_size, 'kernel_size')
    lowering = resolve_lowering(self.lowering)
    kernel = self.param('kernel', self.kernel_init, (kh, kw, x.shape[-1], self.features),
                        self.param_dtype)
    lead = x.shape[:-3]
    x4 = x.reshape((math.prod(lead),) + x.shape[-3:])
    x4, kernel = nn.dtypes.promote_dtype(x4, kernel)
    fn = conv_im2col if lowering == 'im2col' else conv_xla
    y = fn(x4, kernel, self.strides, self.padding)
    if self.use_bias:
      bias = self.param('bias', self.bias_init, (self.features,), self.param_dtype)
      y = y + bias.astype(y.dtype)
    return y.reshape(lead + y.shape[1:])


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------


def _pool_taps(x: Array) -> list[Array]:
  b, h, w, c = x.shape
  x6 = x.reshape(b, h // 2, 2, w // 2, 2, c)
  return [x6[:, :, a, :, bb, :] for a in (0, 1) for bb in (0, 1)]


@jax.custom_vjp
def _max_pool2_even(x: Array) -> Array:
  b, h, w, c = x.shape
  return x.reshape(b, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def _max_pool2_fwd(x):
  taps = _pool_taps(x)
  y = jnp.maximum(jnp.maximum(taps[0], taps[1]), jnp.maximum(taps[2], taps[3]))
  # Index (0..3, row-major) of the first maximum of each window, saved for the backward pass.
  # Routing the gradient by a saved index, not by `x == y` in the backward pass, stays right
  # when XLA recomputes x in another fusion with last-bit differences (it does, e.g. after
  # BatchNorm's rsqrt), and needs no reductions (slow on XLA:CPU).
  idx = jnp.where(taps[0] == y, 0, jnp.where(taps[1] == y, 1, jnp.where(taps[2] == y, 2, 3)))
  return y, idx.astype(jnp.int8)


def _max_pool2_bwd(idx, g):
  zero = jnp.zeros((), g.dtype)
  outs = [jnp.where(idx == k, g, zero) for k in range(4)]
  dx6 = jnp.stack([jnp.stack(outs[0:2], axis=3), jnp.stack(outs[2:4], axis=3)], axis=2)
  b, h2, _, w2, _, c = dx6.shape
  return (dx6.reshape(b, 2 * h2, 2 * w2, c),)


_max_pool2_even.defvjp(_max_pool2_fwd, _max_pool2_bwd)


def max_pool2(x: Array) -> Array:
  """2x2 max pooling with stride 2 and VALID padding (odd trailing rows/columns are dropped).

  Same values as `flax.linen.max_pool(x, (2, 2), (2, 2))`, computed with a reshape and a max,
  which is much faster on CPU than `lax.reduce_window`.

  Args:
    x: [..., H, W, C] with at least one leading batch dim.

  Returns:
    [..., H // 2, W // 2, C].
  """
  lead = x.shape[:-3]
  h, w, c = x.shape[-3:]
  x4 = x.reshape((math.prod(lead),) + x.shape[-3:])
  x4 = x4[:, :2 * (h // 2), :2 * (w // 2), :]
  y = _max_pool2_even(x4)
  return y.reshape(lead + y.shape[1:])


# ---------------------------------------------------------------------------------------------
# BatchNorm with a sample mask
# ---------------------------------------------------------------------------------------------


def expand_mask(mask: Array | None, x: Array) -> Array | None:
  """[B] sample mask -> bool mask broadcast to x.shape (None stays None)."""
  if mask is None:
    return None
  m = jnp.asarray(mask).reshape((x.shape[0],) + (1,) * (x.ndim - 1)) != 0
  return jnp.broadcast_to(m, x.shape)


def _bn_forward(x: Array, w: Array | None, scale: Array, bias: Array, epsilon: float):
  """Batch statistics and the normalized x (train mode); ``w`` [B] weighs the rows or None."""
  axes = tuple(range(x.ndim - 1))
  xf = x.astype(jnp.float32)
  if w is None:
    count = None
    mean = xf.mean(axes)
    var = jnp.square(xf - mean).mean(axes)
  else:
    wb = w.reshape((x.shape[0],) + (1,) * (x.ndim - 1))
    count = jnp.sum(w) * (math.prod(x.shape[1:-1]))
    mean = jnp.sum(xf * wb, axes) / count
    var = jnp.square(xf - mean)
    var = jnp.sum(var * wb, axes) / count
  mul = scale * jax.lax.rsqrt(var + epsilon)
  y = ((x - mean) * mul + bias).astype(x.dtype)
  return y, mean, var, count


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _bn_train(x: Array, w: Array | None, scale: Array, bias: Array, epsilon: float):
  """``(y, batch mean, batch variance)`` of BatchNorm in train mode, with a fused backward.

  Autodiff of the two-pass statistics reads and writes the activation about ten times; the
  closed form below (the usual BatchNorm gradient, with row weights) takes two reductions and
  one elementwise pass. Rows of weight 0 are normalized like the others but do not enter the
  statistics, so their gradient reaches x only through ``(x - mean) * rstd``.
  """
  y, mean, var, _ = _bn_forward(x, w, scale, bias, epsilon)
  return y, mean, var


def _bn_train_fwd(x, w, scale, bias, epsilon):
  y, mean, var, count = _bn_forward(x, w, scale, bias, epsilon)
  return (y, mean, var), (x, w, scale, mean, var, count)


def _bn_train_bwd(epsilon, res, cts):
  x, w, scale, mean, var, count = res
  gy, gmean, gvar = cts
  axes = tuple(range(x.ndim - 1))
  if count is None:
    count = jnp.asarray(math.prod(x.shape[:-1]), jnp.float32)
  rstd = jax.lax.rsqrt(var + epsilon)
  g = gy.astype(jnp.float32)
  xc = x.astype(jnp.float32) - mean
  dbias = jnp.sum(g, axes)
  gxc = jnp.sum(g * xc, axes)
  dscale = gxc * rstd
  # d/dmean and d/dvar of the loss, through every row's (x - mean) * rstd, plus the
  # statistics' own cotangents (zero unless the caller differentiates the running averages).
  dmean = -rstd * scale * dbias + gmean
  dvar = -0.5 * rstd ** 3 * scale * gxc + gvar
  stat = dmean / count + (2.0 / count) * dvar * xc
  if w is not None:
    stat = stat * w.reshape((x.shape[0],) + (1,) * (x.ndim - 1))
  dx = g * (scale * rstd) + stat
  dw = None if w is None else jnp.zeros_like(w)
  return dx.astype(x.dtype), dw, dscale, dbias


_bn_train.defvjp(_bn_train_fwd, _bn_train_bwd)


class BatchNorm(nn.Module):
  """BatchNorm over all but the last axis, with statistics over the valid samples only.

  Same variables and update rule as `flax.linen.BatchNorm` (params 'scale'/'bias',
  batch_stats 'mean'/'var'; running = momentum * running + (1 - momentum) * batch, with the
  biased batch variance). In train mode with a mask, the batch statistics use only the rows
  where mask != 0, exactly as `nn.BatchNorm(...)(x, mask=...)` with the mask broadcast to x;
  if no row is valid, the running statistics are left unchanged instead of becoming NaN.
  The running statistics are updated only when 'batch_stats' is mutable.

  A model wrapped by `WithOptions` can replace every BatchNorm's momentum and epsilon at once
  (`model.bn_momentum`, `model.bn_epsilon`): inside its call the wrapper's values win over
  these attributes.

  Attributes:
    momentum: running-average decay (flax convention: running = momentum * running + (1 -
      momentum) * batch; PyTorch's default momentum 0.1 is 0.9 here, Keras' default is 0.99).
    epsilon: added to the variance.
  """
  momentum: float = 0.9
  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: Array, train: bool = False, mask: Array | None = None) -> Array:
    """Normalizes x.

    Args:
      x: [B, ..., C].
      train: batch statistics (and a running-average update) if True, else running averages.
      mask: optional [B] vector, nonzero (or True) for valid samples. Ignored if not train.

    Returns:
      The normalized x, in x's dtype.
    """
    c = x.shape[-1]
    momentum, epsilon = self.momentum, self.epsilon
    override = _BN_OPTIONS.get()
    if override is not None:
      momentum = momentum if override[0] is None else override[0]
      epsilon = epsilon if override[1] is None else override[1]
    scale = self.param('scale', nn.initializers.ones_init(), (c,), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros_init(), (c,), jnp.float32)
    ra_mean = self.variable('batch_stats', 'mean', lambda: jnp.zeros((c,), jnp.float32))
    ra_var = self.variable('batch_stats', 'var', lambda: jnp.ones((c,), jnp.float32))
    if not train:
      mean, var = ra_mean.value, ra_var.value
      mul = scale * jax.lax.rsqrt(var + epsilon)
      return ((x - mean) * mul + bias).astype(x.dtype)
    if mask is None:
      any_valid, w = None, None
    else:
      valid = jnp.asarray(mask).reshape(-1) != 0
      any_valid = jnp.any(valid)
      valid = jnp.where(any_valid, valid, True)  # no valid row: finite stats, not kept
      w = valid.astype(jnp.float32)
    y, mean, var = _bn_train(x, w, scale, bias, epsilon)
    if not self.is_initializing() and self.is_mutable_collection('batch_stats'):
      new_mean = momentum * ra_mean.value + (1.0 - momentum) * mean
      new_var = momentum * ra_var.value + (1.0 - momentum) * var
      if any_valid is not None:
        new_mean = jnp.where(any_valid, new_mean, ra_mean.value)
        new_var = jnp.where(any_valid, new_var, ra_var.value)
      ra_mean.value, ra_var.value = new_mean, new_var
    return y


# ---------------------------------------------------------------------------------------------
# Helpers for the models
# ---------------------------------------------------------------------------------------------


def scaled(n: int, width: float) -> int:
  """A hidden size scaled by a width multiplier: round(n * width), at least 1."""
  return max(1, int(math.floor(n * width + 0.5)))


def as_image(x: Array) -> Array:
  """[B, H, W] -> [B, H, W, 1]; [B, H, W, C] is returned as is."""
  if x.ndim == 3:
    return x[..., None]
  if x.ndim != 4:
    raise ValueError(f'expected images [B, H, W] or [B, H, W, C], got shape {x.shape}')
  return x


# ---------------------------------------------------------------------------------------------
# Initializer families and BatchNorm options for a whole model
# ---------------------------------------------------------------------------------------------

# Each family redraws every Dense/Conv kernel (and bias) of a model from the rule of one
# framework, with fan_in = prod(kernel.shape[:-1]) (kh * kw * Cin for a convolution, the input
# size for a Dense layer) and fan_out = Cout * kh * kw:
#
# * 'torch': PyTorch's nn.Linear / nn.Conv2d defaults: kaiming_uniform(a=sqrt(5)), i.e. kernel
#   ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
# * 'keras': Keras' Dense / Conv2D defaults: Glorot uniform kernel
#   U(-sqrt(6 / (fan_in + fan_out)), +...), zero bias.
# * 'flax': flax.linen's defaults: LeCun normal kernel (truncated, variance 1 / fan_in), zero bias.
# * 'he': He et al. 2015, normal with variance 2 / fan_in, zero bias.
#
# 'module' keeps what the model module itself draws (see each model's docstring).
INIT_FAMILIES = ('module', 'torch', 'keras', 'flax', 'he')

# (momentum, epsilon) that `WithOptions` hands to every BatchNorm inside its call; None: keep.
_BN_OPTIONS: contextvars.ContextVar[tuple[float | None, float | None] | None] = (
    contextvars.ContextVar('fedjax_kd_bn_options', default=None))


def _family_kernel(family: str, key: Array, shape: tuple[int, ...], dtype) -> Array:
  fan_in = math.prod(shape[:-1])
  fan_out = shape[-1] * math.prod(shape[:-2])
  if family == 'torch':
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  if family == 'keras':
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  if family == 'flax':
    return nn.initializers.lecun_normal()(key, shape, dtype)
  return nn.initializers.he_normal()(key, shape, dtype)


def reinit(params: Any, family: str, key: Array) -> Any:
  """Redraws every kernel (and its bias) of a params tree from an initializer family.

  A layer is a dict holding a 'kernel' of rank >= 2 (Dense [in, out], Conv [kh, kw, Cin,
  Cout]); its 'bias', if any, is redrawn too (uniform in +-1/sqrt(fan_in) for 'torch', zeros
  otherwise). Everything else (BatchNorm scale and bias) is left as it is. Traceable.

  Args:
    params: the 'params' collection of a model.
    family: one of `INIT_FAMILIES`; 'module' returns `params` unchanged.
    key: PRNG key; each layer draws from its own fold of it (by its position in sorted path
      order), so the result does not depend on the other layers.

  Returns:
    The params tree with the same structure, shapes and dtypes.
  """
  if family not in INIT_FAMILIES:
    raise ParamError('family', family, INIT_FAMILIES)
  if family == 'module':
    return params
  counter = [0]

  def walk(node):
    if not isinstance(node, dict) and not hasattr(node, 'items'):
      return node
    node = dict(node)
    kernel = node.get('kernel')
    if kernel is not None and not hasattr(kernel, 'items') and kernel.ndim >= 2:
      k = jax.random.fold_in(key, counter[0])
      counter[0] += 1
      k_w, k_b = jax.random.split(k)
      node['kernel'] = _family_kernel(family, k_w, kernel.shape, kernel.dtype)
      if 'bias' in node:
        bias = node['bias']
        if family == 'torch':
          bound = 1.0 / math.sqrt(math.prod(kernel.shape[:-1]))
          node['bias'] = jax.random.uniform(k_b, bias.shape, bias.dtype, -bound, bound)
        else:
          node['bias'] = jnp.zeros_like(bias)
      return node
    return {name: walk(node[name]) for name in sorted(node)}

  return walk(params)


class WithOptions(nn.Module):
  """A model with another initializer family and BatchNorm options; the same variables.

  The wrapped model keeps its own variable names (the wrapper shares its scope), so its
  parameters, checkpoints and `count_params` are unchanged; `init` draws the model's
  variables and then redraws its Dense/Conv layers with `reinit(init_family)`, and every
  `BatchNorm` inside a call uses `bn_momentum` / `bn_epsilon` where they are not None.

  Attributes:
    model: the model module.
    init_family: one of `INIT_FAMILIES`.
    bn_momentum: BatchNorm running-average decay for every BatchNorm (None: the model's own).
    bn_epsilon: BatchNorm epsilon for every BatchNorm (None: the model's own).
  """
  model: nn.Module
  init_family: str = 'module'
  bn_momentum: float | None = None
  bn_epsilon: float | None = None

  def setup(self):
    nn.share_scope(self, self.model)

  def __call__(self, *args, **kwargs) -> Array:
    """The wrapped model's `__call__` (same arguments), with the BatchNorm options in force."""
    token = _BN_OPTIONS.set((self.bn_momentum, self.bn_epsilon))
    try:
      return self.model(*args, **kwargs)
    finally:
      _BN_OPTIONS.reset(token)

  def init(self, rngs, *args, **kwargs):  # pylint: disable=arguments-differ
    """`flax.linen.Module.init`, then the Dense/Conv layers redrawn from `init_family`."""
    variables = super().init(rngs, *args, **kwargs)
    if self.init_family == 'module':
      return variables
    key = rngs['params'] if isinstance(rngs, dict) else rngs
    variables = dict(variables)
    variables['params'] = reinit(variables['params'], self.init_family,
                                 jax.random.fold_in(key, 0x1F))
    return variables
