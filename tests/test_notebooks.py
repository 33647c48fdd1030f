"""Executes the Colab notebooks top to bottom on CPU with tiny configs, so they cannot rot.

Each notebook has one cell tagged ``parameters`` holding every size knob; as
papermill does, a cell overriding those knobs with tiny values is inserted
right after it. The kernel runs with ``JAX_PLATFORMS=cpu`` (so a GPU machine
still tests the CPU path) and sees this checkout through ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')

REPO = pathlib.Path(__file__).resolve().parents[1]
COLAB = REPO / 'colab'
TINY_MODELS = "('mlp@0.5',)"   # one small cohort: a fraction of the CNNs' compile time


def _overrides(name: str, tmp: pathlib.Path) -> str:
  if name == 'quickstart.ipynb':
    return (f'ROUNDS = 2\nEXTRA_ROUNDS = 1\nNUM_CLIENTS = 4\nMODELS = {TINY_MODELS}\n'
            f'WORKDIR = {str(tmp / "quickstart")!r}\n')
  if name == 'paper_comparison.ipynb':
    return (f'ROUNDS = 2\nNUM_CLIENTS = 4\nMODELS = {TINY_MODELS}\nNUM_PUBLIC = 100\n'
            f'THRESHOLDS = (0.5,)\nWORKDIR = {str(tmp / "compare")!r}\n')
  if name == 'ops_tour.ipynb':
    return 'KRR_STEPS = 20\n'
  raise AssertionError(f'no overrides for {name}')


def _execute(name: str, tmp: pathlib.Path, monkeypatch) -> nbformat.NotebookNode:
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
      p for p in (str(REPO), os.environ.get('PYTHONPATH', '')) if p))
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  nb = nbformat.read(COLAB / name, as_version=4)
  tagged = [i for i, c in enumerate(nb.cells)
            if c.cell_type == 'code' and 'parameters' in c.metadata.get('tags', [])]
  assert len(tagged) == 1, f'{name}: expected one cell tagged "parameters", found {len(tagged)}'
  nb.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(_overrides(name, tmp)))
  client = nbclient.NotebookClient(nb, timeout=300, kernel_name='python3',
                                   resources={'metadata': {'path': str(REPO)}})
  client.execute()   # raises CellExecutionError on the first failing cell
  errors = [o for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', [])
            if o.get('output_type') == 'error']
  assert not errors, errors
  return nb


def _text(nb) -> str:
  """Everything the code cells printed or returned as text."""
  out = []
  for c in nb.cells:
    for o in c.get('outputs', []) if c.cell_type == 'code' else []:
      if o.get('output_type') == 'stream':
        out.append(o.get('text', ''))
      elif 'data' in o:
        out.append(o['data'].get('text/plain', ''))
  return ''.join(out)


def _rounds(workdir: pathlib.Path) -> list[int]:
  with open(workdir / 'metrics.jsonl') as f:
    return [json.loads(line)['round'] for line in f if line.strip()]


@pytest.mark.parametrize('name', ['quickstart.ipynb', 'paper_comparison.ipynb', 'ops_tour.ipynb'])
def test_notebook_runs(name, tmp_path, monkeypatch):
  nb = _execute(name, tmp_path, monkeypatch)
  text = _text(nb)
  if name == 'quickstart.ipynb':
    wd = tmp_path / 'quickstart'
    assert _rounds(wd) == [1, 2, 3]          # ROUNDS, then EXTRA_ROUNDS resumed
    for png in ('accuracy_vs_round', 'accuracy_vs_bytes', 'partition', 'client_accuracy'):
      assert (wd / 'plots' / f'{png}.png').stat().st_size > 0
    assert 'ran 1 new rounds' in text
    assert 'final acc' in text                # runner.summary_table
    images = [o for c in nb.cells for o in c.get('outputs', []) if 'image/png' in o.get('data', {})]
    assert len(images) == 4
  elif name == 'paper_comparison.ipynb':
    wd = tmp_path / 'compare'
    for algo in ('dsfl', 'scarlet', 'fedcache2'):
      assert _rounds(wd / algo) == [1, 2]
    for png in ('accuracy_vs_bytes', 'accuracy_vs_round', 'client_accuracy'):
      assert (wd / 'plots' / f'{png}.png').stat().st_size > 0
    for method in ('DS-FL', 'SCARLET', 'FedCache 2.0'):
      assert method in text
    assert 'ComU@0.5 MB' in text
  else:
    for number in ('0.8438', '0.6579', '0.4028', '35.125', '4040000'):
      assert number in text, number
