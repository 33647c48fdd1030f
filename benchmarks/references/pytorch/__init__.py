"""Independent PyTorch implementations of the papers, run on fedjax_kd's exact data.

Each algorithm is one small module (``dsfl.py``, ...) on one shared driver (``common.py``):
the driver takes from fedjax_kd only what a pair of runs must share (the seed's data split,
the client partition, the per-round open-set draws), builds the models with PyTorch's
defaults, trains them with a Python loop over clients and ``torch.optim``, and writes each
run as a :mod:`fedjax_kd.sweep` run directory so the reproduction report reads it like a
sweep. ``python -m benchmarks.references.pytorch --help`` (from the repository root) runs it.

PyTorch is a benchmark extra, never a dependency of fedjax_kd: ``pip install -e '.[bench]'``.
"""
