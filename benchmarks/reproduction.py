"""The reproduction report's command: ``python benchmarks/reproduction.py
run|report|archive|standing [flags]``.

The code is the package :mod:`benchmarks.repro`: :mod:`benchmarks.repro.cli` describes each
command and its flags, and :mod:`benchmarks.repro.papers` holds each paper's sweeps and checks.
"""

import os
import sys

if os.path.dirname(os.path.dirname(os.path.abspath(__file__))) not in sys.path:
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.repro.cli import main  # pylint: disable=g-import-not-at-top

if __name__ == '__main__':
  sys.exit(main())
