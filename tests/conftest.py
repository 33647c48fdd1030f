"""Shared test helpers: where the optional real-MNIST file is; the tiny experiment every test
builds on is ``tests.shared.tiny_config``."""

import fcntl
import os
import pathlib
import shutil

import pytest

# MNIST train class counts (the standard 60,000-image training split).
MNIST_COUNTS = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)


def shipped_config(name: str):
  """The module of ``configs/<name>.py`` of this checkout (call its ``get_config``)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(__file__).resolve().parents[1] / 'configs' / f'{name}.py'
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def mnist_path() -> pathlib.Path:
  """Real MNIST for the tests that need it (may be absent: they skip).

  ``$FEDJAX_KD_MNIST`` (any Keras-layout ``mnist.npz``), else ``shared/data/mnist.npz`` in
  the folder that holds the checkout, where the project's CI machines keep a copy (users'
  machines usually have none, and those tests skip).
  """
  env = os.environ.get('FEDJAX_KD_MNIST')
  if env:
    return pathlib.Path(env)
  return pathlib.Path(__file__).resolve().parents[2] / 'shared/data/mnist.npz'


# A directory the session uses as its compilation cache and keeps (a developer's reruns).
KEEP_CACHE_ENV = 'FEDJAX_KD_TEST_KEEP_CACHE'


def _share_compilations():
  """One persistent XLA compilation cache for the whole test session.

  Most tests build a fresh experiment, so every jitted kernel is a new
  function object and would be compiled again although its program is the
  same as in the previous test. JAX's persistent cache keys on the program
  itself, so identical programs compile once per session. The directory is
  new for every session (nothing carries over between CI runs) and the
  environment variables hand it to subprocesses (CLI runs, sweep workers,
  notebook kernels). ``$FEDJAX_KD_COMPILATION_CACHE`` names it too, so that the
  command lines (whose cache is on by default, :mod:`fedjax_kd.running.compile_cache`)
  never write into the user's ``~/.cache`` from a test. ``$FEDJAX_KD_TEST_KEEP_CACHE=DIR``
  makes the session use ``DIR`` instead and keep it (and, with workers, the two lock files
  beside it), so
  that a rerun loads what the run before compiled: the long tier took 2,571 s cold and
  1,351 s warm on 2 cores (docs/testing.md). The quick tier's pytest-xdist
  workers inherit the directory that the controlling process made
  (``$FEDJAX_KD_TEST_XLA_CACHE``), so a program compiled by one worker is loaded by the
  other; JAX writes cache entries atomically.

  Returns:
    The directory, where this process made it (the controller, or a session without
    workers); None in a worker.
  """
  import tempfile  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  worker = os.environ.get('PYTEST_XDIST_WORKER')
  cache = os.environ.get('FEDJAX_KD_TEST_XLA_CACHE') if worker else None
  made = None
  kept = os.environ.get(KEEP_CACHE_ENV)
  if kept and not worker:
    cache = os.path.abspath(kept)
    os.makedirs(cache, exist_ok=True)
    os.environ['FEDJAX_KD_TEST_XLA_CACHE'] = cache
  elif not cache or not os.path.isdir(cache):
    cache = made = tempfile.mkdtemp(prefix='fedjax_kd_xla_cache_')
    os.environ['FEDJAX_KD_TEST_XLA_CACHE'] = cache
  settings = {'jax_compilation_cache_dir': cache,
              'jax_persistent_cache_min_compile_time_secs': 0,
              'jax_persistent_cache_min_entry_size_bytes': 0}
  for name, value in settings.items():
    jax.config.update(name, value)
    os.environ[name.upper()] = str(value)
  os.environ['FEDJAX_KD_COMPILATION_CACHE'] = cache
  return made


# The directory this process made (the controller's, or a run without workers), which it
# removes at the end with the lock files beside it (`_serial_tests_run_alone`).
_MADE_CACHE = _share_compilations()


def pytest_unconfigure(config):
  del config
  if _MADE_CACHE:
    shutil.rmtree(_MADE_CACHE, ignore_errors=True)
    for lock in _lock_files(_MADE_CACHE):
      if os.path.exists(lock):
        os.remove(lock)


def _lock_files(cache: str) -> tuple[str, str]:
  """``(lock, queue)``: the files beside the session's cache that `_serial_tests_run_alone`
  takes."""
  return cache + '.lock', cache + '.lock.queue'

# The quick tier's XLA backend optimisation (an XLA flag; the long tier keeps XLA's default).
QUICK_XLA_FLAG = '--xla_backend_optimization_level=0'


def pytest_configure(config):
  """The quick tier (the default ``-m 'not slow'``) compiles at XLA's lowest backend
  optimisation level: a fifth less time on 2 cores (185 s against 229 s), with numbers that
  differ from the default build's only as another CPU's do. Measured on eight algorithms'
  tiny golden cases: no accuracy, count or byte moved; losses by at most 7.5e-5 on the golden
  test's scale (ACE-pFL's L_GD, a difference of nearly equal terms), within its tolerance of
  5e-4. The long tier, ``-m ''`` and CI's AVX2 golden pass compile as users do, so the golden
  record is checked under both builds. Set ``XLA_FLAGS`` yourself (any
  ``--xla_backend_optimization_level``) to choose; the workers and the subprocesses the tests
  start inherit it."""
  flags = os.environ.get('XLA_FLAGS', '')
  if (config.getoption('markexpr', '') or '').strip() == 'not slow' and (
      '--xla_backend_optimization_level' not in flags):
    os.environ['XLA_FLAGS'] = f'{flags} {QUICK_XLA_FLAG}'.strip()


def pytest_collection_modifyitems(config, items):
  """``serial`` tests first, each group in its own order: pytest-xdist hands every worker
  the session's first tests, so the ``serial`` ones run one after another at the start,
  while the other workers wait for them anyway, and never interrupt the rest later."""
  del config
  items[:] = sorted(items, key=lambda item: not item.get_closest_marker('serial'))


@pytest.fixture(autouse=True)
def _serial_tests_run_alone(request):
  """A test marked ``serial`` runs while no other test does; the others run side by side.

  Those tests time themselves or their processes (a survivor's exit within the heartbeat
  timeout, a lock wait under five seconds, two processes that must both keep up), so a
  pytest-xdist worker running something else beside them would make them slow or flaky.
  Every test takes a lock file shared by the session's workers: ``serial`` ones exclusively,
  the others shared. A second lock file is the queue: a worker holds it while it waits, so
  a ``serial`` test waits for the tests running now and no new one starts before it (with
  the main lock alone, shared holders that keep taking it in turn starved an exclusive
  waiter for ten minutes). Without workers (``-n 0``) there is nothing to wait for.
  """
  if not os.environ.get('PYTEST_XDIST_WORKER'):
    yield
    return
  mode = fcntl.LOCK_EX if request.node.get_closest_marker('serial') else fcntl.LOCK_SH
  lock, queue_file = _lock_files(os.environ['FEDJAX_KD_TEST_XLA_CACHE'])
  with open(queue_file, 'a') as queue, open(lock, 'a') as f:
    fcntl.flock(queue, fcntl.LOCK_EX)
    try:
      fcntl.flock(f, mode)
    finally:
      fcntl.flock(queue, fcntl.LOCK_UN)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


# Where each test's time went, for finding a tier's idle cores: with FEDJAX_KD_TEST_TIMELINE set
# to a file, every worker appends one JSON line a test (its worker, its start and end, and how
# long its setup, call and teardown took; setup includes waiting on the lock above).
_TIMELINE = os.environ.get('FEDJAX_KD_TEST_TIMELINE')

if _TIMELINE:
  import json  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
    start, item.timeline_phases = time.time(), {}
    yield
    line = {'test': item.nodeid, 'worker': os.environ.get('PYTEST_XDIST_WORKER', 'main'),
            'start': round(start, 2), 'end': round(time.time(), 2), **item.timeline_phases}
    with open(_TIMELINE, 'a', encoding='utf-8') as f:
      f.write(json.dumps(line) + '\n')

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_makereport(item, call):
    yield
    item.timeline_phases[call.when] = round(call.duration, 2)
