"""Multi-host runs on JAX's own multi-controller runtime.

Every host runs the same program (``python -m fedjax_kd.main ...``) and calls
:func:`initialize` once, before any computation: it starts
``jax.distributed.initialize`` (the coordinator service on process 0, gRPC
heartbeats, cross-process collectives), after which ``jax.devices()`` lists the
devices of *all* processes and the client mesh
(:func:`fedjax_kd.core.kernels.client_mesh`) spans them. There is no transport
of our own: the kernels are SPMD programs and XLA moves the data.

The three settings (coordinator address, process count, process id) come from
flags, or JAX detects them itself on managed clusters (Cloud TPU pods, SLURM,
Open MPI, Kubernetes). A single-process run calls nothing here and stays as it
was.

The rest of the module holds the small helpers the runner and the checkpoints
use to stay correct across processes: :func:`is_primary` says which process
writes files; :func:`globalize`, :func:`abstract_global` and :func:`localize`
move small server-side values between process-local and global arrays for
orbax. The data arrays need no such step: every process loads the same data,
and a kernel receives them as replicated inputs (placing them as global arrays
once was measured and changed nothing). Each device runs its own slice of the
client slots under ``jax.shard_map`` (:func:`fedjax_kd.core.kernels.over_slots`),
so the only cross-process traffic of a kernel is gathering its results.

A lost process (killed, crashed, its host gone) ends the others with exit
code :data:`fedjax_kd.running.watchdog.EXIT_LOST` and one line on stderr naming it,
within :data:`fedjax_kd.running.watchdog.HEARTBEAT_TIMEOUT_S` seconds (docs/multihost.md,
"When a process is lost"): :func:`initialize` starts :mod:`fedjax_kd.running.watchdog`,
which does that.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np

from fedjax_kd.errors import ConfigError
from fedjax_kd.running import watchdog

# Environment variables by which JAX's cluster plugins recognise a managed
# multi-process job (their source is jax/_src/clusters; nothing of it is imported
# here, the variables are read): Cloud TPU pods (GKE and multislice), Open MPI's
# mpirun, SLURM with more than one task.
_AUTO_ENV = ('TPU_WORKER_HOSTNAMES', 'TPU_PROCESS_ADDRESSES', 'MEGASCALE_COORDINATOR_ADDRESS',
             'OMPI_MCA_orte_hnp_uri')
MODES = ('auto', 'on', 'off')


def _cluster_detected() -> bool:
  """Whether the environment names a multi-process job JAX can bootstrap itself."""
  if any(os.environ.get(v) for v in _AUTO_ENV):
    return True
  try:
    return 'SLURM_JOB_ID' in os.environ and int(os.environ.get('SLURM_NTASKS', '1')) > 1
  except ValueError:
    return False


def _parse_device_ids(local_device_ids: str | Sequence[int] | None) -> list[int] | None:
  if local_device_ids is None or local_device_ids == '':
    return None
  if isinstance(local_device_ids, str):
    try:
      return [int(s) for s in local_device_ids.split(',') if s.strip()]
    except ValueError:
      raise ConfigError('--local_device_ids', local_device_ids,
                        'comma-separated device ordinals, e.g. 0,1') from None
  return [int(i) for i in local_device_ids]


def check_flags(coordinator_address: str | None, num_processes: int | None,
                process_id: int | None, mode: str = 'auto') -> bool:
  """Validates the launch flags; returns whether any of them was given.

  Args:
    coordinator_address: ``host:port`` of process 0's coordinator service.
    num_processes: total number of processes.
    process_id: this process's id in ``[0, num_processes)``.
    mode: ``'auto'``, ``'on'`` or ``'off'`` (see :func:`initialize`).

  Returns:
    True when the three flags are given (explicit multi-process launch).

  Raises:
    ConfigError: naming the first bad flag (only some of the three given, a
      count below 1, an id out of range, an address without a port, or flags
      combined with ``--distributed=off``).
  """
  if mode not in MODES:
    raise ConfigError('--distributed', mode, MODES)
  given = {'--coordinator_address': coordinator_address, '--num_processes': num_processes,
           '--process_id': process_id}
  present = [k for k, v in given.items() if v is not None]
  if not present:
    return False
  if mode == 'off':
    raise ConfigError('--distributed', mode, f"'auto' or 'on' when {present[0]} is given")
  if len(present) < 3 and mode != 'on':
    missing = [k for k in given if k not in present][0]
    raise ConfigError(missing, None, f'a value: {", ".join(present)} given, so a multi-host '
                      'launch needs --coordinator_address, --num_processes and --process_id '
                      '(or --distributed=on to let JAX detect the rest)')
  if num_processes is not None and num_processes < 1:
    raise ConfigError('--num_processes', num_processes, 'an integer >= 1')
  if process_id is not None and process_id < 0:
    raise ConfigError('--process_id', process_id, 'an integer >= 0')
  if process_id is not None and num_processes is not None and process_id >= num_processes:
    raise ConfigError('--process_id', process_id,
                      f'an integer in [0, {num_processes}) (--num_processes={num_processes})')
  if coordinator_address is not None:
    host, _, port = coordinator_address.rpartition(':')
    if not host or not port.isdigit():
      raise ConfigError('--coordinator_address', coordinator_address,
                        'host:port of process 0, e.g. 10.0.0.1:1234')
  return len(present) == 3


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: str | Sequence[int] | None = None,
               mode: str = 'auto') -> tuple[int, int]:
  """Joins the multi-controller runtime when this is a multi-host launch.

  ``mode='auto'`` (default) calls ``jax.distributed.initialize`` when the three
  flags are given or the environment names a managed multi-process job (Cloud
  TPU pod, SLURM with several tasks, ``mpirun``); ``'on'`` always calls it and
  lets JAX detect whatever the flags leave out (e.g. on a Cloud TPU VM slice
  whose settings come from the metadata server); ``'off'`` never does. Must
  run before anything touches a device.

  A multi-process run also gets what ends it cleanly when a process is lost
  (:mod:`fedjax_kd.running.watchdog`): JAX's heartbeat timeout set to
  :func:`fedjax_kd.running.watchdog.heartbeat_timeout`, the runtime's C++ log silenced, its
  aborts turned into one line and exit code :data:`fedjax_kd.running.watchdog.EXIT_LOST`, and
  a heartbeat of its own that names the lost process.

  Args:
    coordinator_address: ``host:port`` of process 0 (it listens there).
    num_processes: total number of processes.
    process_id: this process's id.
    local_device_ids: devices this process drives (``'0,1'`` or a list);
      default all of the host's.
    mode: ``'auto'``, ``'on'`` or ``'off'``.

  Returns:
    ``(process_index, process_count)``; ``(0, 1)`` for a single-process run.

  Raises:
    ConfigError: inconsistent flags (see :func:`check_flags`), or a bad
      ``$FEDJAX_KD_HEARTBEAT_TIMEOUT_S``.
  """
  explicit = check_flags(coordinator_address, num_processes, process_id, mode)
  ids = _parse_device_ids(local_device_ids)
  if mode == 'off' or not (explicit or mode == 'on' or _cluster_detected()):
    if ids is not None:
      raise ConfigError('--local_device_ids', local_device_ids,
                        'unset in a single-process run (use CUDA_VISIBLE_DEVICES)')
    return 0, 1
  if jax.distributed.is_initialized():
    return jax.process_index(), jax.process_count()
  platforms = os.environ.get('JAX_PLATFORMS', '') or str(jax.config.jax_platforms or '')
  if 'cpu' in platforms.split(','):
    # Cross-process collectives on CPU (tests, laptops): gloo over TCP.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  timeout = watchdog.heartbeat_timeout()
  watchdog.arm(coordinator_address, num_processes, process_id)   # a failure to join, too
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             local_device_ids=ids,
                             initialization_timeout=watchdog.JOIN_TIMEOUT_S,
                             heartbeat_timeout_seconds=timeout)
  watchdog.start(timeout)   # a multi-process run: the heartbeat that names a lost process
  return jax.process_index(), jax.process_count()


def is_multiprocess() -> bool:
  """Whether more than one process takes part in the run."""
  return jax.process_count() > 1


def is_primary() -> bool:
  """Whether this process writes the workdir files and prints progress."""
  return jax.process_index() == 0


def _all_devices_replicated():
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  return NamedSharding(Mesh(np.asarray(jax.devices()), ('all',)), PartitionSpec())


def globalize(tree: Any) -> Any:
  """Process-local arrays of ``tree`` as global arrays replicated on all devices.

  Orbax saves only global arrays in a multi-host run; the engine keeps small
  server-side values (counters, flags, caches) as ordinary single-device
  arrays, identical on every process. A no-op in a single-process run.
  """
  if not is_multiprocess():
    return tree
  sharding = _all_devices_replicated()

  def one(a):
    if isinstance(a, jax.Array) and a.is_fully_addressable:
      host = np.asarray(a)
      return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
    return a

  return jax.tree.map(one, tree)


def abstract_global(like: Any) -> Any:
  """Restore targets: :func:`globalize`'s sharding for process-local leaves of ``like``."""
  if not is_multiprocess():
    return like
  sharding = _all_devices_replicated()

  def one(a):
    if isinstance(a, jax.ShapeDtypeStruct) and a.sharding is not None and (
        a.sharding.is_fully_addressable):
      return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
    return a

  return jax.tree.map(one, like)


def localize(tree: Any, like: Any) -> Any:
  """Gives restored leaves the placement of ``like``'s leaves.

  Undoes :func:`globalize` (a leaf local in ``like`` becomes local again), and a
  leaf that was *uncommitted* in ``like`` (an ordinary ``jnp`` array) becomes
  uncommitted again: orbax restores onto a committed single-device sharding,
  which a jitted kernel on a multi-device mesh would refuse.
  """
  def one(a, ref):
    if not (isinstance(ref, jax.Array) and isinstance(a, jax.Array)):
      return a
    if not ref.is_fully_addressable:
      return a
    local = a.addressable_data(0) if not a.is_fully_addressable else a
    if getattr(ref, '_committed', True):
      return local if local.sharding == ref.sharding else jax.device_put(local, ref.sharding)
    return jax.numpy.asarray(np.asarray(local))   # uncommitted, like the original

  return jax.tree.map(one, tree, like)
