"""No recompilation after the first round, for every algorithm.

A round's kernels see the same shapes, dtypes and static arguments every round
(fixed-size public draws, padded client slots, traced round numbers), so once
the first round (and its evaluation) has compiled them, later rounds must hit
JAX's in-memory executable cache. `count_compiles` counts compile requests,
persistent-cache hits included, so the session-wide cache of conftest.py does
not hide a recompile.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import ALGORITHMS, base
from fedjax_kd.config import presets
from fedjax_kd.core import compiles
from fedjax_kd.core.compiles import count_compiles
from fedjax_kd.running import experiment

# Algorithms that average parameters need one architecture.
SINGLE_ARCH = tuple(n for n, c in ALGORITHMS.items() if c.one_architecture)
K = 6


# ------------------------------------------------------------ the counter
def test_counter_counts_new_shapes_not_repeats():
  f = jax.jit(lambda x: jnp.sin(x) * 2.0 + 1.0)
  a, b, c = jnp.ones(3), jnp.zeros(3), jnp.ones(5)   # eager ops compile too: made outside
  f(a)
  with count_compiles() as log:
    f(a)
    f(b)
  assert log.count == 0, log.names
  with count_compiles() as log:
    f(c)                              # a new shape compiles
    f(c)
  assert log.count == 1, log.names
  assert 'lambda' in log.names[0]


def test_counter_sees_persistent_cache_hits():
  """A second function object with the same program is a cache hit, still counted."""
  def make():
    return jax.jit(lambda x: jnp.cos(x) - 3.0)
  make()(jnp.ones(7))                 # compiled and written to the persistent cache
  with count_compiles() as log:
    make()(jnp.ones(7))               # new jit object: traced, lowered, read back from disk
  assert log.count == 1, log.names
  with count_compiles() as log:
    pass
  assert log.count == 0


# ------------------------------------------------------------ every algorithm
def compile_case_config(name: str, hetero: bool, participation: float, store: str = 'device'):
  c = presets.digits(name)
  c.seed = 0
  c.clients.num_clients = K
  c.clients.participation = participation
  c.clients.models = ['mlp@0.5', 'mlp@1.0'] if hetero else ['mlp@0.5']
  c.clients.assignment = 'round_robin'       # even clients one spec, odd the other
  c.clients.store = store
  c.server.model = 'mlp@0.5'
  c.data.num_public = 120
  c.train.epochs = 1
  c.train.batch_size = 32
  c.distill.epochs = 1
  c.distill.batch_size = 30
  c.distill.public_per_round = 60
  c.eval.chunk = 256
  if name == 'acepfl':
    c.acepfl.r0 = 2                           # the temperature schedule moves every round
  if name == 'fedcache2':
    c.fedcache2.dd_epochs = 1
    c.fedcache2.dd_batch_size = 10
    # A round's widest download sets the width of the extra-rows table, padded to
    # the next power of two (`FedCache2.round`, s_max): a round whose widest
    # download crosses a power of two compiles that width once (bounded by
    # log2(K * slots)). Every client samples more than 4 cached items here, so the
    # cap makes the width 4 every round and any compile is a bug.
    c.fedcache2.max_download = 4
  return c


# Heterogeneous cohorts under partial participation: every round 2 of the 3 even
# clients and 1 of the 3 odd ones take part, different ones each round. A
# cohort's active clients are padded to the next power of two (federation
# `bucket`), so a cohort whose active count changed bucket would compile that
# bucket's kernels once (inherent and bounded by log2 of the cohort size). Fixing
# the per-cohort counts keeps the bucket set of round 1, so any compile is a bug.
HETERO_MASKS = ([0, 2, 1], [2, 4, 3], [4, 0, 5], [0, 4, 1], [2, 0, 3], [4, 2, 5])


def warmup_rounds(algo) -> int:
  """Rounds after which every kernel of ``algo`` has run at least once.

  With ``schedule='next_round'`` clients distil on the previous round's
  knowledge at the start of a round, so round 1 has no client distillation and
  round 2 is the first round that runs all of them; nothing of that round is a
  recompile of a round-1 program with new shapes.
  FedCache 2.0's knowledge cache is empty in round 1 (clients upload their first
  distilled sets at its end), so round 2 is the first with downloads.
  """
  if getattr(algo, 'schedule', None) == 'next_round' or algo.name == 'fedcache2':
    return 2
  return 1


def run_rounds(algo, selector, state, rounds, masks=None):
  """The runner's loop (`fedjax_kd.runner.run`) without files: plan, round, evaluate."""
  for t in rounds:
    if masks is None:
      plan = selector.plan(t, lambda mask, st=state: algo.selection_losses(st, mask))
      active = plan.active
    else:
      active = np.zeros(K, bool)
      active[masks[t - 1]] = True
    if active.any():
      state, _ = base.play_round(algo, state, t, active)
    algo.scores(state)
  return state


def cases():
  """One case per algorithm, the hardest it supports: two model specs (cohorts)
  under partial participation; one spec for parameter averaging. The algorithms
  with per-client state also run with host-resident clients (round views)."""
  for name in sorted(ALGORITHMS):
    if name == 'individual':                  # an alias of 'single'
      continue
    if name in SINGLE_ARCH:
      yield name, False, 0.5, 'device'
    elif name == 'centralized':
      yield name, False, 1.0, 'device'
    else:
      yield name, True, 0.5, 'device'
  for name in ('dsfl', 'scarlet', 'fedcache2', 'acepfl', 'scaffold'):
    yield name, name not in SINGLE_ARCH, 0.5, 'host'


@pytest.mark.parametrize('name,hetero,participation,store', list(cases()))
@pytest.mark.slow
def test_no_recompilation_after_first_round(name, hetero, participation, store):
  spec = config_lib.validate(compile_case_config(name, hetero, participation, store))
  exp = experiment.build(spec)
  algo, selector = exp.algorithm, exp.ctx.selector
  masks = HETERO_MASKS if hetero and participation < 1 else None
  warm = warmup_rounds(algo)
  state = run_rounds(algo, selector, base.init_state(algo), range(1, warm + 1), masks)
  with count_compiles() as log:
    run_rounds(algo, selector, state, range(warm + 1, warm + 4), masks)
  assert log.count == 0, f'{name} ({store}): recompiled {log.names}'


def test_compile_seconds_are_the_union_of_nested_events():
  # JAX's trace events nest (an inner jit traced inside an outer trace): the wall time
  # spent is the union of the intervals, not the sum of the durations.
  t = compiles.CompileTime()
  t.add(0.0, 1.0)
  t.add(0.2, 0.5)        # nested: no time added
  assert t.seconds == pytest.approx(1.0)
  t.add(2.0, 3.0)        # disjoint
  assert t.seconds == pytest.approx(2.0)
  t.add(0.5, 2.5)        # bridges both
  assert t.seconds == pytest.approx(3.0) and len(t.spans) == 1
