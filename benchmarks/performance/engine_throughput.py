r"""Client-steps/s and GFLOP/s of local training: the engine vs a one-client loop.

Trains K clients of one model (default the small ``cnn``: conv5x5x16,
conv5x5x32, dense128, batch 50, SGD 0.1) for
``--steps`` steps each:

  * ``engine``: one ``Federation.run`` of the training program (jit(vmap over clients of
    lax.scan over steps)), the way every algorithm runs a round;
  * ``loop``: the same compiled single-client kernel called once per client
    (how the PyTorch FD code bases run clients), for K <= --max_loop_clients.

Also prints the machine's f32 matmul GFLOP/s as the ceiling; achieved GFLOP/s
is XLA's FLOP count of one training step (see ``step_flops``) times the steps run.

  python benchmarks/performance/engine_throughput.py --clients=10,100,1000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd.core.federation import Federation
from fedjax_kd.core.program import SGD, Rows, ce_loss
from fedjax_kd.data.federated import build_federated_data
from fedjax_kd.models import registry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_torch  # pylint: disable=g-import-not-at-top,wrong-import-position


def bench(k: int, args, loop: bool) -> dict:
  shape = tuple(int(s) for s in args.input.split(','))
  rs = np.random.RandomState(0)
  pool = max(4000, args.batch * args.steps)
  x = rs.rand(pool, *shape).astype(np.float32)
  y = rs.randint(0, 10, pool)
  per = args.batch * args.steps   # one epoch = --steps full batches
  idx = [rs.choice(pool, per, replace=False) for _ in range(k)]
  data = build_federated_data(x, y, idx, x[:10], x[:10], y[:10], 10)
  module = registry.get_model(args.model, num_classes=10, input_shape=shape)
  fed = Federation(data, [args.model] * k, {args.model: module},
                   {'train': optax.sgd(0.1)})
  root = jax.random.PRNGKey(0)
  states = fed.init(root)

  def run(states, t):
    states = train(fed, states, root, t, args.batch)
    jax.block_until_ready(states)
    return states

  states = run(states, 1)  # compile
  times = []
  for r in range(args.repeats):
    t0 = time.perf_counter()
    states = run(states, 2 + r)
    times.append(time.perf_counter() - t0)
  dt = min(times)
  flops = step_flops(args, shape) * k * args.steps
  out = {'clients': k, 'engine_s': dt, 'engine_client_steps_per_s': k * args.steps / dt,
         'engine_gflops': flops / dt / 1e9 if flops else None}
  if loop:
    single = Federation(build_federated_data(x, y, idx[:1], x[:10], x[:10], y[:10], 10),
                        [args.model], {args.model: module}, {'train': optax.sgd(0.1)},
                        use_mesh=False)
    sstate = single.init(root)
    sstate = train(single, sstate, root, 1, args.batch)
    jax.block_until_ready(sstate)
    t0 = time.perf_counter()
    for c in range(k):
      sstate = train(single, sstate, root, 2 + c, args.batch)
    jax.block_until_ready(sstate)
    lt = time.perf_counter() - t0
    out.update(loop_s=lt, loop_client_steps_per_s=k * args.steps / lt, speedup=lt / dt)
  return out


def train(fed, states, root, t: int, batch: int):
  """One epoch of SGD of every client of ``fed`` on its private rows: the new states."""
  d = fed.data
  return fed.run(SGD(ce_loss, 1, batch), states, root, t, 'train',
                 data=Rows({'x': d.x_private, 'y': d.y_private}, d.client_idx,
                           d.client_n)).states


def step_flops(args, shape) -> float:
  """XLA's FLOP count of one training step (loss, gradient, SGD update) of one client.

  Counted on the model lowered with native XLA convolutions and outside any
  loop: XLA's cost analysis counts a scan or loop body once, and the CPU im2col
  lowering loops over clients and batch chunks. The arithmetic is the same.
  """
  module = registry.get_model(args.model, num_classes=10, input_shape=shape, lowering='xla')
  variables = registry.init_variables(module, jax.random.PRNGKey(0), shape)
  tx = optax.sgd(0.1)
  xb = jnp.zeros((args.batch,) + shape, jnp.float32)
  yb = jnp.zeros((args.batch,), jnp.int32)

  def step(params, opt):
    def loss(p):
      logits = module.apply({**variables, 'params': p}, xb, train=True,
                            mutable=['batch_stats'] if 'batch_stats' in variables else False)
      logits = logits[0] if isinstance(logits, tuple) else logits
      return ce_loss(logits, {'y': yb}, {}).mean()
    g = jax.grad(loss)(params)
    u, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, u), opt

  params = variables['params']
  cost = jax.jit(step).lower(params, tx.init(params)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get('flops', 0.0)) if cost else 0.0


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--clients', default='10,100,1000')
  p.add_argument('--model', default='cnn@1.0')
  p.add_argument('--input', default='28,28,1')
  p.add_argument('--batch', type=int, default=50)
  p.add_argument('--steps', type=int, default=10)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--max_loop_clients', type=int, default=100)
  p.add_argument('--json', default='')
  args = p.parse_args()
  print(f'backend {jax.default_backend()}, {len(jax.devices())} device(s): '
        f'{jax.devices()[0].device_kind}')
  ceiling = vs_torch.peak_gflops(torch=False)['xla']
  print(f'f32 matmul ceiling: {ceiling:.0f} GFLOP/s')
  rows = []
  for k in (int(c) for c in args.clients.split(',')):
    r = bench(k, args, loop=k <= args.max_loop_clients)
    rows.append(r)
    line = (f'K={k:>5}  engine {r["engine_client_steps_per_s"]:8.1f} client-steps/s'
            f'  {r["engine_gflops"] or 0:6.1f} GFLOP/s')
    if 'loop_s' in r:
      line += (f'  | loop {r["loop_client_steps_per_s"]:8.1f} client-steps/s'
               f'  speedup x{r["speedup"]:.2f}')
    print(line, flush=True)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'ceiling_gflops': ceiling, 'rows': rows, 'args': vars(args)}, f, indent=2)


if __name__ == '__main__':
  main()
