"""How fast fedjax_kd runs and what memory it takes, each a script run from the repository's
root (``python benchmarks/performance/NAME.py --help``) that prints its figures and writes
them under ``benchmarks/results/``:

* against PyTorch on the same machine in the same run: ``vs_torch.py`` (a loop over clients
  and ``torch.func.vmap``/``torch.compile``), ``gpu_suite.py`` (paper size on an
  accelerator), ``speed.py`` (published workloads), ``engine_throughput.py``;
* where the time and memory go: ``profile_round.py``, ``config_costs.py`` (every shipped
  config), ``chunk_cost.py``, ``remat.py``, ``conv_lowering.py``, ``memory_plan.py`` (the
  planner against XLA's figure), ``scale_clients.py``, ``warm_start.py``;
* clusters: ``local_clusters.py`` (real Ray and SLURM clusters on loopback, for the tests and
  the benchmark), ``cluster_overhead.py``, ``multihost_cpu.py``.

The scripts import their siblings by name (they put this folder on ``sys.path``).
"""
