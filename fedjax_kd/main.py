r"""Command-line entry point.

  python -m fedjax_kd.main --config=configs/default.py --workdir=/tmp/run
  python -m fedjax_kd.main --config=configs/default.py --config.rounds=5 \
      --config.clients.num_clients=20

Any config field can be overridden with ``--config.<field>=value``. Rerunning
the same command on the same ``--workdir`` resumes from its newest checkpoint.

Multi-host (see docs/multihost.md): run the same command on every host, adding
``--coordinator_address=HOST0:PORT --num_processes=N --process_id=I`` where JAX
cannot detect them (it does on Cloud TPU pods, SLURM and mpirun). Process 0
writes the workdir and prints progress; all processes run every round.

Exit codes: 0 done; 2 bad config or data (nothing ran); 3 a round produced
NaN/Inf (the last good checkpoint is kept); 130/143 stopped by SIGINT/SIGTERM
after checkpointing (rerun to resume).
"""

from __future__ import annotations

import logging
import signal
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from fedjax_kd import config as config_lib
from fedjax_kd import distributed
from fedjax_kd import runner
from fedjax_kd.errors import ConfigError, DataError, DivergenceError

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory (default: runs/<algorithm>).')
_RESUME = flags.DEFINE_bool('resume', True, 'Resume from a checkpoint in --workdir if present.')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Print one progress line per round.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'Multi-host: host:port of process 0 (jax.distributed).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Multi-host: number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Multi-host: this process\'s id.')
_LOCAL_DEVICE_IDS = flags.DEFINE_string(
    'local_device_ids', None, 'Multi-host: devices this process drives, e.g. 0,1.')
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed', 'auto', list(distributed.MODES),
    'auto: join jax.distributed when the flags above are given or JAX can detect a cluster '
    '(TPU pod, SLURM, mpirun); on: always (JAX detects what the flags leave out); off: never.')


def main(argv):
  del argv
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.WARNING)  # no TPU-probe noise
  if not flags.FLAGS['verbosity'].present:   # orbax logs every save at INFO
    absl_logging.set_verbosity(absl_logging.WARNING)
  if _CONFIG.value is None:
    raise app.UsageError('--config=configs/<name>.py is required')
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                           _LOCAL_DEVICE_IDS.value, _DISTRIBUTED.value)
    spec = config_lib.validate(_CONFIG.value)
    workdir = _WORKDIR.value or f'runs/{spec.algorithm}'
    primary = distributed.is_primary()   # process 0 prints; the others stay quiet
    summary = runner.run(spec, workdir, resume=_RESUME.value,
                         progress=_PROGRESS.value and primary,
                         log=None if primary else (lambda s: None))
  except (ConfigError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  except DivergenceError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(3)
  if summary.get('stopped_by'):   # SIGINT/SIGTERM: checkpointed, resumable
    sys.exit(128 + signal.Signals[summary['stopped_by']].value)


if __name__ == '__main__':
  app.run(main)
