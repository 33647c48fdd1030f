"""JAX's persistent compilation cache, on by default for the command lines.

A run compiles a few dozen XLA programs (each cohort's local training,
distillation and evaluation, and many small eager ops) before its first round
can train. Without a cache every command compiles them again, which takes
several times longer than loading them from JAX's persistent compilation cache
(docs/performance.md, "Warm start", has the measurements). So ``python -m fedjax_kd.main`` and ``python -m fedjax_kd.sweep``
(and its workers) turn the cache on unless told not to, through
:func:`setup` (:func:`resolve`, :func:`check`, :func:`enable`).

Where the cache lives, the first of:

1. the command line's ``--compilation_cache=DIR`` (``''``, ``none``, ``off``, ``false``, ``no``
   or ``0``: no cache; a bare word that looks like a typo of one of them is refused);
2. ``$FEDJAX_KD_COMPILATION_CACHE`` (same meanings);
3. ``$JAX_COMPILATION_CACHE_DIR``, JAX's own variable, where the user set it;
4. ``$XDG_CACHE_HOME/fedjax_kd/jax_cache``, else ``~/.cache/fedjax_kd/jax_cache``.

Why it is safe to share: JAX keys each entry by the program's StableHLO, the
compile options, the JAX/jaxlib versions and the backend, so an entry is only
ever loaded for the very program it was compiled from; a change of code,
config, shapes or library version makes new entries and leaves old ones
unused, never wrong. (JAX treats the directory as trusted code: do not point it
at a folder others can write.)

Why every program is cached: JAX writes only programs that took at least 1 s
to compile, so by default the many small kernels of a round would be compiled
again on every start; :data:`MIN_COMPILE_TIME_S` and
:data:`MIN_ENTRY_SIZE_BYTES` cache them all (docs/performance.md compares the
thresholds: a warm run reaches round 1's training soonest with every program
cached).

What is never done: nothing in the directory is deleted (no size limit is
set, because JAX's LRU eviction would delete files in a folder that may be
shared with other projects; remove the folder by hand to reclaim the space),
and a directory that cannot be created or written is reported in one warning
line, after which the run goes on without a cache. A path that names a file
is bad input (:class:`~fedjax_kd.errors.ConfigError`, exit code 2).
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from typing import Callable, Mapping

from fedjax_kd.errors import ConfigError

ENV_VAR = 'FEDJAX_KD_COMPILATION_CACHE'
JAX_ENV_VAR = 'JAX_COMPILATION_CACHE_DIR'
FLAG = '--compilation_cache'
OFF = ('', 'none', 'off', 'false', 'no', '0')   # values that turn the cache off (any case)
# Every program is written, however fast it compiled or small it is (JAX: 1.0 s and 0).
MIN_COMPILE_TIME_S = 0.0
MIN_ENTRY_SIZE_BYTES = -1    # -1: no size threshold (0 would let JAX pick one per file system)


def default_directory(environ: Mapping[str, str] | None = None) -> str:
  """``$XDG_CACHE_HOME/fedjax_kd/jax_cache``, else ``~/.cache/fedjax_kd/jax_cache``.

  Args:
    environ: the environment to read (default ``os.environ``).

  Returns:
    An absolute path (which may not exist yet).
  """
  environ = os.environ if environ is None else environ
  base = environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.abspath(os.path.join(base, 'fedjax_kd', 'jax_cache'))


def resolve(flag: str | None = None, environ: Mapping[str, str] | None = None
            ) -> tuple[str | None, str]:
  """Where the cache goes: the flag, ``$FEDJAX_KD_COMPILATION_CACHE``,
  ``$JAX_COMPILATION_CACHE_DIR`` or the user cache directory, the first that is set.

  Args:
    flag: the ``--compilation_cache`` value; None where the flag was not given.
    environ: the environment to read (default ``os.environ``).

  Returns:
    ``(directory, source)``: the absolute directory, or None for no cache (one of
    :data:`OFF` given); ``source`` names where it came from (``'--compilation_cache'``,
    ``'$FEDJAX_KD_COMPILATION_CACHE'``, ``'$JAX_COMPILATION_CACHE_DIR'`` or
    ``'default'``), for messages.

  Raises:
    ConfigError: a bare word that looks like a typo of an off value, naming ``source``.
  """
  environ = os.environ if environ is None else environ
  for value, source in ((flag, FLAG), (environ.get(ENV_VAR), f'${ENV_VAR}')):
    if value is not None:
      if value.strip().lower() in OFF:
        return None, source
      _refuse_typo(value.strip(), source)
      return os.path.abspath(os.path.expanduser(value.strip())), source
  if environ.get(JAX_ENV_VAR):
    return os.path.abspath(os.path.expanduser(environ[JAX_ENV_VAR])), f'${JAX_ENV_VAR}'
  return default_directory(environ), 'default'


def _refuse_typo(value: str, source: str) -> None:
  """Refuses a bare word that looks like a misspelt off value (``of``, ``flase``, ``non``).

  Such a value would otherwise make a cache folder of that name in the working directory. A
  folder that exists, or a path with a separator (``./of``), is taken as it is.
  """
  if os.sep in value or (os.altsep and os.altsep in value) or os.path.exists(value):
    return
  words = [w for w in OFF if w]
  close = difflib.get_close_matches(value.lower(), words, n=1, cutoff=0.75)
  if close:
    raise ConfigError(source, value, f'a directory, or one of {", ".join(words)} (or \'\') to run '
                      f'without a cache; {value!r} looks like a typo of {close[0]!r} (write '
                      f'./{value} for a folder of that name)')


def check(directory: str | None, source: str) -> None:
  """Refuses a directory the user named that is a file or lies under one.

  Args:
    directory: from :func:`resolve` (None: no cache, nothing to check).
    source: from :func:`resolve`; the default directory is not checked here (a
      problem with it is a warning in :func:`enable`, not the user's input).

  Raises:
    ConfigError: naming ``source`` (the flag or the variable), before any compute.
  """
  if directory is None or source == 'default':
    return
  path = directory
  while path and not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      return
    path = parent
  if path and not os.path.isdir(path):
    what = 'is a file' if path == directory else f'lies under the file {path}'
    raise ConfigError(source, directory, "a directory for JAX's compilation cache, or off/none "
                      f"(or '') to run without one ({directory} {what})")


def shown(directory: str) -> str:
  """``directory`` with the home directory written ``~``, for messages."""
  home = os.path.expanduser('~')
  if home not in ('', '/') and (directory == home or directory.startswith(home + os.sep)):
    return '~' + directory[len(home):]
  return directory


def writable(directory: str, warn: Callable[[str], None] | None = None) -> bool:
  """Creates ``directory`` and proves it writable (a probe file, written and removed).

  Args:
    directory: the cache directory.
    warn: where the one warning line goes when it is not (default: stderr).

  Returns:
    Whether the directory can hold the cache.
  """
  warn = warn or (lambda s: print(s, file=sys.stderr, flush=True))
  try:
    os.makedirs(directory, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix='.fedjax_kd_probe_', dir=directory)
    os.close(fd)
    os.remove(probe)   # the only file this module ever removes: its own probe
  except OSError as e:
    warn(f'warning: the compilation cache {shown(directory)} is not writable '
         f'({e.strerror or type(e).__name__}); running without it (set {FLAG}=DIR or '
         f'${ENV_VAR} to move it)')
    return False
  return True


def enable(directory: str | None, warn: Callable[[str], None] | None = None) -> str | None:
  """Points JAX's persistent compilation cache at ``directory``, or turns it off.

  Call before the first compilation. Every program is cached
  (:data:`MIN_COMPILE_TIME_S`, :data:`MIN_ENTRY_SIZE_BYTES`). Where this process had
  already used another directory, JAX's cache is reset so that the new one takes effect.

  Args:
    directory: from :func:`resolve`; None turns the cache off.
    warn: where the warning about an unwritable directory goes (default: stderr).

  Returns:
    The directory in use, or None: none asked for, or not writable (one warning line).
  """
  # pylint: disable=g-import-not-at-top
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  # pylint: enable=g-import-not-at-top
  if directory is not None and not writable(directory, warn):
    directory = None
  before = active()
  if directory is None:
    jax.config.update('jax_enable_compilation_cache', False)
  else:
    jax.config.update('jax_enable_compilation_cache', True)
    jax.config.update('jax_compilation_cache_dir', directory)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', MIN_COMPILE_TIME_S)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', MIN_ENTRY_SIZE_BYTES)
  if active() != before:
    compilation_cache.reset_cache()   # JAX opens its cache once per process
  return directory


def active() -> str | None:
  """The directory JAX's persistent compilation cache uses in this process, or None."""
  import jax  # pylint: disable=g-import-not-at-top
  if not jax.config.jax_enable_compilation_cache:
    return None
  return jax.config.jax_compilation_cache_dir or None


def setup(flag: str | None = None, warn: Callable[[str], None] | None = None) -> str | None:
  """:func:`resolve`, :func:`check` and :func:`enable` in one: what a command line calls.

  Args:
    flag: the ``--compilation_cache`` value; None where it was not given.
    warn: where the warning about an unwritable directory goes (default: stderr).

  Returns:
    The directory in use, or None.

  Raises:
    ConfigError: the flag or a variable names a file.
  """
  directory, source = resolve(flag)
  check(directory, source)
  return enable(directory, warn)
