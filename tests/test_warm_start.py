"""benchmarks/performance/warm_start.py: a cold run, then warm runs that load round 1's programs."""

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))

import warm_start  # pylint: disable=g-import-not-at-top,wrong-import-position

# Its long-tier tests time their processes: they run alone (`serial`, tests/conftest.py).


def test_bad_repeats_is_one_line(capsys):
  assert warm_start.main(['--repeats=0']) == 2
  assert '--repeats' in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.serial
def test_warm_run_is_ready_before_it_ends(tmp_path, capsys):
  out = tmp_path / 'warm.json'
  assert warm_start.main(['--repeats=1', f'--out={out}']) == 0
  got = json.loads(out.read_text())
  (warm,) = got['warm']
  # Round 1's training happens inside the run: ready is the wall less a positive training time,
  # and the compile time is part of ready.
  assert 0 < warm['compile_s'] < warm['ready_s'] < warm['wall_s']
  # The warm run loads from the cache the cold run wrote: it compiles in less time.
  assert warm['compile_s'] < got['cold']['compile_s']
  assert '| launch to round-1 training (ready) |' in capsys.readouterr().out
