r"""Command-line entry point (also installed as the ``fedjax-kd`` command).

  fedjax-kd --config=default --workdir=/tmp/run
  python -m fedjax_kd.main --config=configs/default.py --config.rounds=5 \
      --config.clients.num_clients=20

``--config`` takes a config file (``PATH[:ARG]``) or the name of a config shipped
with the package (``default``, ``dsfl_mnist``, ``scarlet_cifar10``, ...; the files of
the repository's ``configs/``, installed as ``fedjax_kd.configs``).

Any config field can be overridden with ``--config.<field>=value``. Rerunning
the same command on the same ``--workdir`` resumes from its newest checkpoint.

Compiled XLA programs are kept in JAX's persistent compilation cache, so a
second run loads them instead of compiling again (docs/performance.md):
``--compilation_cache=DIR``, else ``$FEDJAX_KD_COMPILATION_CACHE``, else
``$JAX_COMPILATION_CACHE_DIR``, else ``~/.cache/fedjax_kd/jax_cache``
(``$XDG_CACHE_HOME`` respected); ``''`` or ``none`` runs without one.

Multi-host (see docs/multihost.md): run the same command on every host, adding
``--coordinator_address=HOST0:PORT --num_processes=N --process_id=I`` where JAX
cannot detect them (it does on Cloud TPU pods, SLURM and mpirun). Process 0
writes the workdir and prints progress; all processes run every round.

Exit codes: 0 done; 2 bad input, one line on stderr naming the flag, field or
file (nothing ran), or a run the device's memory cannot hold (refused before it
compiles, naming the settings that would fit; or out of memory mid-run); 3 a
round produced NaN/Inf (the last good checkpoint is kept); 4 a multi-process run
lost a process (killed, crashed, its host gone; or it exited with an error of its
own): every other process stops within about 10 s (``$FEDJAX_KD_HEARTBEAT_TIMEOUT_S``)
with one line naming it, and rerunning the same command on every process resumes
from the newest checkpoint (docs/multihost.md); 130/143 stopped by SIGINT/SIGTERM
(after a checkpoint where a round was running; rerun to resume).
"""

from __future__ import annotations

import difflib
import logging
import re
import signal
import sys
from typing import Sequence

try:   # a Ctrl-C while the command is still importing ends in one line too
  from absl import app, flags
  from absl import logging as absl_logging
  from ml_collections import config_flags

  from fedjax_kd import config as config_lib
  from fedjax_kd.errors import ConfigError, DataError, DivergenceError
except KeyboardInterrupt:
  print('error: interrupted (Ctrl-C)', file=sys.stderr)
  sys.exit(128 + signal.SIGINT.value)

# JAX and everything that runs it are imported inside cli(), where a Ctrl-C ends in one line.
DISTRIBUTED_MODES = ('auto', 'on', 'off')   # fedjax_kd.running.distributed.MODES


def _define(fv: flags.FlagValues, argv: Sequence[str] = ()) -> None:
  """This command's flags, on ``fv`` (a fresh set per call, so :func:`cli` can be called
  again in one process); ``argv`` is where ml_collections finds the overrides."""
  config_flags.DEFINE_config_file('config', None, 'Path to a config file.', flag_values=fv,
                                  lock_config=True, sys_argv=list(argv))
  flags.DEFINE_string('workdir', None, 'Output directory (default: runs/<algorithm>).',
                      flag_values=fv)
  flags.DEFINE_bool('resume', True, 'Resume from a checkpoint in --workdir if present.',
                    flag_values=fv)
  flags.DEFINE_bool('progress', True, 'Print one progress line per round.', flag_values=fv)
  flags.DEFINE_string('compilation_cache', None,
                      "JAX persistent compilation cache directory (off, none, false or '': "
                      'no cache; default: $FEDJAX_KD_COMPILATION_CACHE, else '
                      '$JAX_COMPILATION_CACHE_DIR, else ~/.cache/fedjax_kd/jax_cache).', flag_values=fv)
  flags.DEFINE_bool('memory_check', True,
                    'Refuse, before anything compiles, a run whose estimated device memory '
                    'exceeds the device\'s (fedjax_kd.running.memory); --nomemory_check runs it anyway.',
                    flag_values=fv)
  flags.DEFINE_string('coordinator_address', None,
                      'Multi-host: host:port of process 0 (jax.distributed).', flag_values=fv)
  flags.DEFINE_integer('num_processes', None, 'Multi-host: number of processes.',
                       flag_values=fv)
  flags.DEFINE_integer('process_id', None, 'Multi-host: this process\'s id.', flag_values=fv)
  flags.DEFINE_string('local_device_ids', None,
                      'Multi-host: devices this process drives, e.g. 0,1.', flag_values=fv)
  flags.DEFINE_enum(
      'distributed', 'auto', list(DISTRIBUTED_MODES),
      'auto: join jax.distributed when the flags above are given or JAX can detect a cluster '
      '(TPU pod, SLURM, mpirun); on: always (JAX detects what the flags leave out); off: never.',
      flag_values=fv)


def _config_args(args: Sequence[str]) -> tuple[str | None, list[tuple[str, str]]]:
  """The ``--config`` path and the ``--config.<field>`` overrides in ``args`` (either
  ``--flag=value`` or ``--flag value``), in order."""
  path, fields = None, []
  for i, a in enumerate(args):
    if not a.startswith('--config'):
      continue
    name, eq, value = a.partition('=')
    if not eq:
      value = args[i + 1] if i + 1 < len(args) else ''
    if name == '--config':
      path = value
    elif name.startswith('--config.'):
      fields.append((name[len('--config.'):], value))
  return path, fields


def _with_config_file(argv: Sequence[str], file: str) -> list[str]:
  """``argv`` with its ``--config`` value replaced by ``file`` (a shipped name resolved)."""
  out, skip = [], False
  for i, a in enumerate(argv):
    if skip:
      skip = False
      continue
    if i > 0 and a == '--config':
      out.append(f'--config={file}')
      skip = True
    elif i > 0 and a.startswith('--config='):
      out.append(f'--config={file}')
    else:
      out.append(a)
  return out


def parse(argv: Sequence[str]) -> flags.FlagValues:
  """Parses the command line (``argv[0]`` is the program) into fresh flag values.

  The config file and every ``--config.<field>`` name are checked before ml_collections
  reads them, so that each mistake is one :class:`ConfigError` naming the flag, the field or
  the file (a misspelt field gets the closest known name).

  Raises:
    ConfigError: no ``--config``; a config file that is missing, does not import, lacks
      ``get_config`` or returns no ConfigDict; an unknown field; a value of the wrong type;
      an unknown flag.
  """
  path, fields = _config_args(argv[1:])
  if not path:
    raise ConfigError('--config', path or '', 'a config file or a shipped config name, e.g. '
                      '--config=default or --config=configs/default.py')
  base = config_lib.load_file(path)
  argv = _with_config_file(argv, config_lib.resolve_path(path))
  for field, value in fields:
    config_lib.check_field_name(base, field, value)
  fv = flags.FlagValues()
  _define(fv, argv)
  try:
    fv(list(argv))
  except flags.UnrecognizedFlagError as e:
    known = sorted(n for n in fv if '.' not in n)
    near = difflib.get_close_matches(e.flagname, known, n=1)
    raise ConfigError(f'--{e.flagname}', (e.flagvalue or '').partition('=')[2],
                      'a flag of this command: ' + ', '.join(f'--{n}' for n in known)
                      + (f' (did you mean --{near[0]}?)' if near else '')) from None
  except flags.Error as e:
    text = ' '.join(str(e).split())
    m = re.match(r'flag (--[\w.]+)=(.*?): (.*)$', text)
    if m:
      raise ConfigError(m[1], m[2], f'a value of the field\'s type ({m[3]})') from None
    raise ConfigError('flags', ' '.join(argv[1:]), f'flags absl can parse ({text})') from None
  except Exception as e:  # pylint: disable=broad-except
    # ml_collections parsing an override: name what it said, on one line.
    raise ConfigError('--config', path, f'a config and overrides ml_collections can read '
                      f'({type(e).__name__}: {" ".join(str(e).split())})') from None
  if fv.config is None:
    raise ConfigError('--config', path, 'a get_config() returning a ConfigDict')
  return fv


def _one_line(e: BaseException) -> str:
  return 'error: ' + ' '.join(str(e).split())


def _exit_on_ctrl_c():
  """Outside the round loop (which takes SIGINT over and stops after a round) a Ctrl-C ends the
  command at once with one line. A KeyboardInterrupt would not do: raised inside a garbage
  collector callback (JAX has one) Python prints it and carries on. Nothing is lost: before
  the first round nothing but whole files has been written. Returns the previous handler
  (None off the main thread, where Python allows no handler)."""
  import os  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  if threading.current_thread() is not threading.main_thread():
    return None

  def handler(signum, frame):
    del signum, frame
    print('error: interrupted (Ctrl-C) outside a round; rerun the same command to resume '
          'from the newest checkpoint, if the workdir has one', file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGINT.value)   # pylint: disable=protected-access

  return signal.signal(signal.SIGINT, handler)


def cli(argv: Sequence[str]) -> int:
  """Runs the command line ``argv`` (``argv[0]`` is the program); returns the exit code.

  Every user error ends here as one ``error: ...`` line on stderr and exit code 2, before
  any compute.
  """
  previous = _exit_on_ctrl_c()
  try:
    from fedjax_kd.running import compile_cache  # pylint: disable=g-import-not-at-top
    from fedjax_kd.running import distributed  # pylint: disable=g-import-not-at-top
    from fedjax_kd import runner  # pylint: disable=g-import-not-at-top
    fv = parse(argv)
    compile_cache.setup(fv.compilation_cache)   # before anything compiles
    distributed.initialize(fv.coordinator_address, fv.num_processes, fv.process_id,
                           fv.local_device_ids, fv.distributed)
    spec = config_lib.validate(fv.config)
    workdir = fv.workdir or f'runs/{spec.algorithm}'
    primary = distributed.is_primary()   # process 0 prints; the others stay quiet
    summary = runner.run(spec, workdir, resume=fv.resume, progress=fv.progress and primary,
                         log=None if primary else (lambda s: None),
                         memory_check=fv.memory_check)
  except (ConfigError, DataError) as e:
    _settle(e)
    print(_one_line(e), file=sys.stderr)
    return 2
  except DivergenceError as e:
    _settle(e)
    print(_one_line(e), file=sys.stderr)
    return 3
  except KeyboardInterrupt:
    # A Ctrl-C before the round loop, or a second one inside it: no traceback.
    print('error: interrupted (Ctrl-C); rerun the same command to resume from the newest '
          'checkpoint, if the run had saved one', file=sys.stderr)
    return 128 + signal.SIGINT.value
  except Exception as e:
    _settle(e)   # a lost process ends this one here (exit 4); else the traceback follows
    raise
  finally:
    if previous is not None:
      signal.signal(signal.SIGINT, previous)
  if summary.get('stopped_by'):   # SIGINT/SIGTERM: checkpointed, resumable
    return 128 + signal.Signals[summary['stopped_by']].value
  return 0


def _settle(error: BaseException) -> None:
  """In a multi-process run, before ``error`` is reported: when another process was lost (a
  failed collective is usually where that shows first), this ends the process with one line
  naming it and exit code 4 (:func:`fedjax_kd.running.watchdog.settle`); else it returns."""
  watchdog = sys.modules.get('fedjax_kd.running.watchdog')   # loaded by the runner, distributed
  if watchdog is not None:
    watchdog.settle(error)


def _exiting(code: int) -> None:
  """Tells the other processes of a multi-process run that this one ends with ``code``."""
  watchdog = sys.modules.get('fedjax_kd.running.watchdog')
  if watchdog is not None:
    watchdog.exiting(code)


def _absl_flags(argv: list[str]) -> list[str]:
  """absl's own flags (``--verbosity``, ``--helpfull``, ...) for ``app.run``; the rest is
  left to :func:`parse`."""
  if any(a in ('-h', '-?', '--help', '--helpshort', '--helpfull') for a in argv[1:]):
    fv = flags.FlagValues()
    _define(fv)
    print(__doc__.split('\n\n', 1)[1].split('\nExit codes')[0].strip() + '\n\nFlags:\n'
          + fv.get_help())
    sys.exit(0)
  try:
    return flags.FLAGS(argv, known_only=True)
  except flags.Error as e:
    print(_one_line(e), file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.WARNING)  # no TPU-probe noise
  # A checkpoint write that fails (a full disk) leaves orbax's other write tasks with the same
  # exception, which asyncio logs when they are collected, after the run has said it in one
  # line; fedjax_kd runs no asyncio code of its own.
  logging.getLogger('asyncio').setLevel(logging.CRITICAL)
  if not flags.FLAGS['verbosity'].present:   # orbax logs every save at INFO
    absl_logging.set_verbosity(absl_logging.WARNING)
  code = 1
  try:
    code = cli(argv)
  finally:
    _exiting(code)
  sys.exit(code)


def entry() -> None:
  """The ``fedjax-kd`` console script (``python -m fedjax_kd.main`` does the same)."""
  try:
    app.run(main, flags_parser=_absl_flags)
  except KeyboardInterrupt:   # before the command started
    print('error: interrupted (Ctrl-C)', file=sys.stderr)
    sys.exit(128 + signal.SIGINT.value)


if __name__ == '__main__':
  entry()
