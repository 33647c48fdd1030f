"""benchmarks/performance/chunk_cost.py: the table of what running clients in chunks costs."""

import json
import os
import sys

import pytest

from tests.shared import TINY_FILE, assert_rewrites_to_itself
from tests.test_main import REPO
from tests.test_sweep import sweep_env

sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
import chunk_cost  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_the_table_gives_each_chunks_median_and_its_ratio_to_all_at_once(tmp_path, capsys):
  doc = {'config': 'dsfl_mnist', 'clients': 100, 'machine': '2 cores (test)', 'rows': [
      {'chunk': 100, 'round_s': 200.0, 'ratio': 1.0, 'runs': [190.0, 200.0, 230.0]},
      {'chunk': 25, 'round_s': 230.0, 'ratio': 1.15, 'runs': [220.4, 230.0, 250.0]}]}
  path = tmp_path / 'c.json'
  path.write_text(json.dumps(doc))
  page = tmp_path / 'p.md'
  page.write_text(f'x\n{chunk_cost.BEGIN}\nold\n{chunk_cost.END}\ny\n')
  assert chunk_cost.main([f'--from_json={path}', f'--markdown={page}']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ('`dsfl_mnist`, K = 100, on 2 cores (test): a round (compilation '
                      'excluded), median of 3 fresh processes each')
  assert lines[-2:] == ['| 100 | 200 s | 1.00x | 190, 200, 230 s |',
                        '| 25 | 230 s | 1.15x | 220, 230, 250 s |']
  assert page.read_text() == f'x\n{chunk_cost.BEGIN}\n' + '\n'.join(lines) + \
      f'\n{chunk_cost.END}\ny\n'


@pytest.mark.slow
def test_each_chunk_runs_in_its_own_process_and_the_ratio_is_to_all_at_once(tmp_path, monkeypatch):
  """The measurement on the tests' tiny experiment (4 clients) at C = 4 and 2, two repeats:
  each (C, repeat) is its own run with that chunk, interleaved over C, and the table's
  medians and ratios are those of the runs."""
  config = tmp_path / 'tiny.py'
  config.write_text(TINY_FILE)
  calls, one_round = [], chunk_cost.one_round

  def spy(config, chunk, mnist, folder, tag):
    got = one_round(config, chunk, mnist, folder, tag)
    with open(os.path.join(folder, tag, 'config.json')) as f:
      calls.append((chunk, tag, json.load(f)['clients']['chunk'], got))
    return got

  monkeypatch.setattr(chunk_cost, 'one_round', spy)
  # Its runs' processes compile unoptimised code: the table's structure is under test here,
  # not the times, and each process compiles from scratch (--compilation_cache=none).
  monkeypatch.setenv('XLA_FLAGS', sweep_env()['XLA_FLAGS'])
  out = tmp_path / 'c.json'
  assert chunk_cost.main([f'--config={config}', '--fractions=1,0.5', '--repeats=2', '--mnist=',
                          f'--out={out}']) == 0
  # clients.chunk is 'auto' or a number, kept as the text given (config.json: '4').
  assert [(c, tag, str(set_to)) for c, tag, set_to, _ in calls] == [
      (4, 'c4_r0', '4'), (2, 'c2_r0', '2'), (4, 'c4_r1', '4'), (2, 'c2_r1', '2')]
  doc = json.loads(out.read_text())
  assert doc['config'] == str(config) and doc['clients'] == 4
  rounds = {c: [g['round_s'] for cc, _, _, g in calls if cc == c] for c in (4, 2)}
  for row, c in zip(doc['rows'], (4, 2)):
    assert row['chunk'] == c and row['runs'] == rounds[c]
    assert row['round_s'] == pytest.approx(sum(rounds[c]) / 2)   # the median of two
    assert all(0 < g['round_s'] and 0 <= g['compile_s'] for *_, g in calls)
  assert doc['rows'][0]['ratio'] == 1.0
  assert doc['rows'][1]['ratio'] == pytest.approx(doc['rows'][1]['round_s'] /
                                                  doc['rows'][0]['round_s'])


def test_the_docs_section_is_what_the_archived_numbers_give(tmp_path):
  """docs/performance.md's chunk-cost table is written by the script from
  benchmarks/results/chunk_cost_cpu.json, as the page's own command says, never edited by hand."""
  numbers = os.path.join(REPO, 'benchmarks', 'results', 'chunk_cost_cpu.json')
  assert_rewrites_to_itself(tmp_path, 'docs/performance.md', chunk_cost.main,
                            [f'--from_json={numbers}'])
  with open(numbers) as f:
    doc = json.load(f)
  assert doc['config'] == 'dsfl_mnist' and [r['chunk'] for r in doc['rows']] == [100, 50, 25]
  for r in doc['rows']:
    assert len(r['runs']) == 3 and r['round_s'] == sorted(r['runs'])[1]
    assert r['ratio'] == r['round_s'] / doc['rows'][0]['round_s']
