r"""Does recomputing activations (``jax.checkpoint``, "remat") pay? XLA's memory figure and the
time of a training step, with and without it.

  python benchmarks/performance/remat.py [--clients=2] [--batch=100] [--repeats=3] [--out=F.json]
  python benchmarks/performance/remat.py --from_json=benchmarks/results/remat_cpu.json      # the table again

Two programs, each compiled with and without remat on the device JAX picks (the CPU here; a GPU
in ``benchmarks/gpu_session.sh``'s ``remat`` part):

* ``resnet20``: the engine's own ResNet-20 (``fedjax_kd.models.resnet``), one SGD step of
  ``--clients`` clients at once (vmapped, as the engine trains a cohort) on batches of
  ``--batch`` 32x32x3 images. Remat wraps each of its nine basic blocks in
  ``flax.linen.remat`` (``CifarResNet(block=...)``: the same variables, the same numbers), so
  the backward pass keeps the blocks' inputs and recomputes what is inside them.
* ``mlp_unrolled`` / ``mlp_scan``: the control. Twenty ``tanh(x @ W)`` layers (4096 x 512)
  in four checkpointed blocks of five, written out one after the other, and the same blocks as
  the body of a ``lax.scan``.

The memory is ``compiled.memory_analysis()``: temporaries + arguments + outputs - aliased (a
compiled program's figure: it does not vary between runs). The time is the median of
``--repeats`` calls of the compiled step, with and without remat alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _figure(compiled) -> int:
  m = compiled.memory_analysis()
  return int(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
             - m.alias_size_in_bytes)


def resnet20_step(clients: int, batch: int, remat: bool):
  """The vmapped SGD step of ResNet-20 over ``clients`` and its arguments."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.models import resnet  # pylint: disable=g-import-not-at-top
  block = nn.remat(resnet.BasicBlock, static_argnums=(2,)) if remat else resnet.BasicBlock
  model = resnet.CifarResNet(num_classes=10, blocks_per_stage=3, block=block)
  x = jnp.zeros((clients, batch, 32, 32, 3))
  y = jnp.zeros((clients, batch), jnp.int32)
  keys = jax.random.split(jax.random.PRNGKey(0), clients)
  v = jax.vmap(lambda k: model.init(k, x[0, :1], train=False))(keys)

  def loss(params, stats, x, y):
    out, upd = model.apply({'params': params, 'batch_stats': stats}, x, train=True,
                           mutable=['batch_stats'])
    return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), upd

  def step(v, x, y):
    (_, upd), g = jax.value_and_grad(loss, has_aux=True)(v['params'], v['batch_stats'], x, y)
    return {'params': jax.tree.map(lambda p, d: p - 0.1 * d, v['params'], g), **upd}

  return jax.jit(jax.vmap(step), donate_argnums=0), (v, x, y)


def mlp_step(scan: bool, remat: bool):
  """The gradient of the 20-layer tanh MLP, unrolled or scanned, and its arguments."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def block(ws, x):
    for i in range(ws.shape[0]):
      x = jnp.tanh(x @ ws[i])
    return x

  blk = jax.checkpoint(block) if remat else block

  def f(w, x):
    if scan:
      return jax.lax.scan(lambda x, ws: (blk(ws, x), None), x, w)[0].sum()
    for b in range(w.shape[0]):
      x = blk(w[b], x)
    return x.sum()

  w = jnp.full((4, 5, 512, 512), 0.01)
  return jax.jit(jax.grad(f)), (w, jnp.ones((4096, 512)))


def measure(make, repeats: int) -> dict:
  """Both sides of one program: XLA's figure and the median time, remat on and off."""
  import jax  # pylint: disable=g-import-not-at-top
  out, progs = {}, {}
  for remat in (False, True):
    fn, args = make(remat)
    compiled = fn.lower(*args).compile()
    progs[remat] = (compiled, args)
    out['remat' if remat else 'plain'] = {'figure': _figure(compiled), 'times': []}
  for _ in range(repeats + 1):   # the first call of each warms up; then alternate
    for remat, (compiled, args) in progs.items():
      args = jax.tree.map(lambda a: a.copy(), args)   # the step donates its states
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      out['remat' if remat else 'plain']['times'].append(time.perf_counter() - t0)
  for side in out.values():
    side['times'] = side['times'][1:]
    side['median_s'] = statistics.median(side['times'])
  return out


def table(doc: dict) -> str:
  mib = 1 << 20
  rows = [f'{doc["device"]}, {doc["clients"]} clients of batch {doc["batch"]} (ResNet-20), '
          f'median of {doc["repeats"]}',
          '', '| program | plain: memory | remat: memory | memory, remat / plain | '
          'time, remat / plain |', '|---|---|---|---|---|']
  for name, r in doc['programs'].items():
    p, m = r['plain'], r['remat']
    rows.append(f'| {name} | {p["figure"] / mib:.0f} MiB | {m["figure"] / mib:.0f} MiB | '
                f'{m["figure"] / p["figure"]:.2f} | {m["median_s"] / p["median_s"]:.2f} |')
  return '\n'.join(rows)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--clients', type=int, default=2)
  ap.add_argument('--batch', type=int, default=100)
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--out', default='')
  ap.add_argument('--from_json', default='')
  a = ap.parse_args(argv)
  if a.from_json:
    with open(a.from_json) as f:
      print(table(json.load(f)))
    return 0
  sys.path.insert(0, REPO)
  import jax  # pylint: disable=g-import-not-at-top
  dev = jax.devices()[0]
  doc = {'device': f'{dev.device_kind} ({dev.platform})', 'clients': a.clients,
         'batch': a.batch, 'repeats': a.repeats, 'programs': {}}
  makes = {'resnet20': lambda r: resnet20_step(a.clients, a.batch, r),
           'mlp_unrolled': lambda r: mlp_step(False, r),
           'mlp_scan': lambda r: mlp_step(True, r)}
  for name, make in makes.items():
    doc['programs'][name] = measure(make, a.repeats)
    print(f'{name}: ' + json.dumps({k: v['figure'] for k, v in doc['programs'][name].items()}),
          flush=True)
  print(table(doc))
  if a.out:
    with open(a.out, 'w') as f:
      json.dump(doc, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
