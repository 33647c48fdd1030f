"""Clients in chunks (``clients.chunk``): every per-client phase runs C clients at a time in
one program, with each client's arithmetic unchanged, and the planner chooses C where the
device is too small for all of them."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd.core import kernels as kernels_lib
from fedjax_kd.core.program import SGD, Rows, ce_loss, soft_ce_loss
from fedjax_kd.errors import ConfigError
from fedjax_kd.models import registry
from fedjax_kd.running import experiment as experiment_lib
from fedjax_kd.running import memory
from tests.shared import steps_of_activations, tiny_config


def test_in_chunks_runs_every_slot_once_and_drops_the_padding():
  calls = []

  def mapped(w, x, shared):
    calls.append(w.shape[0])               # traced once per distinct chunk shape
    return jnp.tanh(w * x + shared), w.sum(axis=-1)

  w = jnp.arange(7 * 3, dtype=jnp.float32).reshape(7, 3) / 10
  x = jnp.linspace(-1, 1, 7 * 3).reshape(7, 3)
  whole = jax.jit(mapped)(w, x, 0.5)
  chunked = jax.jit(kernels_lib.in_chunks(mapped, 3, (0, 0, None)))(w, x, 0.5)
  # Seven slots, three at a time: two full chunks and one of the last slot padded to three.
  assert calls[-1] == 3
  for a, b in zip(whole, chunked):
    assert b.shape == a.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert kernels_lib.in_chunks(mapped, None, (0, 0, None)) is mapped


def _cohort(model='cnn@0.5'):
  """Five clients of ``model`` and 300 uint8 8x8 images (the convolution's own batching rule
  under vmap, for the CNN; the MLP compiles in a fraction of its time)."""
  m = registry.get_model(model, num_classes=10, input_shape=(8, 8, 1))
  k = kernels_lib.CohortKernels(m, {'train': optax.sgd(0.1, momentum=0.9)})
  state = k.init(jax.random.split(jax.random.PRNGKey(0), 5), (8, 8, 1))
  x = jax.random.randint(jax.random.PRNGKey(1), (300, 8, 8, 1), 0, 256).astype(jnp.uint8)
  y = jnp.arange(300, dtype=jnp.int32) % 10
  return k, state, x, y


def test_reading_phases_give_the_same_numbers_in_chunks():
  """Prediction, evaluation and class sums are one forward pass per client: bit-equal (the
  convolution's batching rule in chunks: the training test below)."""
  k, state, x, y = _cohort('mlp@0.5')
  slots = jnp.asarray([0, 2, 3, 4], jnp.int32)
  idx = jnp.stack([jnp.arange(60) + 60 * i for i in range(4)]).astype(jnp.int32)
  n = jnp.asarray([60, 41, 17, 60], jnp.int32)
  c = 3   # two chunks, the second padded with a copy of the last slot
  np.testing.assert_array_equal(k.predict(state, slots, x, chunk=128),
                                k.predict(state, slots, x, chunk=128, client_chunk=c))
  for a, b in zip(k.evaluate(state, slots, x, y, idx, n, chunk=32),
                  k.evaluate(state, slots, x, y, idx, n, chunk=32, client_chunk=c)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(k.class_prob_sums(state, slots, x, y, idx, n, 10, chunk=32),
                  k.class_prob_sums(state, slots, x, y, idx, n, 10, chunk=32,
                                    client_chunk=c)):
    np.testing.assert_array_equal(a, b)


# One call of local training, chunked against all at once: the largest difference of any
# parameter measured here (AVX2, 2 cores) was 6e-8 (XLA:CPU picks how to vectorise a
# gradient's reductions by the shape of the whole batched program, so a program over C
# clients can round a partial sum differently from one over K); the tolerance leaves room
# for other CPUs.
FIT_ATOL = 1e-6


# The quick tier trains the MLP; the long tier the CNN (the convolution's batching rule in
# chunks, 20-30 s of compiling) and the soft-target loss.
@pytest.mark.parametrize('loss,model', [
    ('ce', 'mlp@0.5'), pytest.param('ce', 'cnn@0.5', marks=pytest.mark.slow),
    pytest.param('soft', 'mlp@0.5', marks=pytest.mark.slow)])
def test_training_in_chunks_matches_all_at_once(loss, model):
  k, state, x, y = _cohort(model)
  slots = jnp.arange(5, dtype=jnp.int32)
  valid = jnp.asarray([True, True, False, True, True])
  keys = jax.random.split(jax.random.PRNGKey(3), 5)
  if loss == 'ce':
    idx = jnp.stack([jnp.arange(60) + 60 * i for i in range(5)]).astype(jnp.int32)
    n = jnp.asarray([60, 33, 60, 7, 48], jnp.int32)
    shared, fn = {'x': x, 'y': y}, ce_loss
  else:
    idx, n = jnp.arange(100, dtype=jnp.int32), jnp.full((5,), 100, jnp.int32)
    shared = {'x': x[:100], 't': jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(4),
                                                                  (100, 10)))}
    fn = soft_ce_loss
  copy = lambda s: jax.tree.map(jnp.copy, s)
  program = SGD(fn, 2, 16)
  whole, _, lw = k.run(program, copy(state), slots, valid, keys, Rows(shared, idx, n))
  chunked, _, lc = k.run(program, copy(state), slots, valid, keys, Rows(shared, idx, n),
                         client_chunk=2)
  np.testing.assert_allclose(lc, lw, rtol=0, atol=FIT_ATOL)
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked)):
    np.testing.assert_allclose(b, a, rtol=0, atol=FIT_ATOL)
  # The padding slot (invalid) is untouched in both.
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(chunked)):
    np.testing.assert_array_equal(np.asarray(a)[2], np.asarray(b)[2])


def test_the_option_takes_auto_or_a_number_and_names_itself():
  assert config_lib.validate(tiny_config()).clients.chunk is None
  assert config_lib.validate(tiny_config(**{'clients.chunk': '3'})).clients.chunk == 3
  for bad in ('0', 'some', '-2'):
    with pytest.raises(ConfigError) as e:
      config_lib.validate(tiny_config(**{'clients.chunk': bad}))
    assert str(e.value).startswith(f"clients.chunk='{bad}' is not allowed: expected 'auto' or "
                                   'a number of clients >= 1')


def test_auto_takes_every_client_where_all_fit_and_chunks_where_they_do_not(monkeypatch):
  steps_of_activations(monkeypatch)
  exp = experiment_lib.build(config_lib.validate(tiny_config(**{'clients.num_clients': 8})))
  assert exp.memory.chunk is None and exp.ctx.fed.client_chunk is None  # this machine holds all
  assert exp.memory.choice() == 'all clients at once'
  full = memory.plan(exp, client_chunk=None)
  # Two cohorts of four: a device that holds the plan at two clients at a time, not three.
  two = memory.plan(exp, client_chunk=2)
  three = memory.plan(exp, client_chunk=3)
  assert two.total < three.total < full.total
  limit = int(two.total / memory.HEADROOM) + 1
  assert three.total > memory.HEADROOM * limit
  chosen = memory.choose(exp, limit)
  assert chosen.chunk == 2 and chosen.total == two.total
  assert chosen.choice() == 'clients 2 at a time (of 4 a phase)'


# Every algorithm's tiny rounds in chunks against all at once: tests/test_programs.py.


def test_training_reuses_the_cohorts_state_buffers_chunked_or_not():
  """The state a training call replaces is donated: XLA writes the new state into its
  buffers (the compiled program's aliasing covers every byte of it), so a round holds one
  copy of the cohort's state, not two."""
  k, state, x, y = _cohort('mlp@0.5')
  state_bytes = memory.tree_bytes(state)
  slots = jnp.arange(5, dtype=jnp.int32)
  idx = jnp.stack([jnp.arange(60) + 60 * i for i in range(5)]).astype(jnp.int32)
  with kernels_lib.recording() as programs:
    for c in (None, 2):
      state, _, _ = k.run(SGD(ce_loss, 1, 16), state, slots, jnp.ones(5, bool),
                          jax.random.split(jax.random.PRNGKey(3), 5),
                          Rows({'x': x, 'y': y}, idx, jnp.full((5,), 60, jnp.int32)),
                          client_chunk=c)
  assert [phase for phase, _ in programs.seen] == ['run:SGD', 'run:SGD']
  for _, m in programs.seen:
    assert m.alias_size_in_bytes == state_bytes
