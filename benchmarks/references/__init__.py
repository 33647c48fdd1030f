"""The references fedjax_kd's algorithms are compared with, each run beside it on the same data.

* :mod:`benchmarks.references.pytorch`: independent PyTorch implementations of the five
  papers (``python -m benchmarks.references.pytorch``), whose runs the reproduction report
  reads like fedjax_kd's sweeps;
* :mod:`benchmarks.references.authors`: the baselines run in lock-step beside their authors'
  own code, round by round from the same weights and minibatches
  (``python -m benchmarks.references.authors``);
* ``scarlet_official.py``: the SCARLET authors' code on fedjax_kd's MNIST setting (a script,
  run with the authors' own Python; ``docs/scarlet_official.md``).

None of them is a dependency of fedjax_kd: PyTorch and what the authors' code imports are the
``bench`` and ``authors`` extras.
"""
