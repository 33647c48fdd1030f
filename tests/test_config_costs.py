"""benchmarks/performance/config_costs.py: the cost table of docs/configs.md, its arithmetic and stand-ins."""

import json
import os
import re
import sys

import numpy as np
import pytest

from fedjax_kd import config as config_lib
from tests.shared import assert_rewrites_to_itself
from tests.test_main import REPO

sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
import config_costs as costs  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_every_shipped_config_has_a_row_in_the_docs_table():
  """A config added without its cost (or a row left for one removed) fails here."""
  with open(os.path.join(REPO, 'docs', 'configs.md')) as f:
    doc = f.read()
  section = doc.split(costs.BEGIN)[1].split(costs.END)[0]
  named = re.findall(r'^\| `([a-z0-9_]+)` \|', section, flags=re.M)
  assert sorted(named) == sorted(config_lib.shipped_configs())
  # Every measured row says minutes, hours or days; the others say why they were not run.
  for line in section.splitlines():
    if line.startswith('| `'):
      assert ('not measured:' in line
              or line.rstrip(' |').rsplit('| ', 1)[1] in (
                  'minutes', 'hours', 'days', 'hours or more', 'days or more',
                  'an accelerator')), line


def test_the_total_is_the_first_round_plus_the_rest_at_the_steady_rate():
  rows = [{'config': 'a', 'rounds': 30, 'data': 'digits', 'first_s': 60.0, 'round_s': 0.8,
           'total_s': 60.0 + 29 * 0.8},
          {'config': 'b', 'rounds': 2000, 'data': 'cifar10 stand-in', 'first_s': None,
           'round_s': None, 'lower_bound_s': 150.0, 'error': None},
          {'config': 'c', 'rounds': 100, 'skipped': "LEAF's files"},
          {'config': 'd', 'rounds': 15, 'data': 'cifar10 stand-in', 'first_s': None,
           'round_s': None, 'lower_bound_s': 3.0,
           'error': 'error: this run needs about 32 GiB (data 177 MiB, ...), more than ...'},
          {'config': 'e', 'rounds': 2000, 'data': 'cifar10 stand-in', 'first_s': None,
           'round_s': None, 'lower_bound_s': 60.0,
           'error': 'error: out of device memory (22 GiB of host memory available): INTERNAL: '
                    'Error dispatching computation: Out of memory allocating 30980685560 '
                    'bytes.; the estimate was 21 GiB'}]
  rows.append({'config': 'f', 'rounds': 2000, 'data': 'cifar10 stand-in', 'first_s': 2400.0,
               'round_s': 2000.0, 'total_s': 2400.0 + 1999 * 2000.0,
               'memory_plan': 'about 14 GiB, clients 34 at a time (of 100 a phase)'})
  text = costs.table(rows, '2 cores (test)')
  assert '| `a` | 30 | digits | 60 s | 0.8 s | 83 s | minutes |' in text
  # The planner's chunk, from the run's header line; 2400 + 1999 x 2000 s = 46.3 days.
  assert ('| `f` | 2000 | cifar10 stand-in, 34 of 100 clients at a time | 40 min | 33 min | '
          '46.3 days | days |') in text
  # Round 1 not done in 150 s: at least 150 s a round, 2000 x 150 s = 3.5 days.
  assert ('| `b` | 2000 | cifar10 stand-in | round 1 not done in 2 min | > 2 min | > 3.5 days '
          '| days or more |') in text
  assert "| `c` | 100 | – | not measured: LEAF's files | | | |" in text
  # Refused by the memory planner before any compute: what it needs, no made-up time.
  assert ('| `d` | 15 | cifar10 stand-in | refused here: needs about 32 GiB of memory | | | '
          'an accelerator |') in text
  # Past the planner, XLA's allocation failed: 30,980,685,560 bytes = 28.9 GiB.
  assert ('| `e` | 2000 | cifar10 stand-in | out of memory here: XLA asked for 29 GiB at once '
          '(22 GiB available) | | | an accelerator |') in text


@pytest.mark.parametrize('seconds,text', [(5.04, '5.0 s'), (45, '45 s'), (600, '10 min'),
                                          (4 * 3600, '4.0 h'), (3 * 86400, '3.0 days')])
def test_durations_read_as_a_person_would_say_them(seconds, text):
  assert costs.fmt(seconds) == text


@pytest.mark.slow
def test_stand_ins_have_the_shapes_of_the_data_sets(tmp_path):
  assert costs.stand_in_name('tfds:cifar100') == 'cifar100'
  assert costs.stand_in_name('tfds:fashion_mnist') == 'fashion_mnist'
  assert costs.stand_in_name('npz:tmd_features.npz') == 'sensor'
  assert costs.stand_in_name('digits') is None
  with np.load(costs.write_stand_in('cifar100', str(tmp_path))) as z:
    assert z['x_train'].shape == (50_000, 32, 32, 3) and z['x_train'].dtype == np.uint8
    assert z['x_test'].shape == (10_000, 32, 32, 3)
    assert sorted(np.unique(z['y_train'])) == list(range(100))
  with np.load(costs.write_stand_in('imdb', str(tmp_path))) as z:
    assert z['x_train'].shape == (25_000, 200) and int(z['vocab_size']) == 20_000


def test_the_table_goes_between_the_markers_and_nowhere_else(tmp_path):
  doc = tmp_path / 'd.md'
  doc.write_text(f'before\n{costs.BEGIN}\nold\n{costs.END}\nafter\n')
  costs.write_markdown(str(doc), 'new table')
  assert doc.read_text() == f'before\n{costs.BEGIN}\nnew table\n{costs.END}\nafter\n'
  (tmp_path / 'r.json').write_text(json.dumps(
      {'machine': 'm', 'rows': [{'config': 'c', 'rounds': 1, 'skipped': 'why'}]}))
  assert costs.main([f'--from_json={tmp_path / "r.json"}', f'--markdown={doc}']) == 0
  assert 'not measured: why' in doc.read_text()


def test_the_docs_table_is_what_the_archived_numbers_give(tmp_path):
  """docs/configs.md's table is written by the script from benchmarks/results/config_costs.json, as the
  page's own command says, never edited by hand."""
  numbers = [f'--from_json={os.path.join(REPO, "benchmarks", "results", "config_costs.json")}']
  assert_rewrites_to_itself(tmp_path, 'docs/configs.md', costs.main, numbers)
  # docs/performance.md's section of the configs that ran in chunks, the same way.
  assert_rewrites_to_itself(tmp_path, 'docs/performance.md', costs.main, numbers,
                            '--memory_markdown')


def test_the_memory_table_lists_the_chunked_runs_with_their_plan_and_peak():
  rows = [{'config': 'a', 'rounds': 30, 'data': 'digits', 'first_s': 60.0, 'round_s': 0.8,
           'peak_rss': 800 << 20, 'memory_plan': 'at most 658 MiB, all clients at once'},
          {'config': 's', 'rounds': 2000, 'data': 'cifar10 stand-in', 'first_s': 2400.0,
           'round_s': 2000.0, 'peak_rss': 15 << 30,
           'memory_plan': 'about 14 GiB, clients 34 at a time (of 100 a phase)'},
          {'config': 'x', 'rounds': 3000, 'data': 'cifar100 stand-in', 'first_s': None,
           'round_s': None, 'lower_bound_s': 7200.0, 'peak_rss': 9 << 30,
           'memory_plan': 'about 13 GiB, clients 20 at a time (of 100 a phase)'}]
  lines = costs.memory_table(rows, '2 cores (test)').splitlines()
  # All clients at once (a) and a run that did not finish a round (x) are not listed.
  assert [l for l in lines if l.startswith('| `')] == [
      '| `s` | cifar10 stand-in | about 14 GiB, clients 34 at a time (of 100 a phase) | '
      '15 GiB | 40 min | 33 min |']


def test_both_tables_go_between_their_own_markers(tmp_path):
  path = tmp_path / 'doc.md'
  path.write_text(f'a\n{costs.MEMORY_BEGIN}\nold\n{costs.MEMORY_END}\nb\n')
  costs.write_markdown(str(path), 'new', costs.MEMORY_BEGIN, costs.MEMORY_END)
  assert path.read_text() == f'a\n{costs.MEMORY_BEGIN}\nnew\n{costs.MEMORY_END}\nb\n'
  with pytest.raises(SystemExit, match='config-costs:begin'):
    costs.write_markdown(str(path), 'new')


def test_a_rerun_of_a_few_configs_replaces_their_rows_in_place_and_keeps_the_rest():
  old = [{'config': 'a', 'v': 1}, {'config': 'b', 'v': 2}, {'config': 'c', 'v': 3}]
  got = costs.merge_rows(old, [{'config': 'd', 'v': 9}, {'config': 'b', 'v': 7}])
  assert got == [{'config': 'a', 'v': 1}, {'config': 'b', 'v': 7}, {'config': 'c', 'v': 3},
                 {'config': 'd', 'v': 9}]


def test_a_run_over_two_calls_takes_round_1_from_the_first_and_the_highest_peak():
  """--keep_in: round 1 ran (and was stopped after it) in one call, round 2 in a process that
  resumed; that round's compiling is the new process's, not the round's."""
  calls = [{'rounds_before': 0, 'rounds_after': 1, 'first_s': 6000.0, 'peak_rss': 19 << 30,
            'stopped': True},
           {'rounds_before': 1, 'rounds_after': 2, 'first_s': 5000.0, 'peak_rss': 18 << 30,
            'stopped': False}]
  rows = [{'round_time_s': 5900.0, 'compile_s': 70.0}, {'round_time_s': 5160.0, 'compile_s': 60.0}]
  row = costs.row_of('c', 15, 9000.0, calls, rows, 'about 18 GiB, clients 50 at a time', '', 1.0)
  assert (row['first_s'], row['round_s'], row['peak_rss'], row['calls']) == (
      6000.0, 5100.0, 19 << 30, 2)
  assert row['total_s'] == 6000.0 + 14 * 5100.0
  assert row['round_from'] == 'round 2 (resumed in a new process: its compiling left out)'
  # After the first call alone: round 1's time less compiling, marked as stopped there, and
  # left out of the memory table (two rounds, or not yet).
  one = costs.row_of('c', 15, 9000.0, calls[:1], rows[:1], 'about 18 GiB, clients 50 at a time',
                     '', 1.0)
  assert (one['round_s'], one['stopped_after_round']) == (5830.0, 1)
  assert 'calls' not in one
  assert '| `c` |' not in costs.memory_table([dict(one, data='d')], 'm')
  assert '| `c` |' in costs.memory_table([dict(row, data='d')], 'm')


def test_collect_reads_the_kept_calls_and_runs_nothing(tmp_path):
  work = tmp_path / 'c'
  work.mkdir()
  (work / 'metrics.jsonl').write_text(json.dumps({'round': 1, 'round_time_s': 100.0,
                                                  'compile_s': 10.0}) + '\n')
  (tmp_path / 'c.log').write_text('fedjax_kd 0.1.0 | x | memory about 2 GiB, clients 5 at a '
                                  'time (of 10 a phase)\nround 1: ...\n')
  with pytest.raises(SystemExit, match='has no c.calls.jsonl'):
    costs.collect('c', 3, 60.0, str(tmp_path))
  (tmp_path / 'c.calls.jsonl').write_text(json.dumps(
      {'rounds_before': 0, 'rounds_after': 1, 'first_s': 120.0, 'peak_rss': 7, 'stopped': True})
      + '\n')
  row = costs.collect('c', 3, 60.0, str(tmp_path))
  assert (row['first_s'], row['round_s'], row['peak_rss'], row['stopped_after_round']) == (
      120.0, 90.0, 7, 1)
  assert row['memory_plan'] == 'about 2 GiB, clients 5 at a time (of 10 a phase)'
  text = costs.table([dict(row, data='d')], 'm')
  assert ('| `c` | 3 | d, 5 of 10 clients at a time | 2 min | 2 min (round 1 less compiling; '
          'the run stopped there, to resume) | 5 min | minutes |') in text


def test_a_call_that_fails_before_a_round_is_not_kept(tmp_path):
  """A run that stops on an error (here an unknown field) measured nothing: its row carries the
  error and no call record is appended for --keep_in to count."""
  row = costs.measure('default', 30, ['--config.nosuch=1'], 120.0, str(tmp_path), keep=True)
  assert row['round_s'] is None and 'nosuch' in row['error']
  assert not (tmp_path / costs.CALLS.format(name='default')).exists()
  # The same after a kept first round (a resume that fails): the kept call stays the only one.
  work = tmp_path / 'default'
  (work / 'checkpoints' / '1').mkdir(parents=True)
  (work / 'metrics.jsonl').write_text(json.dumps({'round': 1, 'round_time_s': 9.0}) + '\n')
  kept = json.dumps({'rounds_before': 0, 'rounds_after': 1, 'first_s': 10.0, 'peak_rss': 7,
                     'stopped': True}) + '\n'
  (tmp_path / costs.CALLS.format(name='default')).write_text(kept)
  row = costs.measure('default', 30, ['--config.nosuch=1'], 120.0, str(tmp_path), keep=True)
  assert row['round_s'] is None and 'nosuch' in row['error']
  assert (tmp_path / costs.CALLS.format(name='default')).read_text() == kept
