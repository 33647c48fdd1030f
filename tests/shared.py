"""The tiny experiment the tests share, in a module without side effects: config files
that tests write (and run in subprocesses) import it, which importing ``conftest`` (it sets
up the session's compilation cache) must not do."""


# A config file of the tiny experiment, for commands that take ``--config=FILE`` (run with the
# repository as the working folder, so that ``tests`` imports).
TINY_FILE = 'from tests.shared import tiny_config\n\ndef get_config():\n  return tiny_config()\n'


def tiny_config(algorithm: str = 'dsfl', rounds: int = 3, **overrides):
  """The tiny experiment the tests share: ``algorithm`` on 600 synthetic images, four clients
  of small MLPs (one width for FedAvg, two otherwise), one epoch each, 100 of 150 public
  samples a round. ``overrides`` are dotted fields: ``tiny_config(**{'data.source': ...})``.
  """
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
  c = presets.digits(algorithm)
  c.rounds = rounds
  c.data.source = 'synthetic:600'
  c.data.num_public = 150
  c.clients.num_clients = 4
  c.clients.models = ['mlp@0.25'] if algorithm == 'fedavg' else ['mlp@0.25', 'mlp@0.5']
  c.server.model = 'mlp@0.5'
  c.train.epochs = 1
  c.distill.epochs = 1
  c.distill.public_per_round = 100
  return config_lib.override(c, overrides)


def steps_of_activations(monkeypatch) -> None:
  """Makes the memory planner's figure for a step 1 MiB per client at once (``monkeypatch``,
  pytest's), as where activations dominate (a CNN's): on the tiny experiment's small MLPs
  the clients' states do, and running them in chunks would not save memory (a chunked
  training holds the slots' new states besides their gathered ones)."""
  from fedjax_kd.running import memory  # pylint: disable=g-import-not-at-top

  def per_client(kernels, shape, dtype, phase, slots, chunk, rows):
    del kernels, shape, dtype, rows
    return 0 if phase.kind == 'init' else (chunk or slots) << 20   # the clients at once

  monkeypatch.setattr(memory, '_figure', per_client)
  monkeypatch.setattr(memory, '_bound', per_client)


def train(fed, states, root, t: int, epochs: int, batch_size: int, *, active=None,
          epochs_k=None, lr_scale=None, fresh: bool = False, transforms=(), row=None,
          shared=None, loss=None):
  """Local training of ``fed``'s clients on their private rows (the engine's :class:`SGD`
  program, chained with the round's learning-rate factor ``lr_scale`` where given and with
  ``transforms``): ``(states, [K] mean losses)``."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  sgd = program.SGD(loss or program.ce_loss, epochs, batch_size, fresh=fresh)
  shared = dict(shared or {})
  if lr_scale is not None:
    sgd = program.chain(sgd, program.LRScale())
    shared['lr_scale'] = jnp.float32(lr_scale)
  sgd = program.chain(sgd, *transforms)
  d = fed.data
  ran = fed.run(sgd, states, root, t, 'train',
                data=program.Rows({'x': d.x_private, 'y': d.y_private}, d.client_idx,
                                  d.client_n),
                row=row, shared=shared or None, active=active, epochs=epochs_k)
  return ran.states, ran.metrics


def distill(fed, states, root, t: int, x, targets, epochs: int, batch_size: int, *,
            count=None, active=None):
  """Distillation of ``fed``'s clients on ``(x[:count], targets)``: ``(states, [K] losses)``."""
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  sgd, data, row = base.distillation(program.SGD(program.soft_ce_loss, epochs, batch_size), x,
                                     targets, fed.num_clients, count)
  ran = fed.run(sgd, states, root, t, 'distill', data=data, row=row, active=active)
  return ran.states, ran.metrics


def assert_rewrites_to_itself(tmp_path, doc: str, main, argv, flag: str = '--markdown') -> None:
  """A table command (``main(argv + [flag=PAGE])``) run on a copy of the committed page
  ``doc`` (e.g. ``'docs/configs.md'``) leaves it as committed: its table is the script's
  output, never edited by hand."""
  import pathlib  # pylint: disable=g-import-not-at-top
  committed = (pathlib.Path(__file__).resolve().parents[1] / doc).read_text()
  page = tmp_path / pathlib.Path(doc).name
  page.write_text(committed)
  assert main([*argv, f'{flag}={page}']) == 0
  assert page.read_text() == committed


class DeviceReads:
  """Counts the device-to-host reads of each round a run plays (:func:`count_reads`).

  A read is a point where the host waits for the device: one ``jax.device_get`` call (of
  any pytree), or one implicit conversion of a ``jax.Array`` (``float(x)``, ``bool(x)``,
  or ``np.asarray(x)`` / ``np.array(x)`` outside installed libraries) outside one. On a CPU
  ``jax.transfer_guard`` sees no transfer (the arrays are host memory already), and NumPy
  reads a CPU array through its buffer, not through Python, so the reads are counted where
  they are asked for.

  Attributes:
    rounds: ``{t: reads during round t}`` (selection, the round, the NaN guard and its
      evaluation: ``runner``'s whole ``play``).
    sites: ``{t: {"file:line": reads}}``, the package's line nearest each read.
  """

  def __init__(self):
    self.rounds: dict[int, int] = {}
    self.sites: dict[int, dict[str, int]] = {}
    self._t = None
    self._inside = 0

  def _count(self, kind: str) -> None:
    import traceback  # pylint: disable=g-import-not-at-top
    if self._t is None or self._inside:
      return
    site = next((f'{f.filename.rpartition("fedjax_kd/")[2]}:{f.lineno}'
                 for f in reversed(traceback.extract_stack()[:-2])
                 if '/fedjax_kd/' in f.filename), '?')
    self.rounds[self._t] = self.rounds.get(self._t, 0) + 1
    key = f'{site} ({kind})'
    self.sites.setdefault(self._t, {})[key] = self.sites.get(self._t, {}).get(key, 0) + 1


def count_reads(reads: DeviceReads | None = None):
  """A context manager that yields a :class:`DeviceReads` (``reads``, or a new one) counting
  every round that ``fedjax_kd.runner`` plays inside it (it patches ``jax.device_get``,
  ``jax.Array``'s host value and the runner's round for its duration)."""
  import contextlib  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import array as array_lib  # pylint: disable=g-import-not-at-top

  from fedjax_kd.running import session as session_lib  # pylint: disable=g-import-not-at-top

  import sys  # pylint: disable=g-import-not-at-top

  import numpy as np  # pylint: disable=g-import-not-at-top

  @contextlib.contextmanager
  def counting():
    value, get, play = array_lib.ArrayImpl._value, jax.device_get, session_lib.Session.play
    np_asarray, np_array = np.asarray, np.array

    def numpy_of(convert):
      def counted(a, *args, **kwargs):
        # A conversion of a device array by the code a round runs (the package's, an
        # algorithm's); those inside installed libraries are parts of a device_get or a trace.
        caller = sys._getframe(1).f_code.co_filename  # pylint: disable=protected-access
        if isinstance(a, jax.Array) and 'site-packages' not in caller:
          reads._count('numpy')
        return convert(a, *args, **kwargs)
      return counted

    def counted_value(self):
      reads._count('implicit')
      return value.fget(self)

    def counted_get(x):
      reads._count('device_get')
      reads._inside += 1
      try:
        return get(x)
      finally:
        reads._inside -= 1

    def counted_play(session, t):
      reads._t, reads.rounds[t] = t, 0
      try:
        return play(session, t)
      finally:
        reads._t = None

    array_lib.ArrayImpl._value = property(counted_value)
    jax.device_get = counted_get
    session_lib.Session.play = counted_play
    np.asarray, np.array = numpy_of(np_asarray), numpy_of(np_array)
    try:
      yield reads
    finally:
      array_lib.ArrayImpl._value, jax.device_get, session_lib.Session.play = value, get, play
      np.asarray, np.array = np_asarray, np_array

  reads = reads if reads is not None else DeviceReads()
  return counting()
