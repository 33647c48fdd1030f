"""Device-memory planning: what a run needs, worked out from its experiment before anything
compiles, and a one-line refusal (with what would fit) when the device cannot hold it.

A run's device memory has three parts, and a fourth on a CPU:

* **data**: the device-resident arrays of the data set (private, public and test inputs and
  labels, the clients' row tables): their exact sizes;
* **state**: everything carried between rounds, the clients' models and optimizer states, the
  algorithm's client table, the server model and its caches: exact, from
  ``jax.eval_shape`` of the algorithm's ``init`` (shapes only, nothing is allocated). With
  ``clients.store='host'|'disk'`` the device holds only a round's participants' rows of the
  per-client parts (the rest lives in host memory or on disk);
* **step**: the largest working set of one compiled step: local training of a cohort's
  participants (``S`` slots at once) needs, per slot, the gathered and the updated client
  state, the gradients, and the activations kept for the backward pass of a batch; a
  prediction or evaluation pass over ``eval.chunk`` samples needs the largest layer's input
  and output per slot. Activations come from the model's forward pass traced to a jaxpr (no
  compile): the outputs of its products, convolutions and poolings per sample, twice
  (forward values kept for the backward pass, and their gradients), and the largest layer
  being worked on;
* **runtime**: on a CPU, where the device is the host, the process's own memory besides
  arrays (compiler, runtime, Python): :data:`CPU_RUNTIME`.

The step term is the estimate's uncertain part (XLA fuses and reuses buffers);
``docs/performance.md`` ("Planning device memory") has the estimate against measured peaks
(``benchmarks/memory_plan.py``): within -3% to +21% where arrays dominate, on a CPU and on
an H100. On a GPU the device's memory is XLA's allocator limit; on a CPU the device is the
host, whose memory is what the kernel (and a cgroup limit, in a container) lets this
process still take.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd.core.federation import bucket  # the engine's slot buckets
from fedjax_kd.errors import DeviceMemoryError

# Primitives whose outputs a backward pass keeps (elementwise ops fuse into them) ...
_KEPT = frozenset({'dot_general', 'conv_general_dilated', 'reduce_window_max',
                   'reduce_window_sum', 'select_and_gather_add'})
# ... and those that build a convolution's patches (the im2col lowering on a CPU): an
# inference pass holds them, a training step fuses them into its products.
_HEAVY = _KEPT | {'concatenate', 'pad', 'gather', 'dynamic_slice'}
_CALLS = frozenset({'pjit', 'jit', 'closed_call', 'custom_jvp_call', 'custom_vjp_call',
                    'custom_vjp_call_jaxpr', 'remat', 'checkpoint'})
GIB = 1 << 30
# A CPU process's own memory besides arrays (compiler, runtime, Python): the default config's
# measured peak less its arrays was 518 MB (benchmarks/memory_plan.py, size small).
CPU_RUNTIME = 512 << 20


def tree_bytes(tree: Any) -> int:
  """Bytes of every array (or ``ShapeDtypeStruct``) leaf of ``tree``."""
  return int(sum(math.prod(np.shape(a)) * np.dtype(a.dtype).itemsize
                 for a in jax.tree.leaves(tree) if hasattr(a, 'dtype')))


def fmt(n: float) -> str:
  """``n`` bytes for a message: ``1.5 GiB``, ``312 MiB``, ``48 KiB``."""
  for unit, size in (('GiB', GIB), ('MiB', 1 << 20), ('KiB', 1 << 10)):
    if n >= size:
      return f'{n / size:.1f} {unit}' if n < 10 * size else f'{n / size:.0f} {unit}'
  return f'{int(n)} B'


def _eqns(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for p in e.params.values():
      for j in (p if isinstance(p, (list, tuple)) else (p,)):
        inner = getattr(j, 'jaxpr', j)
        if hasattr(inner, 'eqns'):
          yield from _eqns(inner)


def activation_bytes(kernels: Any, params: Any, batch_stats: Any, input_shape: tuple[int, ...],
                     input_dtype: str, *, train: bool) -> tuple[int, int]:
  """Per-sample activation bytes of ``kernels``' model, from a traced forward pass of 2
  samples: ``(train, peak)``. ``train`` is what a training step holds: twice the outputs
  of the products, convolutions and poolings (the values a backward pass keeps, and their
  gradients) and the largest output of any heavy op once (the layer being worked on: its
  patches, with the im2col lowering). ``peak`` adds the two largest heavy outputs, what an
  inference pass holds at once (a layer's input and output).

  Args:
    kernels: a :class:`~fedjax_kd.core.kernels.CohortKernels` (its ``apply_model`` casts to the
      compute dtype, so bfloat16 activations count 2 bytes).
    params, batch_stats: one model's variables, arrays or ``ShapeDtypeStruct``.
    input_shape, input_dtype: one sample's model input.
    train: the training-mode forward pass (dropout, batch statistics) or inference.
  """
  def fwd(p, s, x):
    kw = {'rngs': {'dropout': jax.random.PRNGKey(0)}} if train else {}
    if train and s:
      return kernels.apply_model(p, s, x, train=True, mutable=['batch_stats'], **kw)[0]
    return kernels.apply_model(p, s, x, train=train, **kw)

  x = jax.ShapeDtypeStruct((2,) + tuple(input_shape), jnp.dtype(input_dtype))
  jaxpr = jax.make_jaxpr(fwd)(params, batch_stats, x).jaxpr
  sizes = [(e.primitive.name, tree_bytes([v.aval for v in e.outvars
                                          if hasattr(v.aval, 'dtype')]))
           for e in _eqns(jaxpr) if e.primitive.name in _HEAVY]
  kept = sum(n for name, n in sizes if name in _KEPT)
  two = sorted(n for _, n in sizes)[-2:]
  return (2 * kept + max(two, default=0) + 1) // 2, (sum(two) + 1) // 2


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """A run's estimated device memory, per device, in bytes.

  Attributes:
    data: the device-resident data.
    state: the state carried between rounds that the device holds.
    step: the largest compiled step's working set.
    store_rows: per-client state bytes of all clients (what ``clients.store='host'|'disk'``
      moves off the device), for the advice.
    runtime: on a CPU, where the device is the host, what the process itself takes besides
      arrays (the compiler, XLA's runtime and thread pools, Python): :data:`CPU_RUNTIME`.
    devices: the devices the clients are spread over.
  """
  data: int
  state: int
  step: int
  store_rows: int
  runtime: int = 0
  devices: int = 1

  @property
  def total(self) -> int:
    return self.data + self.state + self.step + self.runtime

  def describe(self) -> str:
    runtime = f', runtime {fmt(self.runtime)}' if self.runtime else ''
    return (f'{fmt(self.total)} (data {fmt(self.data)}, state {fmt(self.state)}, largest '
            f'step {fmt(self.step)}{runtime})')


def _round_clients(spec: Any) -> int:
  """The most clients a round can train: ``selection.m`` (or ``participation`` of K)."""
  k = spec.clients.num_clients
  if spec.clients.participation >= 1.0 and spec.selection.method == 'uniform':
    return k
  m = max(spec.selection.m, math.ceil(spec.clients.participation * k))
  return min(k, m)


class _Cohort(NamedTuple):
  """One cohort's sizes: clients, and bytes per client or per sample."""
  size: int               # clients
  row: int                # state per client (parameters, statistics, optimizer states)
  params: int             # parameters per client (their gradients)
  train: int              # what a training step holds per sample (activation_bytes)
  peak: int               # what an inference pass holds per sample
  sample: int             # one stored input


@dataclasses.dataclass(frozen=True)
class _Parts:
  """What :func:`plan` works from (kept so the advice can re-plan other settings)."""
  data: int
  cohorts: tuple[_Cohort, ...]
  table_row: int          # client-table bytes per client
  server: int             # server model + extra
  public: int             # public samples a round predicts on
  classes: int
  visits_all: bool        # some pass runs every client model (client evaluation, selection)


def _parts(experiment: Any) -> _Parts:
  algo, fed = experiment.algorithm, experiment.ctx.fed
  store, fed.store = fed.store, None    # shapes of device-resident state, nothing allocated
  try:
    shapes = jax.eval_shape(algo.init)
  finally:
    fed.store = store
  d = fed.data
  data = tree_bytes([getattr(d, f.name) for f in dataclasses.fields(d)
                     if isinstance(getattr(d, f.name), jax.Array)])   # NumPy fields: host
  in_shape, in_dtype = tuple(d.input_shape), str(d.model_input_dtype)
  in_bytes = math.prod(in_shape) * np.dtype(in_dtype).itemsize
  cohorts = []
  for cohort, st in zip(fed.cohorts, shapes.clients):
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), st)
    act_train, _ = activation_bytes(cohort.kernels, one.params, one.batch_stats, in_shape,
                                    in_dtype, train=True)
    _, act_peak = activation_bytes(cohort.kernels, one.params, one.batch_stats, in_shape,
                                   in_dtype, train=False)
    cohorts.append(_Cohort(size=cohort.size, row=tree_bytes(one), params=tree_bytes(one.params),
                           train=act_train, peak=act_peak, sample=in_bytes))
  k = max(fed.num_clients, 1)
  return _Parts(data=data, cohorts=tuple(cohorts), table_row=tree_bytes(shapes.table) // k,
                server=tree_bytes((shapes.server, shapes.extra)),
                public=int(getattr(d, 'x_public', np.zeros(0)).shape[0]),
                classes=int(d.num_classes),
                visits_all=bool(experiment.spec.eval.clients or algo.server_model is None
                                or experiment.spec.selection.method != 'uniform'))


def plan(experiment: Any, **override: Any) -> MemoryPlan:
  """The device memory ``experiment`` needs, per device (see the module docstring).

  Args:
    experiment: a built :class:`~fedjax_kd.experiment.Experiment` (nothing initialised).
    **override: settings to plan for instead of the spec's, for the advice: ``store``
      (``'device'|'host'|'disk'``), ``num_clients``, ``eval_chunk``.

  Returns:
    A :class:`MemoryPlan`.
  """
  return _plan(experiment.spec, _parts(experiment), **override)


def _plan(spec: Any, parts: _Parts, *, store: str | None = None, num_clients: int | None = None,
          eval_chunk: int | None = None) -> MemoryPlan:
  store = store or spec.clients.store
  k0 = spec.clients.num_clients
  k = num_clients or k0
  scale = k / k0                                   # fewer clients: fewer rows, same models
  devices = max(len(jax.devices()), 1)
  multiple = devices if devices > 1 else 1
  per_round = min(k, max(1, round(_round_clients(spec) * scale)))
  chunk = eval_chunk or spec.eval.chunk
  batch = max(spec.train.batch_size, spec.distill.batch_size)
  rows = state = step = 0
  for c in parts.cohorts:
    size = max(1, round(c.size * scale))
    rows += size * c.row
    slots = bucket(min(size, per_round), size, multiple)
    read = size if parts.visits_all else slots    # the slots of a prediction/evaluation pass
    if store == 'device':
      state += -(-size // multiple) * c.row
    else:                                         # a round view: the participants' rows only
      state += -(-slots // multiple) * c.row
      read = min(read, spec.clients.store_chunk)  # a stored cohort is read a chunk at a time
    read = -(-read // multiple)
    per_slot = -(-slots // multiple)
    fit = per_slot * (2 * c.row + c.params + batch * (c.train + c.sample))
    predict = read * (chunk * (c.peak + c.sample) + parts.public * parts.classes * 4)
    step = max(step, fit, predict)
  table = parts.table_row * k
  rows += table
  state += table if store == 'device' else parts.table_row * per_round
  runtime = CPU_RUNTIME if jax.local_devices()[0].platform == 'cpu' else 0
  return MemoryPlan(data=parts.data, state=state + parts.server, step=step, store_rows=rows,
                    runtime=runtime, devices=devices)


# ---------------------------------------------------------------- the device's memory
def _read_int(path: str) -> int | None:
  try:
    with open(path) as f:
      text = f.read().strip()
  except OSError:
    return None
  return int(text) if text.isdigit() else None


def host_available() -> int | None:
  """Bytes of host memory this process can still take: ``MemAvailable``, bounded by a cgroup
  (v2 or v1) limit when one is set; None where neither can be read."""
  avail = None
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          avail = int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  for limit_f, used_f in (('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory.current'),
                          ('/sys/fs/cgroup/memory/memory.limit_in_bytes',
                           '/sys/fs/cgroup/memory/memory.usage_in_bytes')):
    limit, used = _read_int(limit_f), _read_int(used_f)
    if limit is not None and used is not None and limit < (1 << 60):
      left = max(limit - used, 0)
      avail = left if avail is None else min(avail, left)
  return avail


def device_memory() -> tuple[int | None, str]:
  """``(bytes, what)`` the run may use on one device: an accelerator's allocator limit, or
  on a CPU the host memory still available plus what the process's arrays already hold."""
  dev = jax.local_devices()[0]
  stats = None
  try:
    stats = dev.memory_stats()
  except Exception:  # pylint: disable=broad-except
    pass
  if stats and stats.get('bytes_limit'):
    return int(stats['bytes_limit']), f'{dev.device_kind} memory'
  avail = host_available()
  if avail is None:
    return None, 'host memory'
  held = sum(a.nbytes for a in jax.live_arrays())
  return avail + held, 'host memory available'


# ---------------------------------------------------------------- refuse, with advice
def advice(experiment: Any, limit: int, parts: _Parts | None = None) -> str:
  """The settings whose estimate fits in ``limit`` bytes, ``'; or '``-joined: a client
  store, a smaller ``eval.chunk``, the most clients that fit ('' when none does)."""
  spec = experiment.spec
  parts = parts or _parts(experiment)
  cpu = jax.local_devices()[0].platform == 'cpu'
  fits = []
  if spec.clients.store == 'device':
    for store in (('disk',) if cpu else ('host', 'disk')):
      p = _plan(spec, parts, store=store)
      if p.total <= limit:
        where = 'on disk' if store == 'disk' else 'in host memory'
        fits.append(f'--config.clients.store={store} ({fmt(p.total)}; client states '
                    f'{fmt(p.store_rows)} {where})')
        break
  chunk = spec.eval.chunk
  while chunk > 16:
    chunk //= 2
    p = _plan(spec, parts, eval_chunk=chunk)
    if p.total <= limit:
      fits.append(f'--config.eval.chunk={chunk} ({fmt(p.total)})')
      break
  lo, hi = 0, spec.clients.num_clients    # the most clients that fit, by bisection
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if _plan(spec, parts, num_clients=mid).total <= limit else (lo, mid)
  if lo >= 2:
    fits.append(f'--config.clients.num_clients={lo} or fewer')
  return '; or '.join(fits)


def check(experiment: Any, *, limit: int | None = None) -> MemoryPlan:
  """The run's :class:`MemoryPlan`; raises DeviceMemoryError if it exceeds the device.

  Args:
    experiment: a built experiment, before its state is initialised.
    limit: bytes per device (default: :func:`device_memory`; None there: nothing is checked).

  Raises:
    DeviceMemoryError: one line with the estimate, the device's memory and what would fit.
  """
  parts = _parts(experiment)
  p = _plan(experiment.spec, parts)
  what = 'the given limit'
  if limit is None:
    limit, what = device_memory()
  if limit is not None and p.total > limit:
    per = ' per device' if p.devices > 1 else ''
    fits = advice(experiment, limit, parts)
    fits = (f'would fit: {fits}' if fits else 'none of a client store, a smaller eval.chunk '
            'or fewer clients would fit: use a device with more memory')
    raise DeviceMemoryError(
        f'this run needs about {p.describe()}{per}, more than the {fmt(limit)} of {what}; '
        f'{fits} (--nomemory_check runs it anyway)')
  return p


def exhausted_advice(experiment: Any, error: BaseException) -> DeviceMemoryError:
  """The one-line error for a device that ran out of memory mid-run (XLA's
  ``RESOURCE_EXHAUSTED``): XLA's own first line, the estimate, the settings whose estimate
  is half of it (the process's own memory aside), and how to go on."""
  limit, what = device_memory()
  first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
  try:
    parts = _parts(experiment)
    p = _plan(experiment.spec, parts)
    fits = advice(experiment, p.runtime + (p.total - p.runtime) // 2, parts)
    est = f'the estimate was {p.describe()}' + (f'; settings that halve it: {fits}' if fits
                                                else '')
  except Exception:  # pylint: disable=broad-except
    est = 'no estimate could be made'
  mem = f' ({fmt(limit)} of {what})' if limit else ''
  return DeviceMemoryError(
      f'out of device memory{mem}: {first}; {est}. The newest checkpoint is kept: rerun the '
      'same command once the device is free, or change a setting in a new --workdir')


def is_exhausted(error: BaseException) -> bool:
  """Whether ``error`` is XLA running out of device memory (not a full disk)."""
  text = str(error)
  return ('RESOURCE_EXHAUSTED' in text and 'No space left on device' not in text
          and 'OCDBT' not in text) or 'Out of memory' in text


def enabled() -> bool:
  """Whether the check runs (``$FEDJAX_KD_MEMORY_CHECK=0`` turns it off)."""
  return os.environ.get('FEDJAX_KD_MEMORY_CHECK', '1').lower() not in ('0', 'off', 'false', 'no')
