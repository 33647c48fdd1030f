"""Executes the Colab notebooks top to bottom on CPU with tiny configs, so they cannot rot.

Each notebook has one cell tagged ``parameters`` holding every size knob; as
papermill does, a cell overriding those knobs with tiny values is inserted
right after it. The kernel runs with ``JAX_PLATFORMS=cpu`` (so a GPU machine
still tests the CPU path) and sees this checkout through ``PYTHONPATH``, so the
notebooks' install cell finds ``fedjax_kd`` importable and runs no pip.

The notebooks are stored with the outputs of a run at their own parameters;
``python tests/test_notebooks.py [NAME ...]`` executes them again (in a
temporary directory, on this machine's CPU) and writes the new outputs into
``colab/``. The tests below check those saved files too: outputs in every code
cell, no accelerator in the metadata, an install cell guarded by an import check.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')

REPO = pathlib.Path(__file__).resolve().parents[1]
COLAB = REPO / 'colab'
NOTEBOOKS = ('quickstart.ipynb', 'paper_comparison.ipynb', 'ops_tour.ipynb')
TINY_MODELS = "('mlp@0.5',)"   # one small cohort: a fraction of the CNNs' compile time
# Notebook metadata that makes Colab ask for (or pick) an accelerator runtime.
ACCELERATOR_KEYS = frozenset({'accelerator', 'gpuType', 'gpu_type', 'tpuType', 'machine_shape'})
PLACEHOLDER = "REPO_URL = 'https://github.com/<owner>/fedjax_kd'"


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


@pytest.mark.parametrize('name', NOTEBOOKS)
@pytest.mark.slow
def test_notebook_runs(name, tmp_path, monkeypatch):
  nb = _execute(name, tmp_path, monkeypatch)
  text = _text(nb)
  if name == 'quickstart.ipynb':
    wd = tmp_path / 'quickstart'
    assert _rounds(wd) == [1, 2, 3]          # ROUNDS, then EXTRA_ROUNDS resumed
    for png in ('accuracy_vs_round', 'accuracy_vs_bytes', 'partition', 'client_accuracy'):
      assert (wd / 'plots' / f'{png}.png').stat().st_size > 0
    assert 'ran 1 new rounds' in text
    assert 'final acc' in text                # results.summary_table
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


# ------------------------------------------------ the saved notebooks
def _keys(obj) -> set[str]:
  """Every key of a nested dict / list structure."""
  if isinstance(obj, dict):
    return set(obj) | {k for v in obj.values() for k in _keys(v)}
  if isinstance(obj, list):
    return {k for v in obj for k in _keys(v)}
  return set()


def _install_cell(nb) -> str:
  return next(c for c in nb.cells if c.cell_type == 'code').source


def _is_import_guard(test: ast.expr) -> bool:
  """``importlib.util.find_spec('fedjax_kd') is None``."""
  return (isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Is)
          and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
          and isinstance(test.left, ast.Call) and ast.unparse(test.left.func).endswith('find_spec')
          and [ast.unparse(a) for a in test.left.args] == ["'fedjax_kd'"])


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_saved_notebook_has_outputs_no_accelerator_and_a_guarded_install(name):
  nb = nbformat.read(COLAB / name, as_version=4)
  nbformat.validate(nb)
  # Runtime-agnostic: nothing in the metadata asks Colab for a TPU or a GPU.
  found = (_keys(dict(nb.metadata)) | {k for c in nb.cells for k in _keys(dict(c.metadata))})
  assert not found & ACCELERATOR_KEYS, found & ACCELERATOR_KEYS
  assert 'TPU' not in json.dumps(nb.metadata) and 'GPU' not in json.dumps(nb.metadata)

  # Saved outputs: the cells ran top to bottom in one kernel, and every code cell but the
  # parameters cell (assignments only) shows what it did; no cell failed.
  code = [c for c in nb.cells if c.cell_type == 'code']
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), name
  for c in code:
    if 'parameters' not in c.metadata.get('tags', []):
      assert c.outputs, f'{name}: no saved output for the cell {c.source[:60]!r}'
  assert not [o for c in code for o in c.outputs if o.get('output_type') == 'error']
  text = _text(nb)
  assert 'devices:' in text and 'jax.devices()' in ''.join(c.source for c in code)
  if name != 'ops_tour.ipynb':   # the figures are saved too
    assert any('image/png' in o.get('data', {}) for c in code for o in c.outputs)

  # The install cell comes first; every pip call is inside the import check.
  source = _install_cell(nb)
  assert source.startswith(PLACEHOLDER) and 'EDIT' in source.splitlines()[0]
  assert "'fedjax_kd[plot] @ git+{REPO_URL}'" in source
  tree = ast.parse(source)
  guards = [n for n in tree.body if isinstance(n, ast.If) and _is_import_guard(n.test)]
  assert len(guards) == 1, 'expected one `if importlib.util.find_spec("fedjax_kd") is None:`'
  guarded = {id(n) for n in ast.walk(guards[0])}
  calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
           and ast.unparse(n.func) in ('_pip', 'subprocess.check_call', 'subprocess.run')]
  in_def = {id(n) for d in tree.body if isinstance(d, ast.FunctionDef) for n in ast.walk(d)}
  assert calls and all(id(n) in guarded or id(n) in in_def for n in calls)
  assert not [d for d in tree.body if isinstance(d, ast.Expr) and isinstance(d.value, ast.Call)
              and ast.unparse(d.value.func) in ('_pip', 'subprocess.check_call')]
  # The saved run found the checkout importable: it installed nothing.
  assert 'nothing to install' in ''.join(o.get('text', '') for o in code[0].outputs)


def test_install_cells_are_the_same_in_every_notebook():
  cells = {name: _install_cell(nbformat.read(COLAB / name, as_version=4)) for name in NOTEBOOKS}
  assert len(set(cells.values())) == 1, list(cells)


def _run_install(monkeypatch, capsys, *, importable, repo_url=None, jax_versions=None,
                 gpu=False):
  """Executes the install cell here with pip (subprocess.check_call) replaced by a recorder.

  Returns the argument lists it would have run and what it printed.
  """
  source = _install_cell(nbformat.read(COLAB / 'quickstart.ipynb', as_version=4))
  if repo_url is not None:
    source = source.replace(PLACEHOLDER, f'REPO_URL = {repo_url!r}', 1)
  calls = []
  monkeypatch.setattr(subprocess, 'check_call', lambda args, **kw: calls.append(list(args)))
  real_find_spec, real_isdir = importlib.util.find_spec, os.path.isdir
  if not importable:
    monkeypatch.setattr(importlib.util, 'find_spec', lambda n, *a, **k: (
        None if n == 'fedjax_kd' else real_find_spec(n, *a, **k)))
  monkeypatch.setattr(os.path, 'isdir', lambda p: (
      False if str(p).startswith('/content') else real_isdir(p)))
  monkeypatch.setattr(shutil, 'which', lambda cmd, *a, **k: (
      '/usr/bin/nvidia-smi' if gpu and cmd == 'nvidia-smi' else None))
  if jax_versions is not None:   # the runtime's jax until pip runs, then pip's
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, 'version', lambda d: (
        jax_versions[bool(calls)] if d == 'jax' else real_version(d)))
  exec(compile(source, 'install cell', 'exec'), {'__name__': '__main__'})  # pylint: disable=exec-used
  return calls, capsys.readouterr().out


def test_install_cell_runs_no_pip_where_fedjax_kd_is_importable(monkeypatch, capsys):
  calls, out = _run_install(monkeypatch, capsys, importable=True)
  assert calls == []
  assert 'nothing to install' in out and 'fedjax_kd 0.' in out


def test_install_cell_asks_for_the_repo_url_in_a_fresh_runtime(monkeypatch, capsys):
  with pytest.raises(RuntimeError, match='REPO_URL'):
    _run_install(monkeypatch, capsys, importable=False)


def test_install_cell_pip_installs_the_repo_url_with_the_plot_extra(monkeypatch, capsys):
  url = 'https://github.com/example/fedjax_kd'
  pip = [sys.executable, '-m', 'pip', 'install', '-q']
  calls, out = _run_install(monkeypatch, capsys, importable=False, repo_url=url)
  assert calls == [pip + [f'fedjax_kd[plot] @ git+{url}']]
  assert 'installed fedjax_kd' in out
  # pip replaced a GPU runtime's jax: the CUDA build of the new version follows.
  calls, _ = _run_install(monkeypatch, capsys, importable=False, repo_url=url,
                          jax_versions=('0.4.38', '0.10.2'), gpu=True)
  assert calls == [pip + [f'fedjax_kd[plot] @ git+{url}'], pip + ['jax[cuda12]==0.10.2']]


# ------------------------------------------------ refreshing the saved outputs
def save_outputs(name: str, workdir: str) -> float:
  """Runs ``colab/<name>`` at its own parameters in ``workdir`` and saves its outputs.

  The kernel sees this checkout through ``PYTHONPATH`` (the install cell runs no
  pip); the notebook's metadata is kept as it is. Returns the seconds it took.
  """
  import time  # pylint: disable=g-import-not-at-top
  os.environ['PYTHONPATH'] = os.pathsep.join(
      p for p in (str(REPO), os.environ.get('PYTHONPATH', '')) if p)
  path = COLAB / name
  nb = nbformat.read(path, as_version=4)
  metadata = json.loads(json.dumps(nb.metadata))
  t0 = time.time()
  client = nbclient.NotebookClient(nb, timeout=1800, kernel_name='python3', record_timing=False,
                                   resources={'metadata': {'path': workdir}})
  client.execute()
  nb.metadata = nbformat.from_dict(metadata)
  nbformat.validate(nb)
  nbformat.write(nb, path)
  return time.time() - t0


if __name__ == '__main__':
  for nb_name in sys.argv[1:] or NOTEBOOKS:
    with tempfile.TemporaryDirectory() as tmp:
      seconds = save_outputs(nb_name, tmp)
    print(f'{nb_name}: executed and saved in {seconds:.0f}s')
