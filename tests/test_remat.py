"""benchmarks/performance/remat.py: what recomputing activations gives back on the CPU (docs/performance.md,
"Recomputing activations")."""

import json
import os
import sys

import pytest

from tests.test_main import REPO

sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
import remat  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.mark.slow
def test_remat_gives_memory_back_on_the_cpu_only_in_a_loop(tmp_path):
  """The docs' three findings, on XLA's own figures (compiled programs: no run-to-run spread).
  When a JAX or XLA release starts giving memory back for written-out blocks, this fails, and
  remat becomes worth a planner choice."""
  out = tmp_path / 'remat.json'
  assert remat.main(['--clients=1', '--batch=8', '--repeats=1', f'--out={out}']) == 0
  progs = json.loads(out.read_text())['programs']
  ratio = {k: v['remat']['figure'] / v['plain']['figure'] for k, v in progs.items()}
  assert ratio['resnet20'] >= 0.99, ratio          # every block under nn.remat: nothing back
  assert ratio['mlp_unrolled'] >= 1.0, ratio       # written out: as much or more
  assert ratio['mlp_scan'] < 0.5, ratio            # one block at a time in a loop: far less
  assert all(len(v[side]['times']) == 1 for v in progs.values() for side in ('plain', 'remat'))


@pytest.mark.slow   # over 30 s of compiling on one core
def test_the_remat_block_has_the_plain_blocks_variables_and_outputs():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from fedjax_kd.models import resnet  # pylint: disable=g-import-not-at-top
  plain = resnet.CifarResNet(num_classes=10, blocks_per_stage=1, width=0.25)
  again = resnet.CifarResNet(num_classes=10, blocks_per_stage=1, width=0.25,
                             block=nn.remat(resnet.BasicBlock, static_argnums=(2,)))
  x = jax.random.normal(jax.random.PRNGKey(1), (3, 8, 8, 3))
  v = plain.init(jax.random.PRNGKey(0), x)
  assert jax.tree.structure(again.init(jax.random.PRNGKey(0), x)) == jax.tree.structure(v)
  loss = lambda m: lambda p: m.apply({**v, 'params': p}, x, train=True,
                                     mutable=['batch_stats'])[0].sum()
  g0, g1 = jax.grad(loss(plain))(v['params']), jax.grad(loss(again))(v['params'])
  np.testing.assert_allclose(plain.apply(v, x), again.apply(v, x), rtol=0, atol=0)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
