"""benchmarks/chunk_cost.py: the table of what running clients in chunks costs."""

import json
import os
import sys

from tests.test_main import REPO

sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
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
