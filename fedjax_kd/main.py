r"""Command-line entry point.

  python -m fedjax_kd.main --config=configs/default.py --workdir=/tmp/run
  python -m fedjax_kd.main --config=configs/default.py --config.rounds=5 \
      --config.clients.num_clients=20

Any config field can be overridden with ``--config.<field>=value``.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.errors import ConfigError, DataError

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a config file.',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory (default: runs/<algorithm>).')
_RESUME = flags.DEFINE_bool('resume', True, 'Resume from a checkpoint in --workdir if present.')
_PROGRESS = flags.DEFINE_bool('progress', True, 'Print one progress line per round.')


def main(argv):
  del argv
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.WARNING)  # no TPU-probe noise
  if _CONFIG.value is None:
    raise app.UsageError('--config=configs/<name>.py is required')
  try:
    spec = config_lib.validate(_CONFIG.value)
    workdir = _WORKDIR.value or f'runs/{spec.algorithm}'
    runner.run(spec, workdir, resume=_RESUME.value, progress=_PROGRESS.value)
  except (ConfigError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
