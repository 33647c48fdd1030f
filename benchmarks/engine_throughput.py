r"""Client-steps/s and GFLOP/s of local training: the engine vs a one-client loop.

Trains K clients of one model (default the calibration CNN of
``shared/perf``: conv5x5x16, conv5x5x32, dense128, batch 50, SGD 0.1) for
``--steps`` steps each:

  * ``engine``: one ``Federation.train_private`` call (jit(vmap over clients of
    lax.scan over steps)), the way every algorithm runs a round;
  * ``loop``: the same compiled single-client kernel called once per client
    (how the PyTorch FD code bases run clients), for K <= --max_loop_clients.

Also prints the machine's f32 matmul GFLOP/s as the ceiling; achieved GFLOP/s
uses XLA's own FLOP count of the compiled round.

  python benchmarks/engine_throughput.py --clients=10,100,1000
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_kd.core.federation import Federation, build_federated_data
from fedjax_kd.models import registry


def matmul_gflops(n: int = 2048, reps: int = 10) -> float:
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    f(a).block_until_ready()
  return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


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
    states, loss = fed.train_private(states, root, t, epochs=1, batch_size=args.batch)
    jax.block_until_ready(states)
    return states

  states = run(states, 1)  # compile
  times = []
  for r in range(args.repeats):
    t0 = time.perf_counter()
    states = run(states, 2 + r)
    times.append(time.perf_counter() - t0)
  dt = min(times)
  kern = fed.cohorts[0].kernels
  slots = jnp.arange(k, dtype=jnp.int32)
  lowered = kern._fit.lower(states[0], slots, jnp.ones(k, bool),
                            jax.random.split(root, k), data.client_idx,
                            jnp.asarray(data.client_n),
                            {'x': data.x_private, 'y': data.y_private}, {},
                            loss_fn=fed_loss(), epochs=1, batch_size=args.batch,
                            opt_slot='train', idx_shared=False, augment=None)
  cost = lowered.compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get('flops', 0.0)) if cost else 0.0
  out = {'clients': k, 'engine_s': dt, 'engine_client_steps_per_s': k * args.steps / dt,
         'engine_gflops': flops / dt / 1e9 if flops else None}
  if loop:
    single = Federation(build_federated_data(x, y, idx[:1], x[:10], x[:10], y[:10], 10),
                        [args.model], {args.model: module}, {'train': optax.sgd(0.1)},
                        use_mesh=False)
    sstate = single.init(root)
    sstate, _ = single.train_private(sstate, root, 1, epochs=1, batch_size=args.batch)
    jax.block_until_ready(sstate)
    t0 = time.perf_counter()
    for c in range(k):
      sstate, _ = single.train_private(sstate, root, 2 + c, epochs=1, batch_size=args.batch)
    jax.block_until_ready(sstate)
    lt = time.perf_counter() - t0
    out.update(loop_s=lt, loop_client_steps_per_s=k * args.steps / lt, speedup=lt / dt)
  return out


def fed_loss():
  from fedjax_kd.core.federation import ce_loss  # pylint: disable=g-import-not-at-top
  return ce_loss


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
  ceiling = matmul_gflops()
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
