r"""Multi-seed sweeps: variants x grid cells x seeds, run in worker processes, summarised.

  python -m fedjax_kd.sweep --config=configs/default.py --algorithms=dsfl,fd,single \
      --seeds=0,1,2 --out=runs/sweep_digits --jobs=2
  python -m fedjax_kd.sweep --config=configs/default.py \
      --variant 'DS-FL ERA=dsfl;dsfl.aggregation="era"' \
      --variant 'DS-FL SA=dsfl;dsfl.aggregation="sa"' \
      --variant "FedAvg=fedavg;clients.models=('cnn@1.0',)" --out=runs/dsfl_digits
  python -m fedjax_kd.sweep --config=configs/scarlet_digits.py --algorithms=scarlet \
      --set cache.duration=0,5,10,20 --metrics=hit_ratio --out=runs/scarlet_d
  python -m fedjax_kd.sweep ... --dry_run          # print the plan only

Every (variant, grid cell, seed) is one run with its own workdir
``<out>/runs/<variant-slug>[/<cell-slug>]/seed<k>`` (the files of
:mod:`fedjax_kd.running.workdir`). Each run's config is built as

  the ``--config`` file <- the variant (``algorithm`` and its fields)
  <- the grid cell <- the single-valued ``--set`` fields <- ``seed=k``,

so ``--set`` has the last word. Every run's config is validated before any
training starts: a bad field prints one ``error: ...`` line naming it and
exits with status 2.

Flags:

* ``--config=PATH[:ARG]``: a config file with ``get_config()`` (``ARG`` is
  passed to it, as ``ml_collections.config_flags`` does; :func:`fedjax_kd.config.load_file`).
* ``--algorithms=dsfl,fd``: a variant per algorithm, labelled by its name.
* ``--variant 'LABEL=ALGORITHM[;field=value;...]'`` (repeatable): a named
  variant with its own fields.
* ``--set field=value`` (repeatable): an override of every run;
  ``--set field=v1,v2,...`` makes the field a grid axis (the cross product of
  all multi-valued ``--set`` fields is run for every variant).
* ``--executor=local|ray|slurm`` and its settings (``--ray_address``, ``--run_resources``,
  ``--slurm_*``, ``--detach``): where the runs execute, a worker process each, here or on a
  cluster's nodes (:mod:`~fedjax_kd.sweep.executors`; docs/cluster.md). The plan, workdirs,
  resume rules and outputs are the same under each. Executors register like algorithms
  (``executors.register``, in the config file), and ``--executor`` names any registered one.
* ``--seeds=0,1,2`` (default), ``--out=DIR``, ``--jobs=N`` (the local executor's worker
  processes at once, default 1), ``--thresholds=0.8,0.9`` (default: the config's
  ``comm.thresholds``), ``--metrics=label_coverage,hit_ratio`` (per-round
  metrics whose mean over rounds gets a column), ``--dry_run``.

Values are Python literals (``ast.literal_eval``), else plain strings:
``--set train.learning_rate=0.05``, ``--set data.source=npz:mnist.npz``,
``--set "clients.models=('cnn@0.5','cnn@1.0')"``. Commas inside brackets,
parentheses or quotes do not split values, so a tuple is one value and
``--set "clients.models=('cnn@1.0',),('mlp@1.0',)"`` is a grid of two tuples;
write a tuple-valued field such as ``comm.thresholds`` as ``(0.8,0.9)``.

Runs execute in worker processes (``python -m fedjax_kd.sweep --_worker=-``,
up to ``--jobs`` at once, each taking runs one after the other) calling
:func:`fedjax_kd.runner.run` with ``resume=True``, so rerunning the same
command skips every finished run (its ``summary.json`` has the planned
rounds and no ``stopped_by``), resumes an interrupted one from its newest
checkpoint, and starts the rest. A failed run is reported and the sweep goes
on; the exit status is then 1.

A sweep stopped at any moment loses nothing: SIGINT/SIGTERM stop the running runs after
their current round (they save a checkpoint); a sweep killed outright (SIGKILL) takes its
workers with it (each gets SIGTERM and stops the same way: ``prctl(PR_SET_PDEATHSIG)`` on
Linux, elsewhere within a second). The same command then skips the finished runs (their
files untouched), resumes the others from their newest checkpoint, and counts every run
once. A run directory still held by another process (a killed sweep's worker finishing its
round) is waited for up to two minutes, then reported as failed in one line naming it.

A worker executes the ``--config`` file (recorded as an absolute path in each run's
``sweep_run.json``) before it builds the run's config, so an algorithm, model or data source
the file registers exists in the worker as it did in the command; the command checks every
run's config the worker's way before anything trains. The file is executed once in each
worker, so whatever it builds (a registered source's arrays) must come out the same every
time: seed its random numbers.

Each run's output (progress lines, warnings, tracebacks) goes to ``<workdir>/sweep.log``;
``python -m fedjax_kd.sweep --_worker=<workdir>`` reruns (resumes) one run in the terminal,
for debugging.

Workers inherit the environment (``XLA_FLAGS``, ``CUDA_VISIBLE_DEVICES``,
...). Compiled programs are shared between workers, reruns and
``fedjax_kd.main`` runs through JAX's persistent compilation cache, chosen as
``fedjax_kd.main`` chooses it (:mod:`fedjax_kd.running.compile_cache`):
``--compilation_cache=DIR``, else ``$FEDJAX_KD_COMPILATION_CACHE``, else
``$JAX_COMPILATION_CACHE_DIR``, else ``~/.cache/fedjax_kd/jax_cache``
(``off``, ``none`` or ``''`` turns it off). Thread use is
left to XLA: every worker may use all cores, so with ``--jobs > 1`` on a CPU
the workers share the cores (their rounds are slower, the sweep is usually
still faster); on one accelerator keep ``--jobs=1`` or split the devices with
``CUDA_VISIBLE_DEVICES`` yourself.

Outputs in ``--out``: ``sweep.json`` (the plan: config, variants, seeds,
grid, overrides, thresholds, metrics, every run's workdir), ``compare.csv``
and ``compare.md`` (one row per variant and grid cell: mean +- sample std
over seeds of final and best accuracy, mean client accuracy, bytes, rounds
and bytes to each threshold with how many seeds reached it, wall time and
the extra metrics) and ``accuracy_test_acc.png`` (+ ``accuracy_client_acc.png``
where runs log client accuracy): mean curves with a +-std band against the
round and against cumulative bytes. :func:`aggregate` and
:func:`write_outputs` regenerate them from the workdirs alone.

Exit codes: 0 every run finished (or was skipped); 1 a run failed; 2 bad
flags or config (nothing ran), or a file of the sweep itself could not be written (a full
disk: ``error: no space left to write <file> (<free> free on its device): ...``) or read;
130/143 stopped by SIGINT/SIGTERM (the running runs checkpoint first; rerun to resume).

Library use::

  from fedjax_kd import sweep
  from fedjax_kd.config import presets
  variants = [sweep.Variant('ERA', 'dsfl'),
              sweep.Variant('SA', 'dsfl', {'dsfl.aggregation': 'sa'})]
  runs = sweep.plan(presets.digits(), variants, seeds=(0, 1, 2), grid={}, out='runs/x')
  # A config from a file that registers something: plan(config_lib.load_file(f), ...,
  # config_file=f), so that the workers execute f too.
  sweep.write_plan('runs/x', runs)
  results = sweep.execute(runs, jobs=2)
  cells = sweep.aggregate('runs/x')
  sweep.write_outputs('runs/x', cells, thresholds=(0.8, 0.9))

The package, by concern: :mod:`~fedjax_kd.sweep.planning` (variants x cells x seeds as runs,
``sweep.json``), :mod:`~fedjax_kd.sweep.workers` (worker processes, resume, signals),
:mod:`~fedjax_kd.sweep.executors` (``--executor``: :mod:`~fedjax_kd.sweep.ray_executor`,
:mod:`~fedjax_kd.sweep.slurm_executor`),
:mod:`~fedjax_kd.sweep.collect` (per-cell statistics from the workdirs),
:mod:`~fedjax_kd.sweep.report` (tables and figures) and :mod:`~fedjax_kd.sweep.cli` (the
command). The rules the sweep shares with the runner and the plots (which accuracy is the
headline, mean and std over seeds, number formats, file names, figure files) live in
:mod:`fedjax_kd.running.results`.
"""

from fedjax_kd.sweep.planning import (
    DIVERGED_FILE, LOG_FILE, PLAN_FILE, RUN_FILE, RUNS_DIR, Run, Variant, apply_overrides,
    cell_label, cell_slug, load_plan, load_run_config, plan, show_value, write_plan)
from fedjax_kd.sweep.workers import (
    RunResult, diverged_lines, execute, quiet_logs, read_diverged, run_one, run_state,
    stopped_status, worker_main)
from fedjax_kd.sweep.collect import BASE_STATS, METRIC_NAMES, aggregate, is_complete, run_stats
from fedjax_kd.sweep.report import (
    csv_text, figure_accuracy, format_column, legend_label, markdown_table, write_figures,
    write_outputs)
from fedjax_kd.sweep.cli import (
    describe, entry, main, parse_set, parse_value, parse_variant, split_top_level)

__all__ = [
    'BASE_STATS', 'DIVERGED_FILE', 'LOG_FILE', 'METRIC_NAMES', 'PLAN_FILE', 'RUN_FILE',
    'RUNS_DIR', 'Run', 'RunResult', 'Variant', 'aggregate', 'apply_overrides', 'cell_label',
    'cell_slug', 'csv_text', 'describe', 'diverged_lines', 'entry', 'execute',
    'figure_accuracy', 'format_column', 'is_complete', 'legend_label', 'load_plan',
    'load_run_config', 'main', 'markdown_table', 'parse_set', 'parse_value', 'parse_variant',
    'plan', 'quiet_logs', 'read_diverged', 'run_one', 'run_stats', 'run_state', 'show_value',
    'split_top_level', 'stopped_status', 'worker_main', 'write_figures', 'write_outputs',
    'write_plan',
]
