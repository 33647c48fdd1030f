"""Client-steps per second of the `cnn` model under each convolution lowering (XLA:CPU).

Workload (the CPU calibration this project started from, now with the real model):
K clients, each with its own `cnn` parameters (28x28x1 inputs, 10 classes), 10 SGD steps
(lr 0.1, batch 50) under `lax.scan`, run as `jit(vmap(train))` over clients. Reported:
K * 10 / seconds per call (median and best of the repeats, after one warm-up call).

    python benchmarks/performance/conv_lowering.py --k 10 50 --lowerings im2col xla

Lowerings: 'im2col' (layers.conv_im2col, the 'auto' choice on CPU), 'xla'
(lax.conv_general_dilated), and 'shift' (the plain-autodiff shifted-slice im2col of the
calibration, for reference).

Results on the 2-core AMD EPYC VM (32 MiB L3; jax 0.10.2, XLA:CPU with YNNPACK dots), in
client-steps/s (wall clock; median of 8 calls, best in brackets). The host is noisy: the same
run varies by +-20% from one minute to the next, so every variant was run at least twice,
interleaved with its baseline, and the table gives the typical range.

Final (this script, the real `cnn` module):

| lowering | K=10 | K=50 |
|---|---|---|
| 'im2col' (final) | 105-133 (115-139) | 119-120 (126-128) |
| 'shift' (calibration lowering, plain autodiff) | 72-74 (74-80) | 65-69 (69-72) |
| 'xla' (lax.conv_general_dilated) | 4.2 (4.4) | - |
| PyTorch 2.13 loop over clients (the same workload, same VM) | 103 | 105 |

ResNet-20 (32x32x3, batch 32, K=4, BatchNorm with mask): 'im2col' 8.6 client-steps/s,
'xla' 0.4.

Variants tried on the way (prototypes with the same workload, same noise caveat):

| variant | K=10 |
|---|---|
| 'shift' baseline: 25 slices + concat + einsum, autodiff | 70-88 (78-91) |
| custom_vjp of the patch extraction (col2im as a sum of 25 shifted pads) | 77-86 (84-89) |
| full custom_vjp conv, patches saved for dW | 69-72 (75-83) |
| patches by a broadcast-reshape-slice "tile trick" (one fusion, no concat) | 10-62 |
| backward dx as a transposed conv (im2col of g, flipped kernel) | 70 (73) |
| per-kernel-row GEMMs; flattened "wide row" contiguous slices | 38-81 |
| pool before ReLU+bias; max of 4 strided slices | 24-64 |
| XLA_FLAGS ynn_fusion_type= / =individual_dot (YNNPACK off) | 72-87, no clear change |
| chunked kernels + custom_vmap loop over clients, 4 MiB chunks | 80-108 (96-121) |
| + max-pool backward by select instead of max's autodiff | 105-124 (125-135) |
| + col2im split in a column pass and a row pass (2*(kh+kw) terms) | 82-96 (92-105) |
| + col2im as one 25-term sum of pads (final) | 106-123 (119-130) |
| chunks of 1 / 2 / 6 / 8 MiB instead of 4 | 80-104 / 68-95 / 95-101 / 49-92 |
| skipping the unused dx of the first conv | no change (XLA removes it) |

What mattered (from XLA profiles): (1) XLA:CPU materialises every shifted slice and then the
concatenation, and with K = 10 the patch matrices of all clients (157 MB for conv2) fall out
of the 32 MiB L3 cache; a loop over clients and over ~4 MiB batch chunks keeps them in
cache, and rebuilding the patches in the backward pass is cheaper than saving them. (2) The
autodiff of max-pool (and the "tile trick" col2im) become reductions that XLA:CPU hands to
YNNPACK, which runs them slowly; a select-based pool gradient avoids them. (3) A pool
gradient that compares x == max(x) in the backward pass gave wrong gradients under jit:
XLA recomputes x (after BatchNorm) in another fusion with last-bit differences. The final
`max_pool2` saves the argmax index in the forward pass instead.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd.models import cnn, layers


def _shift_conv(x, kernel, strides=1, padding='SAME'):
  """The calibration's lowering: shifted slices + concat + einsum, plain autodiff."""
  st = layers.int_pair(strides, 'strides')
  kh, kw, c, o = kernel.shape
  (ph0, ph1), (pw0, pw1) = layers.resolve_padding(padding, x.shape[1:3], (kh, kw), st)
  xp = jnp.pad(x, ((0, 0), (ph0, ph1), (pw0, pw1), (0, 0)))
  oh, ow = layers.conv_output_hw(x.shape[1:3], (kh, kw), st, padding)
  p = layers.im2col_patches(xp, kh, kw, oh, ow, *st)
  return jnp.einsum('bhwk,ko->bhwo', p, kernel.reshape(kh * kw * c, o))


@contextlib.contextmanager
def _lowering(name: str) -> Iterator[str]:
  """Yields the Conv lowering to use; 'shift' temporarily swaps the im2col function."""
  if name != 'shift':
    yield name
    return
  saved = layers.conv_im2col
  layers.conv_im2col = _shift_conv
  try:
    yield 'im2col'
  finally:
    layers.conv_im2col = saved


def measure(lowering: str, k: int, steps: int = 10, batch: int = 50, reps: int = 8,
            seed: int = 0) -> tuple[float, float, float]:
  """Client-steps/s (median, best) of jit(vmap(train)) for one lowering.

  Args:
    lowering: 'im2col', 'xla' or 'shift'.
    k: number of clients.
    steps: SGD steps per client (under lax.scan).
    batch: batch size.
    reps: timed calls after the warm-up call.
    seed: data/parameter seed.

  Returns:
    (median, best) client-steps per wall-clock second, and client-steps per CPU second
    (process time of all threads, median; less sensitive to a noisy host).
  """
  with _lowering(lowering) as low:
    model = cnn.CNN(num_classes=10, lowering=low)
    tx = optax.sgd(0.1)
    rng = np.random.default_rng(seed)
    xs = jnp.asarray(rng.random((k, steps, batch, 28, 28, 1), np.float32))
    ys = jnp.asarray(rng.integers(0, 10, (k, steps, batch)))
    keys = jax.random.split(jax.random.PRNGKey(seed), k)
    params = jax.vmap(lambda key: model.init(key, xs[0, 0])['params'])(keys)
    opt = jax.vmap(tx.init)(params)

    def loss(p, x, y):
      logits = model.apply({'params': p}, x, train=True)
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def train(p, o, x, y):
      def body(carry, batch_xy):
        p, o = carry
        g = jax.grad(loss)(p, *batch_xy)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), None
      return jax.lax.scan(body, (p, o), (x, y))[0]

    fn = jax.jit(jax.vmap(train))
    jax.block_until_ready(fn(params, opt, xs, ys))
    times, cpu = [], []
    for _ in range(reps):
      t, c = time.perf_counter(), time.process_time()
      jax.block_until_ready(fn(params, opt, xs, ys))
      times.append(time.perf_counter() - t)
      cpu.append(time.process_time() - c)
  work = k * steps
  return work / statistics.median(times), work / min(times), work / statistics.median(cpu)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--k', type=int, nargs='+', default=[10, 50])
  parser.add_argument('--lowerings', nargs='+', default=['im2col', 'shift', 'xla'],
                      choices=['im2col', 'shift', 'xla'])
  parser.add_argument('--reps', type=int, default=8)
  parser.add_argument('--chunk-bytes', type=int, default=None,
                      help='override layers.IM2COL_CONFIG["chunk_bytes"]')
  parser.add_argument('--xla-max-k', type=int, default=10,
                      help="skip 'xla' above this K (it runs ~5 client-steps/s)")
  args = parser.parse_args()
  if args.chunk_bytes:
    layers.IM2COL_CONFIG['chunk_bytes'] = args.chunk_bytes
  print(f'backend={jax.default_backend()} devices={jax.devices()}')
  for k in args.k:
    for low in args.lowerings:
      if low == 'xla' and k > args.xla_max_k:
        continue
      reps = 2 if low == 'xla' else args.reps
      med, best, per_cpu = measure(low, k, reps=reps)
      print(f'{low:8s} K={k:3d}  client-steps/s median {med:7.1f}  best {best:7.1f}  '
            f'per CPU-second {per_cpu:7.1f}', flush=True)


if __name__ == '__main__':
  main()
