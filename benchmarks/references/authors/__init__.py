"""The baselines run in lock-step beside their authors' own code.

Each baseline that has public code is one small driver module here (``fedrs.py``, ...) on one
shared harness (``common.py``). A driver runs fedjax_kd's algorithm for a few whole rounds on a
tiny setting, then runs the same rounds through the authors' code, imported from a checkout of
their repository at a pinned commit (``common.REPOS``; ``benchmarks/references/authors/fetch.sh``
clones them) and never copied here: the same initial weights, the same data order and minibatches,
the same hyper-parameters. What a driver supplies around their code (a data loader that yields
fedjax_kd's minibatches, a model whose layers hold fedjax_kd's initial weights, the args object
their constructor reads) is listed in its docstring; where their code has to be changed at run
time to run at all (a Python 2 iterator call, a CUDA-only line) the patch is named there too.

``python -m benchmarks.references.authors --authors=DIR`` runs every driver whose checkout is there
and writes ``benchmarks/results/authors_lockstep.json``; the report prints it as a table. The tests
(``tests/test_authors_lockstep.py``, long tier) skip without PyTorch or without a checkout.
PyTorch and what the authors' modules import are the ``authors`` extra (``pip install -e
'.[authors]'``), never dependencies of fedjax_kd.
"""
