"""Device-memory planning: what a run needs, worked out from its experiment before anything
of the run compiles, the clients each per-client phase runs at once (``clients.chunk``), and
a one-line refusal (with what would fit) when the device cannot hold it.

A run's device memory has three parts, and a fourth on a CPU:

* **data**: the device-resident arrays of the data set (private, public and test inputs and
  labels, the clients' row tables): their exact sizes;
* **state**: everything carried between rounds, the clients' models and optimizer states, the
  algorithm's client table, the server model and its caches: exact, from
  ``jax.eval_shape`` of the algorithm's ``init`` (shapes only, nothing is allocated). With
  ``clients.store='host'|'disk'`` the device holds only a round's participants' rows of the
  per-client parts (the rest lives in host memory or on disk);
* **step**: the largest working set of a round's phases for the clients it runs at once:
  every client program the algorithm declares (``Algorithm.programs``: its training,
  distillation and whatever else its clients run, :mod:`fedjax_kd.core.program`), the
  server's, the prediction and evaluation passes and the initialisation. Each is the
  engine's own kernel program, at the round's shapes, counted by XLA itself:
  :func:`phase_bytes` compiles it for those clients and reads
  ``compiled.memory_analysis()`` (its temporaries and the outputs that do not reuse a
  donated argument, as :func:`xla_figure` counts a round). On a CPU the planner first tries
  :func:`phase_bound`, an upper bound from the traced program that compiles nothing, and
  compiles only where the bound does not fit with room to spare (:func:`choose`);
* **runtime**: on a CPU, where the device is the host, the process's own memory besides
  arrays (compiler, runtime, Python): :data:`CPU_RUNTIME`.

``docs/performance.md`` ("Planning device memory") has the plan against XLA's figure for a
whole round (:func:`xla_figure`) on every shipped config
(``benchmarks/performance/memory_plan.py``). On a GPU the device's memory is XLA's allocator limit;
on a CPU the device is the host, whose memory is what the kernel (and a cgroup limit, in a
container) lets this process still take.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import weakref
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import selection
from fedjax_kd.core import rng
from fedjax_kd.core.federation import bucket  # the engine's slot buckets
from fedjax_kd.core.kernels import CohortKernels, Planned
from fedjax_kd.core.program import Rows
from fedjax_kd.errors import DeviceMemoryError

GIB = 1 << 30
# A CPU process's own memory besides arrays (compiler, runtime, Python): the default config's
# measured peak less its arrays was 518 MB (benchmarks/performance/memory_plan.py, size small).
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


PROBE_COMPILER_OPTIONS = {'xla_backend_optimization_level': 0}

PHASE_KINDS = ('run', 'predict', 'evaluate', 'init')


class Phase(NamedTuple):
  """One kernel program of a round, as the planner counts it.

  Attributes:
    kind: ``'run'`` (a client program, :meth:`CohortKernels.run`), ``'predict'``,
      ``'evaluate'`` or ``'init'`` (:data:`PHASE_KINDS`).
    planned: for ``'run'``, the program and its inputs' shapes
      (:class:`~fedjax_kd.core.kernels.Planned`).
    samples: for ``'predict'``, the shared inputs predicted on; for ``'evaluate'``, the rows
      scored (each client's own, ``per_client``, or a set every client shares).
    chunk: the prediction's or evaluation's rows at a time (``eval.chunk``).
    per_client: ``'evaluate'`` on each client's own rows (``[slots, samples]`` indices).
  """
  kind: str
  planned: Any = None
  samples: int = 0
  chunk: int = 1
  per_client: bool = False


def _sds(shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


def _flat(tree: Any) -> tuple:
  """A hashable form of a pytree of shapes (a cache key)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(_sds(np.shape(a), a.dtype) for a in leaves)


def _phase_program(kernels: Any, input_shape: tuple[int, ...], input_dtype: str, phase: Phase,
                   slots: int, chunk: int | None,
                   rows: int) -> tuple[Callable[..., Any], tuple[Any, ...], tuple[int, ...]]:
  """The kernel program ``phase`` runs for ``slots`` clients, ``chunk`` at a time, of a
  cohort of ``rows`` states: ``(function, argument shapes, donated arguments)``."""
  shape = tuple(input_shape)
  state = kernels.init_shapes(rows, shape, input_dtype)
  keys = jax.eval_shape(lambda: rng.client_keys(jax.random.PRNGKey(0), 1, np.arange(slots),
                                                'train'))
  slot_ids = _sds((slots,), jnp.int32)
  if phase.kind == 'init':
    fn = kernels.init_program(shape, input_dtype)
    init_keys = jax.eval_shape(lambda: jax.random.split(jax.random.PRNGKey(0), rows))
    return fn, (init_keys,), ()
  if phase.kind == 'predict':
    x = _sds((phase.samples,) + shape, input_dtype)
    fn = kernels.predict_program(max(1, min(phase.chunk, phase.samples)), chunk)
    return fn, (state, slot_ids, x, None), ()
  if phase.kind == 'evaluate':
    x = _sds((phase.samples,) + shape, input_dtype)
    y = _sds((phase.samples,), jnp.int32)
    idx = _sds((slots, phase.samples) if phase.per_client else (phase.samples,), jnp.int32)
    fn = kernels.evaluate_program(max(1, min(phase.chunk, phase.samples)),
                                  not phase.per_client, chunk)
    return fn, (state, slot_ids, x, y, idx, _sds((slots,), jnp.int32)), ()
  p = phase.planned
  per = lambda tree: jax.tree.map(lambda a: _sds((slots,) + tuple(a.shape), a.dtype), tree)
  data = p.data
  if data is None:
    data = Rows({}, _sds((1,), jnp.int32), None)
  idx = data.idx if p.shared_rows else per(data.idx)
  args = (state, slot_ids, _sds((slots,), jnp.bool_), keys, idx, _sds((slots,), jnp.int32),
          dict(data.arrays), _sds((slots,), jnp.int32), per(p.row), p.shared)
  fn = kernels.run_program(p.program, shared_rows=p.shared_rows, client_chunk=chunk)
  return fn, args, ((0,) if p.program.writes else ())


@functools.lru_cache(maxsize=512)
def _figure(kernels: Any, input_shape: tuple[int, ...], input_dtype: str, phase: Any,
            slots: int, chunk: int | None, rows: int) -> int:
  fn, args, donate = _phase_program(kernels, input_shape, input_dtype, _unkey(phase), slots,
                                    chunk, rows)
  # LLVM's level 0 on a CPU: half the compile time, and the same buffers (XLA assigns them
  # before code generation).
  options = PROBE_COMPILER_OPTIONS if jax.default_backend() == 'cpu' else None
  m = jax.jit(fn, donate_argnums=donate, compiler_options=options).lower(
      *args).compile().memory_analysis()
  return int(m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes)


def _eqn_bytes(jaxpr: Any) -> int:
  """Bytes of every value a jaxpr makes, its sub-programs' included (a loop's body once, a
  branch's largest), plus each convolution's patches (a convolution lowered as a matrix
  product of ``out_positions x window*features`` patches)."""
  n = 0
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      aval = getattr(v, 'aval', None)
      if hasattr(aval, 'shape') and hasattr(aval, 'dtype'):   # (a PRNG key's too)
        n += math.prod(aval.shape) * aval.dtype.itemsize
    subs = [u.jaxpr if hasattr(u, 'jaxpr') and hasattr(u, 'consts') else u
            for v in eqn.params.values() for u in (v if isinstance(v, (tuple, list)) else (v,))
            if hasattr(u, 'eqns') or (hasattr(u, 'jaxpr') and hasattr(u, 'consts'))]
    sizes = [_eqn_bytes(sub) for sub in subs]
    n += (max(sizes, default=0) if eqn.primitive.name == 'cond' else sum(sizes))
    if eqn.primitive.name == 'conv_general_dilated':
      rhs, out = eqn.invars[1].aval, eqn.outvars[0].aval
      dims = eqn.params['dimension_numbers']
      features = out.shape[dims.out_spec[1]]
      n += ((math.prod(out.shape) // features) * (math.prod(rhs.shape) // features)
            * out.dtype.itemsize)
  return n


@functools.lru_cache(maxsize=512)
def _bound(kernels: Any, input_shape: tuple[int, ...], input_dtype: str, phase: Any,
           slots: int, chunk: int | None, rows: int) -> int:
  fn, args, _ = _phase_program(kernels, input_shape, input_dtype, _unkey(phase), slots, chunk,
                               rows)
  return _eqn_bytes(jax.make_jaxpr(fn)(*args).jaxpr)


def _key(phase: Phase) -> Any:
  """``phase`` in a hashable form (its shapes flattened), for the caches."""
  p = phase.planned
  if p is None:
    return phase
  flat = _flat((p.data, p.row, p.shared))
  return phase._replace(planned=(p.program, p.shared_rows, p.server, flat))


def _unkey(key: Any) -> Phase:
  if key.planned is None:
    return key
  program, shared_rows, server, (treedef, leaves) = key.planned
  data, row, shared = jax.tree.unflatten(treedef, leaves)
  return key._replace(planned=Planned(program, data, row, shared, shared_rows, server))


def _check_kind(phase: Phase) -> None:
  if phase.kind not in PHASE_KINDS:
    raise ValueError(f'kind={phase.kind!r}: expected one of {PHASE_KINDS}')


def phase_bytes(kernels: Any, input_shape: tuple[int, ...], input_dtype: str, phase: Phase,
                slots: int, chunk: int | None = None, rows: int | None = None,
                optimizers_key: Any = None) -> int:
  """XLA's own figure (``compiled.memory_analysis()``: temporaries, and outputs that do not
  reuse a donated argument) for the kernel program ``phase`` runs for ``slots`` clients of a
  cohort of ``rows`` states (default ``slots``), ``chunk`` clients at a time (None: all).

  The planner compiles the engine's own programs at the run's shapes, not a model of them:
  XLA's figure is not a multiple of one client's (one client is another program, and from
  two on the figure grows by a little more than a line), and XLA's fusion and its lowering of
  convolutions decide what a step holds. Each is compiled once per process and setting, at
  the CPU's lowest backend optimisation (the same buffers: XLA assigns them before code
  generation); the run's own compilation of the same program then comes from the persistent
  compilation cache where one is on.

  Args:
    kernels: the cohort's :class:`~fedjax_kd.core.kernels.CohortKernels` (its module,
      optimizers, compute dtype and input map; a mesh is not used: the figure is one
      device's, for the clients that device runs).
    input_shape, input_dtype: one sample's model input.
    phase: the :class:`Phase`.
    slots: the clients the program runs (on one device).
    chunk: clients at a time (``clients.chunk``); None: all.
    rows: the cohort's state rows (a donated state's are not counted).
    optimizers_key: a hashable value that fixes the kernels' optimizers (the run's optimizer
      options): another build of the same experiment then reuses the figure (a test suite
      builds hundreds). None: only these kernels' own.
  """
  _check_kind(phase)
  kernels = _planning_kernels(kernels, optimizers_key)
  return _figure(kernels, tuple(input_shape), str(input_dtype), _key(phase), int(slots),
                 None if chunk is None else int(chunk), int(rows or slots))


def phase_bound(kernels: Any, input_shape: tuple[int, ...], input_dtype: str, phase: Phase,
                slots: int, chunk: int | None = None, rows: int | None = None,
                optimizers_key: Any = None) -> int:
  """An upper bound on :func:`phase_bytes`, from the program's trace, nothing compiled:
  every value it makes held at once (no buffer reused, nothing fused; a loop's body once)
  plus each convolution's patches. It costs a trace (a tenth to a few tenths of a second)
  where :func:`phase_bytes` costs a compilation (up to seconds on a CPU), and it is 2 to 40
  times XLA's figure (``tests/test_memory.py`` holds it above XLA's figure on every model of
  the zoo): the planner uses it to see at once that a run fits with room to spare
  (:func:`choose`), and asks XLA only where it might not. Arguments as :func:`phase_bytes`."""
  _check_kind(phase)
  kernels = _planning_kernels(kernels, optimizers_key)
  return _bound(kernels, tuple(input_shape), str(input_dtype), _key(phase), int(slots),
                None if chunk is None else int(chunk), int(rows or slots))


_PLANNING_KERNELS: dict = {}                       # by model and optimizers' options
_ONE_DEVICE = weakref.WeakKeyDictionary()          # by a mesh's kernels


def _planning_kernels(kernels: CohortKernels, optimizers_key: Any = None) -> CohortKernels:
  """Kernels of the same model, optimizers, precision and inputs on one device (no mesh):
  the programs a device runs for its own clients; one object for every build of the same
  experiment where ``optimizers_key`` names its optimizers (the caches key on it)."""
  one_device = lambda: CohortKernels(kernels.module, kernels.optimizers, mesh=None,
                                     compute_dtype=kernels.compute_dtype,
                                     normalize=kernels.normalize)
  if optimizers_key is None:
    if kernels.mesh is None:
      return kernels
    if kernels not in _ONE_DEVICE:
      _ONE_DEVICE[kernels] = one_device()
    return _ONE_DEVICE[kernels]
  key = (kernels.module, kernels.compute_dtype, kernels.normalize, optimizers_key)
  if key not in _PLANNING_KERNELS:
    if len(_PLANNING_KERNELS) >= 64:
      _PLANNING_KERNELS.clear()
    _PLANNING_KERNELS[key] = one_device()
  return _PLANNING_KERNELS[key]


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """A run's estimated device memory, per device, in bytes.

  Attributes:
    data: the device-resident data, and the buffers the algorithm keeps between rounds
      (``Algorithm.planned_buffers``).
    state: the state carried between rounds that the device holds.
    step: the largest compiled step's working set.
    store_rows: per-client state bytes of all clients (what ``clients.store='host'|'disk'``
      moves off the device), for the advice.
    runtime: on a CPU, where the device is the host, what the process itself takes besides
      arrays (the compiler, XLA's runtime and thread pools, Python): :data:`CPU_RUNTIME`.
    devices: the devices the clients are spread over.
    chunk: the clients each device runs at once in a per-client phase (``clients.chunk``);
      None: all of a phase's slots.
    slots: the most clients a phase runs on one device (the chunk's upper end).
    phase: the phase of the largest step (training, prediction, evaluation, initialisation).
    bound: the phases are counted by :func:`phase_bound` (an upper bound; the run needs at
      most ``total``), not by XLA's figure (:func:`phase_bytes`; it needs about ``total``).
  """
  data: int
  state: int
  step: int
  store_rows: int
  runtime: int = 0
  devices: int = 1
  chunk: int | None = None
  slots: int = 1
  phase: str = ''
  bound: bool = False

  @property
  def total(self) -> int:
    return self.data + self.state + self.step + self.runtime

  @property
  def about(self) -> str:
    """``'about 539 MiB'``, or ``'at most 1.2 GiB'`` for a bound."""
    return f"{'at most' if self.bound else 'about'} {fmt(self.total)}"

  def describe(self) -> str:
    runtime = f', runtime {fmt(self.runtime)}' if self.runtime else ''
    phase = f' ({self.phase})' if self.phase else ''
    return (f'{fmt(self.total)} (data {fmt(self.data)}, state {fmt(self.state)}, largest '
            f'step {fmt(self.step)}{phase}{runtime})')

  def choice(self) -> str:
    """The clients at once it plans for, for the run's header: ``'all clients at once'`` or
    ``'clients 25 at a time (of 100 a phase)'`` (per device where there are several)."""
    per = ' per device' if self.devices > 1 else ''
    if self.chunk is None or self.chunk >= self.slots:
      return f'all clients at once{per}'
    return f'clients {self.chunk} at a time{per} (of {self.slots} a phase)'


def _round_clients(spec: Any) -> int:
  """The most clients a round can train: ``selection.m`` (or ``participation`` of K)."""
  k = spec.clients.num_clients
  if spec.clients.participation >= 1.0:
    return k
  m = max(spec.selection.m, math.ceil(spec.clients.participation * k))
  return min(k, m)


class _Cohort(NamedTuple):
  """One cohort's sizes: clients, bytes per client, and its phases' working sets."""
  size: int               # clients
  row: int                # state per client (parameters, statistics, optimizer states)
  figure: Callable[..., int]   # (phase, slots, chunk, rows) -> phase_bytes
  bound: Callable[..., int]    # (phase, slots, chunk, rows) -> phase_bound


@dataclasses.dataclass(frozen=True)
class _Parts:
  """What :func:`plan` works from (kept so the advice can re-plan other settings)."""
  data: int
  cohorts: tuple[_Cohort, ...]
  table_row: int          # client-table bytes per client
  server: int             # server model + extra
  public: int             # public samples a round predicts on (0: the round predicts none)
  scored: int             # the rows an evaluation pass scores a client model on
  per_client_test: bool   # each client scores on its own test rows
  visits_all: bool        # some pass runs every client model (client evaluation, selection)
  programs: tuple = ()    # the client programs a round runs (Planned), each cohort runs
  server_phases: tuple = ()   # (name, figure, bound) of the server's programs and passes


def resident_data(algo: Any, data: Any) -> int:
  """Bytes of the federation's device-resident data (``data``'s JAX arrays; its NumPy
  fields live on the host) and of the buffers ``algo`` keeps between rounds
  (``Algorithm.planned_buffers``)."""
  arrays = [getattr(data, f.name) for f in dataclasses.fields(data)
            if isinstance(getattr(data, f.name), jax.Array)]
  return tree_bytes(arrays) + tree_bytes(algo.planned_buffers())


def _parts(experiment: Any) -> _Parts:
  algo, fed = experiment.algorithm, experiment.ctx.fed
  store, fed.store = fed.store, None    # shapes of device-resident state, nothing allocated
  try:
    shapes = jax.eval_shape(algo.init)
  finally:
    fed.store = store
  d = fed.data
  data = resident_data(algo, d)
  in_shape, in_dtype = tuple(d.input_shape), str(d.model_input_dtype)
  spec = experiment.spec
  programs = tuple(algo.programs(shapes))
  # The run's optimizer options fix its kernels' optimizers: a build of the same experiment
  # reuses what an earlier one planned.
  opt = (spec.train, spec.distill.optimizer)
  cohorts = []
  for cohort, st in zip(fed.cohorts, shapes.clients):
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), st)
    cohorts.append(_Cohort(
        size=cohort.size, row=tree_bytes(one),
        figure=functools.partial(phase_bytes, cohort.kernels, in_shape, in_dtype,
                                 optimizers_key=opt),
        bound=functools.partial(phase_bound, cohort.kernels, in_shape, in_dtype,
                                optimizers_key=opt)))
  k = max(fed.num_clients, 1)
  # A round predicts on its open samples (distill.public_per_round of the public set);
  # evaluation scores each client model on its own test rows or on the whole test set.
  public = 0
  if algo.uses_public:
    public = min(int(getattr(d, 'x_public', np.zeros(0)).shape[0]),
                 spec.distill.public_per_round)
  per_client_test = bool(spec.data.per_client_test and d.test_idx is not None)
  scored = int(d.test_idx.shape[-1] if per_client_test else d.x_test.shape[0])
  # The server's programs and its evaluation, one model each (the server's kernels, or the
  # clients' for a server model of their spec).
  server_kernels = (algo.server_model.kernels if algo.server_model is not None
                    else fed.cohorts[0].kernels)
  phases = [Phase('run', p) for p in programs if p.server]
  if algo.server_model is not None:
    phases.append(Phase('evaluate', samples=int(d.x_test.shape[0]), chunk=spec.eval.chunk))
  server_phases = tuple(
      ("the server's " + _phase_name(ph),
       functools.partial(phase_bytes, server_kernels, in_shape, in_dtype, ph, 1,
                         optimizers_key=opt),
       functools.partial(phase_bound, server_kernels, in_shape, in_dtype, ph, 1,
                         optimizers_key=opt))
      for ph in phases)
  return _Parts(data=data, cohorts=tuple(cohorts), table_row=tree_bytes(shapes.table) // k,
                server=tree_bytes((shapes.server, shapes.extra)), public=public,
                scored=scored, per_client_test=per_client_test,
                visits_all=bool(spec.eval.clients or algo.server_model is None
                                or selection.METHODS[spec.selection.method].needs_losses),
                programs=tuple(p for p in programs if not p.server),
                server_phases=server_phases)


def plan(experiment: Any, **override: Any) -> MemoryPlan:
  """The device memory ``experiment`` needs, per device (see the module docstring).

  Args:
    experiment: a built :class:`~fedjax_kd.running.experiment.Experiment` (nothing initialised).
    **override: settings to plan for instead of the spec's, for the advice: ``store``
      (``'device'|'host'|'disk'``), ``num_clients``, ``eval_chunk``, ``client_chunk`` (None:
      all at once); and ``bound=True`` counts the phases by their bound (:func:`phase_bound`,
      nothing compiled) instead of XLA's figure.

  Returns:
    A :class:`MemoryPlan`.
  """
  return _plan(experiment.spec, _parts(experiment), **override)


_SPEC = object()   # an override left at the spec's value


def _phase_name(phase: Phase) -> str:
  if phase.kind == 'run':
    name = type(phase.planned.program).__name__
    return 'training' if name == 'SGD' else f'the {name} program'
  return {'predict': 'prediction', 'evaluate': 'evaluation', 'init': 'initialisation'}[
      phase.kind]


def _plan(spec: Any, parts: _Parts, *, store: str | None = None, num_clients: int | None = None,
          eval_chunk: int | None = None, client_chunk: Any = _SPEC,
          bound: bool = False) -> MemoryPlan:
  store = store or spec.clients.store
  at_once = spec.clients.chunk if client_chunk is _SPEC else client_chunk
  k0 = spec.clients.num_clients
  k = num_clients or k0
  scale = k / k0                                   # fewer clients: fewer rows, same models
  devices = max(len(jax.devices()), 1)
  multiple = devices if devices > 1 else 1
  per_round = min(k, max(1, round(_round_clients(spec) * scale)))
  chunk = eval_chunk or spec.eval.chunk
  rows = state = step = most = 0
  phase = ''

  for c in parts.cohorts:
    figure = c.bound if bound else c.figure
    size = max(1, round(c.size * scale))
    rows += size * c.row
    slots = bucket(min(size, per_round), size, multiple)
    read = size if parts.visits_all else slots    # the slots of an evaluation pass
    held = -(-size // multiple)                   # the cohort's state rows on a device
    if store == 'device':
      state += held * c.row
    else:                                         # a round view: the participants' rows only
      held = -(-slots // multiple)
      state += held * c.row
      read = min(read, spec.clients.store_chunk)  # a stored cohort is read a chunk at a time
    read = -(-read // multiple)
    per_slot = -(-slots // multiple)
    most = max(most, per_slot, read)
    once = lambda n: None if not at_once or at_once >= n else at_once   # clients at once
    # Each phase: XLA's figure for the engine's program over the clients a device runs, at
    # once or in chunks (the gathered states, the loop's carries and outputs included).
    phases = [(Phase('run', p), per_slot) for p in parts.programs]
    if parts.public:
      phases.append((Phase('predict', samples=parts.public, chunk=chunk), per_slot))
    if parts.visits_all:   # (without, evaluation scores the server model alone)
      phases.append((Phase('evaluate', samples=parts.scored, chunk=chunk,
                           per_client=parts.per_client_test), read))
    if store == 'device':   # initialisation builds the cohort's states at once
      phases.append((Phase('init'), held))
    for ph, n in phases:
      b = figure(ph, n, once(n), held if ph.kind != 'init' else None)
      if ph.kind == 'init':   # its outputs are the cohort's states, which `state` counts
        b = max(b - n * c.row, 0)
      if b > step:
        step, phase = b, _phase_name(ph)
  for name, fig, bnd in parts.server_phases:
    b = (bnd if bound else fig)()
    if b > step:
      step, phase = b, name
  table = parts.table_row * k
  rows += table
  state += table if store == 'device' else parts.table_row * per_round
  runtime = CPU_RUNTIME if jax.local_devices()[0].platform == 'cpu' else 0
  return MemoryPlan(data=parts.data, state=state + parts.server, step=step, store_rows=rows,
                    runtime=runtime, devices=devices,
                    chunk=None if at_once is None or at_once >= most else at_once, slots=most,
                    phase=phase, bound=bound)


def _least(spec: Any, parts: _Parts, **override: Any) -> MemoryPlan:
  """The smaller of the plans for one client at a time and all at once: the least
  ``clients.chunk='auto'`` can choose (all at once where the clients' states outweigh their
  activations: a chunked training holds the slots' new states besides their gathered ones)."""
  return min(_plan(spec, parts, client_chunk=1, **override),
             _plan(spec, parts, client_chunk=None, **override), key=lambda p: p.total)


# Where clients.chunk='auto' must choose, the share of the device a plan may fill: room for the
# estimate's error (benchmarks/performance/memory_plan.py measures it) and for what it does not
# count.
HEADROOM = 0.85


def choose(experiment: Any, limit: int | None = None, parts: _Parts | None = None) -> MemoryPlan:
  """The plan of the run, with the clients at once ``clients.chunk`` asks for.

  On a CPU it plans first with :func:`phase_bound`, compiling nothing: where that upper
  bound fits :data:`HEADROOM` of the device (every CPU config the project ships, on a
  machine with a few GiB free), that plan is the run's, and the header says "at most".
  Otherwise (and on an accelerator, where the bound was never held against XLA's figure)
  the plan counts with XLA's figure (:func:`phase_bytes`).

  A number is planned as given. ``'auto'`` takes all of a phase's clients at once where that
  fits :data:`HEADROOM` of the device, else the largest chunk ``ceil(S / n)`` (``S`` the most
  clients a phase runs on a device, ``n = 2, 3, ...``: chunks that divide the slots as evenly
  as they can) whose plan fits; where none does, the smaller of one at a time and all at
  once (:func:`check` then refuses). Each plan compiles its phases (:func:`phase_bytes`),
  so the search does not try every chunk: the line
  through the plans for 2 and for ``S`` clients (XLA's figure grows a little faster than a
  line, so the line errs high between them) names the candidate, whose own plan decides,
  and the next larger candidate is tried once it fits.

  Args:
    experiment: a built experiment (nothing initialised).
    limit: bytes per device (default: :func:`device_memory`; None there: all at once).
    parts: the experiment's measured parts, where the caller has them.

  Returns:
    The :class:`MemoryPlan`; its ``chunk`` is what the federation runs with.
  """
  spec = experiment.spec
  parts = parts or _parts(experiment)
  if limit is None:
    limit, _ = device_memory()
  if jax.local_devices()[0].platform == 'cpu':
    rough = _plan(spec, parts, bound=True)
    if limit is None or rough.total <= HEADROOM * limit:
      return rough
  if spec.clients.chunk is not None:
    return _plan(spec, parts)
  full = _plan(spec, parts, client_chunk=None)
  if limit is None or full.total <= HEADROOM * limit:
    return full
  budget = HEADROOM * limit
  if full.slots <= 2:                    # nothing fits but one at a time, or nothing
    return _least(spec, parts)
  two = _plan(spec, parts, client_chunk=2)
  if two.total > budget:
    return _least(spec, parts)
  candidates = sorted({-(-full.slots // n) for n in range(2, full.slots)} - {1}, reverse=True)
  slope = (full.total - two.total) / (full.slots - 2)
  first = next(j for j, c in enumerate(candidates) if two.total + slope * (c - 2) <= budget
               or c == 2)
  for i in range(first, len(candidates)):   # the candidate's own plan; smaller until one fits
    p = two if candidates[i] == 2 else _plan(spec, parts, client_chunk=candidates[i])
    if p.total <= budget:
      break
  if i == first and i > 0:                   # the next larger one, where the line erred high
    bigger = _plan(spec, parts, client_chunk=candidates[i - 1])
    if bigger.total <= budget:
      return bigger
  return p


# ---------------------------------------------------------------- XLA's own figure
@dataclasses.dataclass(frozen=True)
class XlaFigure:
  """What XLA itself says a run's first round needs (:func:`xla_figure`), per device.

  Attributes:
    data: the device-resident data and the algorithm's kept buffers (exact).
    resident: the data and the initialised state (exact).
    programs: ``{phase: its largest working set}`` over the kernel programs run: their
      temporaries and the outputs that do not reuse a donated argument, from XLA's
      ``compiled.memory_analysis()``.
  """
  data: int
  resident: int
  programs: dict

  @property
  def working_set(self) -> int:
    """The largest working set of a round's programs (initialisation aside)."""
    return max([v for k, v in self.programs.items() if k != 'init'], default=0)

  @property
  def total(self) -> int:
    """The most the device holds at once: the data and initialisation's working set (its
    outputs are the state), or the data, the state and a round program's working set."""
    return max(self.data + self.programs.get('init', 0), self.resident + self.working_set)


def xla_figure(experiment: Any, *, dry: bool = True) -> XlaFigure:
  """XLA's figure for ``experiment``'s first round and evaluation, to hold a plan against.

  Initialises the state, then plays round 1 and the evaluation with every kernel program
  recorded (:func:`fedjax_kd.core.kernels.recording`). ``dry`` (the default) compiles the
  programs without running them (their outputs are zeros), so a paper-sized round costs its
  compilation only; the figures are the same, as XLA plans a program before it runs.

  Compare with the plan's ``total - runtime``: XLA knows nothing of the process around it.
  """
  from fedjax_kd.algorithms import base   # pylint: disable=import-outside-toplevel
  from fedjax_kd.core import kernels      # pylint: disable=import-outside-toplevel
  algo, fed = experiment.algorithm, experiment.ctx.fed
  with kernels.recording(dry=dry) as programs:
    state = base.init_state(algo)
    d = fed.data
    data = resident_data(algo, d)   # the buffers too: round 1 may not hold them yet
    selector = experiment.ctx.selector
    active = selector.plan(1, lambda mask: algo.selection_losses(state, mask)).active
    state, _ = base.play_round(algo, state, 1, active)
    algo.scores(state)
  per: dict[str, int] = {}
  for phase, m in programs.seen:
    n = m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
    per[phase] = max(per.get(phase, 0), n)
  return XlaFigure(data=data, resident=data + tree_bytes(state), programs=per)


# ---------------------------------------------------------------- the device's memory
def release_host() -> bool:
  """Gives back to the system the host memory that freed buffers left in the C library's
  heap (glibc's ``malloc_trim``).

  Setup's temporaries (the data's host copies, a checkpoint's read buffers: restoring one
  took 1.4 GiB besides a 0.5 GiB state) are freed, but glibc keeps freed heap pages of its
  many arenas, so they would stay in the resident set for the whole run; on a CPU, where the
  device is the host, that is the device's memory. Returns False where the C library has no
  ``malloc_trim`` (not glibc): nothing to do there.
  """
  import ctypes  # pylint: disable=g-import-not-at-top
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()   # Python objects in cycles (orbax's) hold buffers until collected
  try:
    trim = ctypes.CDLL(None).malloc_trim
  except (OSError, AttributeError):
    return False
  return bool(trim(0))


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


def _size(text: str) -> int | None:
  """``'20GiB'``, ``'512MiB'`` or a number of bytes; None if it is none of these."""
  text = text.strip().replace(' ', '')
  for unit, size in (('GiB', GIB), ('MiB', 1 << 20), ('KiB', 1 << 10), ('', 1)):
    if text.endswith(unit):
      try:
        return int(float(text[:len(text) - len(unit)] if unit else text) * size)
      except ValueError:
        return None
  return None


def device_memory() -> tuple[int | None, str]:
  """``(bytes, what)`` the run may use on one device: an accelerator's allocator limit, or
  on a CPU the host memory still available plus what the process's arrays already hold;
  ``$FEDJAX_KD_DEVICE_MEMORY`` (e.g. ``24GiB``) caps it, to plan for a smaller device."""
  cap = os.environ.get('FEDJAX_KD_DEVICE_MEMORY', '')
  if cap:
    size = _size(cap)
    if size is None or size <= 0:
      raise DeviceMemoryError(f'FEDJAX_KD_DEVICE_MEMORY={cap!r} is not a size: give bytes or '
                              "a number with GiB, MiB or KiB, e.g. '24GiB'")
    limit, what = _device_memory()
    if limit is None or size < limit:
      return size, 'FEDJAX_KD_DEVICE_MEMORY'
    return limit, what
  return _device_memory()


def _device_memory() -> tuple[int | None, str]:
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
  """The settings whose estimate fits in ``limit`` bytes, ``'; or '``-joined: fewer clients at
  once, a client store, a smaller ``eval.chunk``, the most clients that fit ('' when none
  does). With ``clients.chunk='auto'`` the others are planned with the least 'auto' can
  choose: one client at a time, or all at once where the clients' states outweigh their
  activations."""
  spec = experiment.spec
  parts = parts or _parts(experiment)
  cpu = jax.local_devices()[0].platform == 'cpu'
  fits = []
  planned = functools.partial(_least if spec.clients.chunk is None else _plan, spec, parts)
  if spec.clients.chunk is not None and spec.clients.chunk > 1:
    p = _least(spec, parts)
    if p.total <= limit:
      fits.append(f"--config.clients.chunk=auto ({p.choice()}: {fmt(p.total)})")
  if spec.clients.store == 'device':
    for store in (('disk',) if cpu else ('host', 'disk')):
      p = planned(store=store)
      if p.total <= limit:
        where = 'on disk' if store == 'disk' else 'in host memory'
        fits.append(f'--config.clients.store={store} ({fmt(p.total)}; client states '
                    f'{fmt(p.store_rows)} {where})')
        break
  chunk = spec.eval.chunk
  while chunk > 16:
    chunk //= 2
    p = planned(eval_chunk=chunk)
    if p.total <= limit:
      fits.append(f'--config.eval.chunk={chunk} ({fmt(p.total)})')
      break
  lo, hi = 0, spec.clients.num_clients    # the most clients that fit, by bisection
  while hi - lo > 1:
    mid = (lo + hi) // 2
    fit = planned(num_clients=mid).total <= limit
    lo, hi = (mid, hi) if fit else (lo, mid)
  if lo >= 2:
    fits.append(f'--config.clients.num_clients={lo} or fewer')
  return '; or '.join(fits)


def check(experiment: Any, *, limit: int | None = None) -> MemoryPlan:
  """The run's :class:`MemoryPlan`; raises DeviceMemoryError if it exceeds the device.

  The plan is the one the experiment was built with, or (an experiment being built, as
  :func:`fedjax_kd.running.experiment.build` checks it) :func:`choose`'s: its clients at once
  are what the federation runs.

  Args:
    experiment: a built experiment, before its state is initialised.
    limit: bytes per device (default: :func:`device_memory`; None there: nothing is checked).

  Raises:
    DeviceMemoryError: one line with the estimate, the device's memory and what would fit.
  """
  what = 'the given limit'
  if limit is None:
    limit, what = device_memory()
  p = getattr(experiment, 'memory', None) or choose(experiment, limit)
  if limit is None or p.total <= limit:
    return p
  parts = _parts(experiment)       # (the shapes of the state, once for all that follows)
  if p.bound:                      # XLA's figure decides
    p = _plan(experiment.spec, parts, client_chunk=p.chunk)
  if p.total > limit:
    per = ' per device' if p.devices > 1 else ''
    fits = advice(experiment, limit, parts)
    fits = (f'would fit: {fits}' if fits else 'none of fewer clients at once, a client store, '
            'a smaller eval.chunk or fewer clients would fit: use a device with more memory')
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
    p = _plan(experiment.spec, parts, client_chunk=experiment.ctx.fed.client_chunk)
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
