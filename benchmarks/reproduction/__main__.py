"""The reproduction report's command, run from the repository's root: ``python -m
benchmarks.reproduction run|report|archive|standing [flags]``.

:mod:`benchmarks.reproduction.cli` describes each command and its flags, and
:mod:`benchmarks.reproduction.papers` holds each paper's sweeps and checks.
"""

import sys

from benchmarks.reproduction.cli import main

if __name__ == '__main__':
  sys.exit(main())
