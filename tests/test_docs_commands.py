"""Every command and snippet that README.md and docs/*.md show is run by a test, or skipped.

The collector reads README.md and docs/*.md (docs/reproduction.md is left out: it has no code
blocks, and its inline commands are what ``python -m benchmarks.reproduction report`` writes, which
:func:`test_reproduction_report_rebuilds_the_committed_report` regenerates and compares) and
takes:

* fenced blocks tagged bash/sh/shell/console, and untagged ones whose first line starts with
  a command (``python``, ``/usr/bin/time``, ``fedjax-kd``, ...), split into commands:
  backslash continuations joined, comments dropped, a ``for ... done`` loop kept whole, and a
  block written as two columns side by side (its first line two comments) split into both;
* fenced python blocks;
* inline code spans of the prose that are complete commands: ``python -m fedjax_kd.<...>``, ``python -m benchmarks.<...>`` or
  ``python benchmarks/<...>`` with at least one ``--option``. Bare program names
  (``python -m fedjax_kd.sweep``, ``python -m benchmarks.reproduction report``,
  ``python -m fedjax_kd.plot DIR [DIR ...]``) name a program whose complete command is
  collected where the docs give it;
* every other untagged block is quoted output (or a diagram).

:data:`COMMANDS` says, for each command's normalised text (whitespace collapsed), how it is
run: by which test of this file and in which tier, with which smallest-settings overrides
and which checks of its output, or by which other test of the suite, or why it is skipped.
:data:`PYTHON_BLOCKS` and :data:`OUTPUTS` do the same for python blocks and quoted output.
``test_every_collected_item_has_an_entry`` holds the collected set equal to the tables' keys:
when a doc's command changes, it fails and asks for the table to be updated.
``python -m tests.test_docs_commands`` prints how many there are and how each is handled.

Quick tier: the python blocks (every ``# value`` comment on an expression is checked against
what the expression returns), signatures and quoted lines, a few commands that end in
well under a second. Long tier (``-m slow``): the command lines, in subprocesses whose working
folder is a temporary one with the repository's ``configs/`` and the code of ``benchmarks/``
linked in (nothing is written into the checkout; outputs the docs send to ``docs/`` or
``benchmarks/results/`` go to the temporary folder), with unoptimised XLA code (``tests.test_sweep.FAST_XLA``: several times faster to
compile, the same bytes) and the session's compilation cache.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import io
import json
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import tokenize
import types
from typing import Any

import numpy as np
import pytest

from tests import conftest
from tests.test_sweep import FAST_XLA

REPO = pathlib.Path(__file__).resolve().parents[1]
GENERATED = ('docs/reproduction.md',)
SHELL_TAGS = ('bash', 'sh', 'shell', 'console')
PYTHON_TAGS = ('python', 'py')
# The first word of an untagged block that is a command, not quoted output.
COMMAND_WORD = re.compile(r'(python3?(\.\d+)?|/usr/bin/time|fedjax-kd(-sweep)?|[\w./-]*/bin/[\w.-]+'
                          r'|pip3?|git|gcloud|srun|for)(\s|$)')
INLINE_COMMAND = re.compile(r'(python -m (fedjax_kd|benchmarks)\.|python benchmarks/)\S+ .*--')
DOC_MNIST = ('/path/to/mnist.npz', '/work/shared/data/mnist.npz')


# ------------------------------------------------------------------------------ the collector
@dataclasses.dataclass(frozen=True)
class Block:
  doc: str
  line: int
  kind: str   # 'shell', 'python' or 'output'
  text: str

  @property
  def key(self) -> str:
    """How PYTHON_BLOCKS and OUTPUTS name the block: its doc and first line."""
    return f'{self.doc}: {normalize(self.text.splitlines()[0])}'


def doc_paths() -> list[str]:
  docs = sorted(f'docs/{p.name}' for p in (REPO / 'docs').glob('*.md'))
  return ['README.md'] + [d for d in docs if d not in GENERATED]


def normalize(command: str) -> str:
  return ' '.join(command.split())


def fenced_blocks(doc: str) -> list[Block]:
  lines = (REPO / doc).read_text().splitlines()
  out, i = [], 0
  while i < len(lines):
    m = re.match(r'\s*(`{3,}|~{3,})\s*([\w+-]*)\s*$', lines[i])
    if not m:
      i += 1
      continue
    fence, tag, start, body = m.group(1), m.group(2).lower(), i + 1, []
    i += 1
    while i < len(lines) and not lines[i].strip().startswith(fence):
      body.append(lines[i])
      i += 1
    i += 1
    text = textwrap.dedent('\n'.join(body)).strip('\n')
    if tag in PYTHON_TAGS:
      kind = 'python'
    elif tag in SHELL_TAGS or (not tag and COMMAND_WORD.match(text.lstrip())):
      kind = 'shell'
    else:
      kind = 'output'
    out.append(Block(doc, start, kind, text))
  return out


def _scan(line: str, quote: str | None) -> tuple[str, str | None]:
  """``line`` without its comment, and the quote still open at its end."""
  out, i = [], 0
  while i < len(line):
    ch = line[i]
    if quote:
      if ch == quote:
        quote = None
      elif ch == '\\' and quote == '"' and i + 1 < len(line):
        out.append(ch)
        i += 1
        ch = line[i]
    elif ch in '\'"':
      quote = ch
    elif ch == '\\' and i + 1 < len(line):
      out.append(ch)
      i += 1
      ch = line[i]
    elif ch == '#' and (i == 0 or line[i - 1].isspace()):
      break
    out.append(ch)
    i += 1
  return ''.join(out).rstrip(), quote


def shell_commands(text: str) -> list[str]:
  """The commands of a shell block, normalised."""
  lines = text.splitlines()
  side = re.match(r'(#.*?\S)\s{3,}#', lines[0]) if lines else None
  if side:   # two columns, e.g. '# on host 0 ...      # on host 1'
    col = side.end() - 1
    return [c for part in ([ln[:col] for ln in lines], [ln[col:] for ln in lines])
            for c in shell_commands('\n'.join(part))]
  joined, cur, quote = [], '', None
  for ln in lines:
    text_, quote = _scan(ln, quote)
    if quote or text_.endswith('\\'):
      cur += (text_[:-1] if text_.endswith('\\') and not quote else text_) + ' '
      continue
    cur += text_
    if cur.strip():
      joined.append(cur)
    cur = ''
  if cur.strip():
    joined.append(cur)
  out, compound = [], []
  for ln in joined:
    if compound or re.match(r'\s*(for|while|if)\s', ln):
      compound.append(ln.strip())
      if re.search(r'(^|[;\s])(done|fi)\b', ln):
        out.append(' '.join(compound))
        compound = []
      continue
    out.append(ln)
  return [normalize(c) for c in out]


def inline_commands(doc: str) -> list[str]:
  text = re.sub(r'^\s*(`{3,}).*?^\s*\1', '', (REPO / doc).read_text(), flags=re.S | re.M)
  out = []
  for m in re.finditer(r'(?<!`)`([^`]+)`(?!`)', text):
    span = normalize(m.group(1))
    if '\n\n' not in m.group(1) and INLINE_COMMAND.match(span):
      out.append(span)
  return out


def collect() -> dict[str, dict[str, list[str]]]:
  """``{'commands': {command: [where]}, 'python': {key: [where]}, 'output': {...}}``."""
  got = {'commands': {}, 'python': {}, 'output': {}}
  for doc in doc_paths():
    for b in fenced_blocks(doc):
      where = f'{doc}:{b.line}'
      if b.kind == 'shell':
        for c in shell_commands(b.text):
          got['commands'].setdefault(c, []).append(where)
      else:
        got['python' if b.kind == 'python' else 'output'].setdefault(b.key, []).append(where)
    for c in inline_commands(doc):
      got['commands'].setdefault(c, []).append(f'{doc} (inline)')
  return got


def block(key: str) -> Block:
  doc = key.split(': ', 1)[0]
  (b,) = [b for b in fenced_blocks(doc) if b.key == key]
  return b


# ------------------------------------------------------------------------------ the tables
@dataclasses.dataclass(frozen=True)
class Run:
  """Run by ``test`` of this file (tier ``quick`` or ``slow``); ``how``: settings, checks."""
  test: str
  tier: str
  how: str


@dataclasses.dataclass(frozen=True)
class Elsewhere:
  """Run by another test of the suite (``tests/<file>.py::<test>``)."""
  test: str
  how: str


@dataclasses.dataclass(frozen=True)
class Skip:
  reason: str


GPU_SUITE_LOGS = ('python benchmarks/performance/gpu_suite.py --from_logs=benchmarks/results/gpu_suite/h100_dsfl.log,'
                  'benchmarks/results/gpu_suite/h100_blazefl_call1.log,benchmarks/results/gpu_suite/h100_blazefl_call2.log,'
                  'benchmarks/results/gpu_suite/h100_resnet20.log --device_kind="NVIDIA H100 80GB HBM3"')
SCALE_TIME = ('/usr/bin/time -v python -m fedjax_kd.main '
              '--config=benchmarks/performance/scale_clients.py:100000 '
              '--workdir=... --noresume --noprogress '
              '--config.data.source=npz:/tmp/fedjax_kd_scale/mnist_like_1002000.npz '
              '--config.algorithm=fedavg --config.rounds=3 '
              """--config.clients.models="('cnn@0.25',)" --config.clients.participation=0.01 """
              '--config.clients.store=host --config.train.batch_size=10 '
              '--config.distill.public_per_round=100 --config.eval.every=3')
SCARLET_MAIN = ('python -m fedjax_kd.main --config=configs/scarlet_mnist_cpu.py '
                """--config.algorithm={} --config.clients.models="('resnet20@1.0',)" """
                '--config.server.model=resnet20@1.0 --config.seed=k --config.rounds=R '
                '--config.data.source=npz:/work/shared/data/mnist.npz')
REPORT = ('python -m benchmarks.reproduction report --runs=benchmarks/results/reproduction_runs '
          '--out=docs/reproduction.md --results=benchmarks/results --readme=README.md')
DEFAULT_RUN = 'python -m fedjax_kd.main --config=default --workdir=runs/default'
SWEEP_VARIANTS = ('python -m fedjax_kd.sweep --config=configs/default.py '
                  '--algorithms=dsfl,fd,single '
                  '--variant "FedAvg=fedavg;clients.models=(\'cnn@1.0\',)" '
                  '--seeds=0,1,2 --jobs=2 --out=runs/sw')
SWEEP_GRID = ('python -m fedjax_kd.sweep --config=configs/scarlet_digits.py --algorithms=scarlet '
              '--set cache.duration=0,5,10,20 --metrics=hit_ratio --out=runs/scarlet_d')
# docs/configs.md: each paper beside its baselines in one sweep.
BASELINE_SWEEPS = (
    'python -m fedjax_kd.sweep --config=configs/fedcache2_digits.py:baselines '
    '--algorithms=fedcache2,mtfl,knn_per,scdpfl,fedkd,fedcache --seeds=0,1,2 '
    '--out=runs/fc2_baselines --jobs=2',
    'python -m fedjax_kd.sweep --config=configs/acepfl_digits.py:baselines '
    '--algorithms=acepfl,fedavg,fedprox,scaffold,fedala,feddf,kt_pfl,fedkd '
    "--variant 'pfedme=pfedme;pfedme.personal_lr=0.05;pfedme.lr=0.05' "
    "--variant 'perfedavg=perfedavg;perfedavg.beta=0.05' --seeds=0,1,2 "
    '--out=runs/ace_baselines --jobs=2',
    'python -m fedjax_kd.sweep --config=configs/fedentopt_digits.py:c2,fedavg,uniform '
    '--algorithms=fedavg,fedprox,scaffold,fednova,fedrs,fedlc,fedconcat '
    "--variant 'FedEntOpt=fedavg;selection.method=\"fedentopt\"' "
    "--variant 'FedRS + FedEntOpt=fedrs;selection.method=\"fedentopt\"' "
    "--variant 'FedLC + FedEntOpt=fedlc;selection.method=\"fedentopt\"' "
    "--variant 'KL=fedavg;selection.method=\"kl\"' --seeds=0,1,2 --out=runs/fe_baselines "
    '--jobs=2',
)
MULTIHOST_LOOP = ('for i in 0 1; do JAX_PLATFORMS=cpu '
                  'XLA_FLAGS=--xla_force_host_platform_device_count=2 python -m fedjax_kd.main '
                  '--config=configs/default.py --config.rounds=3 --workdir=/tmp/mh '
                  '--coordinator_address=127.0.0.1:12345 --num_processes=2 --process_id=$i & '
                  'done; wait')
TWO_HOSTS = ('python -m fedjax_kd.main --config=... --workdir=/shared/run '
             '--coordinator_address=10.0.0.1:1234 --num_processes=2 --process_id={}')
PLOT_README = ('python -m fedjax_kd.plot DIR [DIR ...] [--out FOLDER] [--labels a,b] '
               '[--exclude_setup_bytes]')
PLOT_WORKDIR = 'python -m fedjax_kd.plot DIR [DIR ...] [--out FOLDER] [--labels a,b]'
CONFIGS_SYNOPSIS = ('python -m fedjax_kd.main --config=configs/<name>.py --workdir=DIR '
                    '[--config.<field>=value ...]')
DEVICE_COUNTS_DOC = ('python benchmarks/reproduction/device_counts.py --config=configs/default.py '
                     '--devices=1,4,8 --seeds=0,1,2 --out=runs/device_counts')
DEVICE_COUNTS_REPORT = ('python benchmarks/reproduction/device_counts.py --devices=1,4,8 --seeds=0,1,2 '
                        '--report=docs/device_counts.md')
REPRO_DSFL_MNIST = ('python -m benchmarks.reproduction run --runs=runs/repro --data=mnist '
                    '--only=dsfl --mnist=/path/to/mnist.npz --jobs=1')
REPRO_RUN = ('python -m benchmarks.reproduction run --runs=runs/repro --jobs=2 '
             '--mnist=/path/to/mnist.npz')
REPRO_SCARLET = ('python -m benchmarks.reproduction run --runs=runs/repro --only=scarlet '
                 '--data=mnist '
                 '--mnist=/path/to/mnist.npz --scarlet_checkout=/work/scarlet_ref '
                 '--scarlet_python=/work/venvs/scarlet/bin/python')
SCARLET_SWEEP = ('python -m fedjax_kd.sweep --config=configs/scarlet_mnist_cpu.py '
                 "--variant SCARLET=scarlet --variant 'DS-FL ERA=dsfl' "
                 '--set data.source=npz:/work/shared/data/mnist.npz '
                 """--set 'clients.models=("resnet20@1.0",)' --set server.model=resnet20@1.0 """
                 '--set rounds=5 --seeds=0,1,2 --out=runs/scarlet_mnist_resnet20')
SCARLET_OFFICIAL_CNN = ('python benchmarks/references/scarlet_official.py --checkout=/work/scarlet_ref '
                        '--model=cnn --rounds=10 --mnist=/path/to/mnist.npz --seeds=0,1,2 '
                        '--out=runs/repro/scarlet_mnist_official_cnn')
SCARLET_OFFICIAL_BY_HAND = ('/work/venvs/scarlet/bin/python benchmarks/references/scarlet_official.py '
                            '--checkout=/work/scarlet_ref --mnist=/work/shared/data/mnist.npz '
                            '--seeds=0,1,2 --algorithms=scarlet,dsfl --out=runs/scarlet_official '
                            '[--rounds=5] [--threads=1] [--set FIELD=VALUE ...]')
SCALE = 'python benchmarks/performance/scale_clients.py --clients=1000,10000,100000'

MULTI_HOST = 'a real multi-host cluster'
PIP_NETWORK = 'installs from PyPI into a fresh venv (network, minutes); .ci/run does it'
SCARLET_VENV = ("builds the SCARLET authors' environment: a separate venv with torch 2.14.1 "
                "(a 5.5 GB download) and a clone of their repository")
TORCH = ('needs torch (the [bench] extra, which [test] does not install) and rounds of minutes '
         '(the table beside it: 15-155 s a round); tests/test_vs_torch.py runs the script tiny '
         'where torch is installed')

COMMANDS: dict[str, Run | Elsewhere | Skip] = {
    # README.md
    'python3 -m venv .venv && .venv/bin/pip install .': Skip(PIP_NETWORK),
    DEFAULT_RUN: Run(
        'test_the_default_run_prints_the_readme_table', 'slow',
        '--config.rounds=1 in a temporary folder; the closing table has the README\'s rows in '
        'its order, its bytes lines are exactly the README\'s 30-round bytes over 30 rounds, '
        "the round line and the compile lines have the README's and docs/performance.md's form"),
    'fedjax-kd --config=default --workdir=runs/default': Run(
        'test_the_default_run_prints_the_readme_table', 'slow',
        'the console script, --config.rounds=2 on the same workdir: resumes the run above '
        '(the same config) for one round'),
    ("python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
     '.venv/bin/python -m pytest tests'): Skip(
         'the quick tier after a fresh install (network): this file is part of it; .ci/run '
         'runs it'),
    '.venv/bin/python -m pytest tests -m slow': Skip(
        'the long tier, which runs this file: running it from here would recurse'),
    SWEEP_VARIANTS: Run(
        'test_the_readme_sweeps', 'slow',
        '--set rounds=1 --seeds=0: four variants in two workers; OUT/runs/<variant>/seed0, '
        'compare.md/csv with the four variants, FedAvg with its own models, both figures'),
    **{c: Run('test_the_baseline_sweeps_plan_every_run', 'slow',
              '--dry_run: every run of the sweep is planned and its config validated (each '
              "algorithm's rounds run in tests/test_golden.py's tiny cases and "
              'tests/test_baselines_*.py)') for c in BASELINE_SWEEPS},
    SWEEP_GRID: Run(
        'test_the_readme_sweeps', 'slow',
        '--set rounds=2 --seeds=0: the four grid cells, hit_ratio 0 without a cache and above '
        '0 with one'),
    REPORT: Run(
        'test_reproduction_report_rebuilds_the_committed_report', 'slow',
        'in a temporary folder with benchmarks/results/reproduction_runs linked: the report and the README '
        'block it writes equal the committed ones (but for the Generated-on line), and the '
        'same figures'),
    'python -m fedjax_kd.data.convert SOURCE --out=FILE': Run(
        'test_convert_writes_an_npz', 'slow', 'SOURCE=digits, FILE in a temporary folder: the '
        'npz loads back as the same arrays'),
    PLOT_README: Run(
        'test_the_default_run_prints_the_readme_table', 'slow',
        'on the default run above, with --out, --labels and --exclude_setup_bytes: the four '
        'figures docs/workdir.md lists'),
    # docs/configs.md
    CONFIGS_SYNOPSIS: Run(
        'test_the_default_run_prints_the_readme_table', 'slow',
        '<name>=default, DIR=the default run above, --config.rounds=3: the path form resumes '
        'the run the name form made'),
    'python -m fedjax_kd.data.convert tfds:<name> --out=<name>.npz': Skip(
        'tfds: sources download their data set (network); the same converter runs on digits '
        '(README\'s command above)'),
    'python -m fedjax_kd.data.text imdb --aclimdb=DIR --out=imdb.npz': Elsewhere(
        'tests/test_text.py::test_converter_from_aclimdb',
        "text.main(['imdb', '--aclimdb=DIR', '--out=...']) on a fixture in aclImdb's layout"),
    # docs/custom_algorithm.md
    'python -m fedjax_kd.main --config=my_median.py --workdir=runs/median': Run(
        'test_the_custom_algorithm_guide_runs_from_the_command_line', 'slow',
        "my_median.py = the guide's two python blocks; --config.rounds=1"),
    'python -m fedjax_kd.sweep --config=my_median.py --seeds=0,1,2 --out=runs/median_sweep': Run(
        'test_the_custom_algorithm_guide_sweeps', 'slow',
        "my_median.py as above; --set rounds=1 --seeds=0: the sweep's worker runs "
        'median_distill'),
    # docs/device_counts.md, docs/workdir.md
    DEVICE_COUNTS_DOC: Skip(
        "30 rounds of the default config per device count and seed (the report's nine runs: "
        'most of an hour); at its smallest (devices 1,2, seed 0, a 3-round tiny config) 30 s '
        'for a check of the report\'s form only; tests/test_sharding.py runs the default on '
        '4 devices and holds it to the tolerances this report measures'),
    DEVICE_COUNTS_REPORT: Skip('the command above, with --report: the same reason'),
    # docs/dsfl_mnist.md, docs/results.md
    REPRO_DSFL_MNIST: Run(
        'test_the_reproduction_runs_plan_and_validate', 'slow',
        '--dry_run (the sweep is 25 minutes a seed): plans dsfl_mnist\'s 25 runs, every config '
        'valid with real MNIST; tests/test_reproduction.py runs the pipeline --tiny'),
    REPRO_RUN: Run(
        'test_the_reproduction_runs_plan_and_validate', 'slow',
        '--dry_run (the sweeps are days of CPU): every sweep planned and valid; '
        'tests/test_reproduction.py::test_tiny_pipeline_writes_every_section runs it --tiny'),
    'python -m benchmarks.reproduction archive --runs=runs/repro --out=benchmarks/results/reproduction_runs':
        Elsewhere('tests/test_reproduction.py::test_tiny_pipeline_writes_every_section',
                  'archive --runs=<the --tiny runs> --out=<a temporary folder>, then the same '
                  'report from the archive'),
    # docs/multihost.md
    ("gcloud compute tpus tpu-vm ssh my-slice --zone=us-central2-b --worker=all --command=' cd "
     'fedjax_kd && python -m fedjax_kd.main --config=configs/default.py \\ '
     "--workdir=gs://my-bucket/runs/dsfl --distributed=on'"): Skip('needs a Cloud TPU slice'),
    ('srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 python -m fedjax_kd.main '
     '--config=configs/default.py --workdir=/shared/runs/dsfl'): Skip(
         'needs a SLURM cluster with GPUs'),
    TWO_HOSTS.format(0): Skip(
        'needs two hosts; the same flags on one machine are the CPU loop below, which runs'),
    TWO_HOSTS.format(1): Skip(
        'needs two hosts; the same flags on one machine are the CPU loop below, which runs'),
    MULTIHOST_LOOP: Run(
        'test_the_multihost_cpu_loop', 'slow',
        "bash, a free port, the workdir in a temporary folder, --config.rounds=1 and mlp@0.25 "
        "models (the default's two CNN cohorts on a 4-device mesh in two processes take 80 s "
        'to compile): one row, 2 processes x 2 devices, the default run\'s bytes'),
    'python benchmarks/performance/multihost_cpu.py --processes=2 --repeats=3 --rounds=6': Skip(
        'three layouts, each compiling cold in its own cache with its own XLA_FLAGS: 2 minutes '
        'even at --repeats=1 --rounds=3 on a 3-round tiny config; the launch it times is the '
        'CPU loop above and tests/test_multihost.py'),
    # docs/performance.md
    'python benchmarks/performance/engine_throughput.py --clients=10,100,1000': Skip(
        'a throughput benchmark: 28 s at its smallest (--clients=2 --steps=2 --repeats=1), '
        'nearly all compiling; the call it times (Federation.run of the training program) is '
        "tests/test_engine.py's"),
    f'{SCALE} --markdown': Run(
        'test_scale_clients', 'slow',
        '--clients=100 --data_dir=<tmp>: the command it prints is docs/performance.md\'s '
        '/usr/bin/time block with K=100, the markdown header is the doc\'s'),
    f'{SCALE} --algorithm=dsfl --markdown': Run(
        'test_scale_clients', 'slow', '--clients=100 --data_dir=<tmp>: one DS-FL row'),
    'python benchmarks/performance/scale_clients.py --clients=1000,10000 --store=device': Run(
        'test_scale_clients', 'slow', '--clients=100 --data_dir=<tmp>: one device-store row'),
    SCALE_TIME: Run(
        'test_scale_clients', 'slow',
        'what scale_clients.py runs for each K: its printed command, with K=100, equals this '
        'block'),
    'python -m benchmarks.reproduction standing --runs=benchmarks/results/reproduction_runs --replay':
        Elsewhere('tests/test_reproduction_claims.py::'
                  'test_the_committed_report_names_every_stale_run_and_counts_none',
                  'the state this command leaves the archive in (the runs it could not tie '
                  'are named by the report and counted nowhere); the replay rule is tested on '
                  'known rows there too'),
    'python -m benchmarks.reproduction compact --runs=benchmarks/results/reproduction_runs': Elsewhere(
        'tests/test_repro_archive.py::test_compact_converts_in_place_and_reads_back_every_byte',
        'on a folder holding one sweep of the archive: the tar and manifest it writes extract '
        'to the same files, byte for byte'),
    'python benchmarks/performance/speed.py --workload blazefl --rounds 1': Elsewhere(
        'tests/test_speed_benchmark.py::test_speed_benchmark_tiny_blazefl_writes_the_json',
        '--workload=blazefl --rounds=1 with --small --num_clients=2 --clients_per_round=1'),
    'python benchmarks/performance/speed.py --workload dsfl_mnist --clients_per_round 10 --rounds 1': Skip(
        'a timing benchmark: 28 s even at --small --num_clients=2 --clients_per_round=1 '
        "(real MNIST: minutes a round); speed.py's pipeline is "
        'tests/test_speed_benchmark.py\'s (the blazefl workload)'),
    ('python benchmarks/performance/vs_torch.py --workload=dsfl --repeats=3 --threads=2 '
     '--out=runs/vs_torch.json'): Skip(TORCH),
    ('python benchmarks/performance/vs_torch.py --workload=all --repeats=3 --threads=2 '
     '--out=benchmarks/results/vs_torch_cpu.json'): Skip(TORCH),
    ('python benchmarks/performance/vs_torch.py --workload=many_fedavg --many_clients=100 --repeats=3 '
     '--threads=2 --mnist=/path/to/mnist.npz --out=runs/bench/many_fedavg_k100.json'): Skip(TORCH),
    GPU_SUITE_LOGS: Run(
        'test_gpu_suite_rebuilds_the_h100_table', 'slow',
        'as written (reads benchmarks/results/gpu_suite/): every row it prints is in docs/performance.md'),
    'python benchmarks/performance/multihost_cpu.py --processes=2 --repeats=3': Skip(
        'the block above without --rounds: the same reason'),
    ('python benchmarks/performance/config_costs.py --from_json=benchmarks/results/config_costs.json '
     '--markdown=docs/configs.md'): Elsewhere(
        'tests/test_config_costs.py::test_the_docs_table_is_what_the_archived_numbers_give',
        'as written, into a copy of docs/configs.md: the table equals the committed one'),
    ('python benchmarks/performance/config_costs.py --from_json=benchmarks/results/config_costs.json '
     '--memory_markdown=docs/performance.md'): Elsewhere(
        'tests/test_config_costs.py::test_the_docs_table_is_what_the_archived_numbers_give',
        'as written, into a copy of docs/performance.md: the section equals the committed one'),
    'python benchmarks/performance/chunk_cost.py --mnist=/path/to/mnist.npz --out=benchmarks/results/chunk_cost_cpu.json':
        Elsewhere('tests/test_chunk_cost.py::test_each_chunk_runs_in_its_own_process_and_the_'
                  'ratio_is_to_all_at_once', 'measure() on the default config (10 clients) at '
                  'C = 10 and 5, two repeats, --out in a temporary folder: each (C, repeat) its '
                  'own run with that chunk, the medians and ratios those of the runs'),
    ('python benchmarks/performance/chunk_cost.py --from_json=benchmarks/results/chunk_cost_cpu.json '
     '--markdown=docs/performance.md'): Elsewhere(
        'tests/test_chunk_cost.py::test_the_docs_section_is_what_the_archived_numbers_give',
        'as written, into a copy of docs/performance.md: the section equals the committed one'),
    # docs/cluster.md
    "pip install 'fedjax_kd[ray]'": Skip(
        "installs from PyPI (network); CI installs the same extra through '.[test]', which "
        'tests/test_executors.py runs on'),
    'ray start --head --port=6379': Skip(
        f'{MULTI_HOST}: benchmarks/performance/local_clusters.py runs the same `ray start --head` on '
        '127.0.0.1 for tests/test_executors.py'),
    'ray start --address=HEAD_IP:6379': Skip(
        f'{MULTI_HOST}: benchmarks/performance/local_clusters.py joins each node the same way on 127.0.0.1'),
    ('python -m fedjax_kd.sweep --config=configs/dsfl_mnist.py --algorithms=dsfl,fd,single '
     '--seeds=0,1,2,3,4 --out=/shared/runs/dsfl_mnist --executor=ray --ray_address=auto '
     '--run_resources=CPU=4,GPU=1'): Elsewhere(
        'tests/test_executors.py::test_a_sweep_through_ray_gives_the_local_rows_and_runs_on_'
        'both_nodes', 'the same flags on configs/default.py at 3 rounds (dsfl_mnist: hours), '
        'two algorithms x two seeds, --ray_address of a two-node cluster on 127.0.0.1 and '
        '--run_resources=CPU=1 (it has no GPU)'),
    ('python -m fedjax_kd.sweep --config=configs/dsfl_mnist.py --algorithms=dsfl,fd,single '
     '--seeds=0,1,2,3,4 --out=/shared/runs/dsfl_mnist --executor=slurm --slurm_partition=gpu '
     '--slurm_gpus=1 --slurm_cpus=8 --slurm_time=4:00:00 --slurm_max_running=20'): Elsewhere(
        'tests/test_executors.py::test_a_sweep_through_slurm_gives_the_local_rows',
        'the same flags on configs/default.py at 3 rounds, on a one-node SLURM on 127.0.0.1: '
        'its partition debug, --slurm_cpus=1, --slurm_time=30, --slurm_max_running=2, no '
        '--slurm_gpus (it has no GPU)'),
    ('python -m benchmarks.reproduction run --runs=/shared/runs/repro --executor=ray '
     '--ray_address=auto --run_resources=CPU=4,GPU=1'): Elsewhere(
        'tests/test_executors.py::test_the_reproduction_runs_through_ray_to_its_compare_md',
        "--tiny --only=dsfl --sweeps=dsfl_digits, --ray_address of the tests' cluster, "
        '--run_resources=CPU=1: every run ran as a Ray task; then the report'),
    'python -m benchmarks.reproduction report --runs=/shared/runs/repro': Elsewhere(
        'tests/test_executors.py::test_the_reproduction_runs_through_ray_to_its_compare_md',
        '--tiny --only=dsfl, --out in a temporary folder, after the run above'),
    ('python -m benchmarks.reproduction run --runs=/shared/runs/repro --executor=slurm '
     '--slurm_partition=gpu --slurm_gpus=1 --slurm_cpus=8 --slurm_time=8:00:00'): Skip(
        f'{MULTI_HOST} with GPUs; the reproduction hands its runs to the same executor as the '
        'sweep (fedjax_kd.sweep.executors.execute), which the SLURM tests run'),
    'python benchmarks/performance/local_clusters.py ray --folder=/tmp/ray_here --nodes=2': Elsewhere(
        'tests/test_executors.py::test_a_sweep_through_ray_gives_the_local_rows_and_runs_on_'
        'both_nodes', "local_clusters.start_ray, what the command calls, with the test's "
        'folder; the command form then waits for Ctrl-C'),
    'python benchmarks/performance/local_clusters.py slurm --folder=/tmp/slurm_here': Elsewhere(
        'tests/test_executors.py::test_a_sweep_through_slurm_gives_the_local_rows',
        "local_clusters.start_slurm, what the command calls, with the test's folder; the "
        'command form then waits for Ctrl-C'),
    'python benchmarks/performance/cluster_overhead.py --repeats=3 --out=benchmarks/results/cluster_overhead.json': Skip(
        'a timing benchmark (minutes: a Ray cluster and 8 sweeps); its table is rebuilt from '
        'the committed numbers below'),
    ('python benchmarks/performance/cluster_overhead.py --from_json=benchmarks/results/cluster_overhead.json '
     '--markdown=docs/cluster.md'): Elsewhere(
        'tests/test_executors.py::test_the_docs_overhead_table_is_what_the_archived_numbers_give',
        'as written, into a copy of docs/cluster.md: the section equals the committed one'),
    'python benchmarks/performance/remat.py --out=benchmarks/results/remat_cpu.json': Elsewhere(
        'tests/test_remat.py::test_remat_gives_memory_back_on_the_cpu_only_in_a_loop',
        "remat.main with 1 client of 8 images, 1 repeat, --out in a temporary folder: the "
        "docs' three findings (ResNet-20 and the written-out control give nothing back, the "
        'scanned control does)'),
    'python -m fedjax_kd.config --option_tables=docs/configs.md': Elsewhere(
        'tests/test_options.py::test_the_committed_option_tables_are_generated_from_the_'
        'declarations', 'config.write_option_tables on a copy of docs/configs.md: the tables '
        'equal the committed ones'),
    'python benchmarks/performance/warm_start.py --repeats=5': Elsewhere(
        'tests/test_warm_start.py::test_warm_run_is_ready_before_it_ends',
        "warm_start.main(['--repeats=1', '--out=...'])"),
    'python benchmarks/performance/memory_plan.py --mnist=mnist.npz --out=F.json': Skip(
        'needs a GPU: the H100 measurement (device peak_bytes_in_use); its CPU form is the '
        '--out=benchmarks/results/memory_plan_cpu.json command, which runs'),
    'python benchmarks/performance/memory_plan.py --from_json=benchmarks/results/memory_plan_h100.json': Run(
        'test_memory_plan_prints_the_saved_tables', 'quick',
        "as written: its table is docs/performance.md's H100 table (and --from_json of the "
        "CPU file gives the CPU table)"),
    ('python benchmarks/performance/memory_plan.py --configs=all --mnist=mnist.npz '
     '--out=benchmarks/results/memory_plan_configs.json'): Elsewhere(
        'tests/test_memory.py::test_the_plan_of_each_digits_config_is_within_15_percent_of_'
        'xlas_figure', 'the same plan and memory.xla_figure on six digits configs, in-process '
        '(the whole list compiles every paper-sized config: most of an hour on 2 cores)'),
    'python benchmarks/performance/memory_plan.py --from_json=benchmarks/results/memory_plan_configs.json': Run(
        'test_memory_plan_prints_the_saved_config_table', 'quick',
        "as written: its table is docs/performance.md's table of the shipped configs"),
    'python benchmarks/performance/memory_plan.py --out=benchmarks/results/memory_plan_cpu.json': Run(
        'test_memory_plan_measures_the_small_size', 'slow',
        '--sizes=small (medium takes 14 GB on a CPU), --out in a temporary folder: the small '
        "row's data, state, step and estimate are benchmarks/results/memory_plan_cpu.json's"),
    'python benchmarks/performance/profile_round.py --workload=many_fedavg --clients=100 --model=leaf_cnn':
        Skip('needs real MNIST and traces a round with jax.profiler (15 s at --clients=2): '
             'a profile, not a result; its grouping of the trace is '
             'tests/test_vs_torch.py::test_profile_groups_and_shares_by_hand'),
    # docs/results.md (its report command is README's)
    # docs/scarlet_official.md
    'python3.11 -m venv /work/venvs/scarlet': Skip(SCARLET_VENV),
    '/work/venvs/scarlet/bin/pip install torch==2.14.1 torchvision==0.29.1': Skip(SCARLET_VENV),
    '/work/venvs/scarlet/bin/pip install tqdm tyro': Skip(SCARLET_VENV),
    '/work/venvs/scarlet/bin/pip install -e /work/main': Skip(SCARLET_VENV),
    'git clone /work/.mirror/kitsuyaazuma+SCARLET/repo /work/scarlet_ref': Skip(SCARLET_VENV),
    SCARLET_OFFICIAL_CNN: Run(
        'test_scarlet_official_refuses_a_missing_checkout', 'quick',
        "needs the SCARLET authors' checkout and torch (hours): run with a --checkout that "
        'does not exist, the one-line error and exit code 2 the doc promises'),
    SCARLET_OFFICIAL_BY_HAND: Run(
        'test_scarlet_official_refuses_a_missing_checkout', 'quick',
        'as above, with this Python and the optional flags --rounds=5 --threads=1'),
    REPRO_SCARLET: Run(
        'test_the_reproduction_runs_plan_and_validate', 'slow',
        "--dry_run: SCARLET's sweeps planned and valid (the authors' code is not run)"),
    SCARLET_MAIN.format('scarlet'): Run(
        'test_the_matching_scarlet_runs_parse_and_validate', 'quick',
        'k=0, R=1, real MNIST (skips without): parsed and validated with fedjax_kd.main.parse, '
        'as the doc says (ResNet-20 takes minutes a round)'),
    SCARLET_MAIN.format('dsfl'): Run(
        'test_the_matching_scarlet_runs_parse_and_validate', 'quick', 'as the line above'),
    SCARLET_SWEEP: Run(
        'test_the_reproduction_runs_plan_and_validate', 'slow',
        '--dry_run, real MNIST (skips without): the six runs planned and valid (ResNet-20 on '
        'MNIST is minutes a round)'),
    # docs/testing.md (its two commands are README's)
    ('python benchmarks/reproduction/golden_spread.py --out=runs/golden_spread '
     '--variants=avx2,threads1,devices4,noynn,ci@ci --report=docs/testing.md'): Skip(
         'every golden case once per XLA build, each on one pinned core: 74 s even at '
         '--variants=threads1 --cases=tiny; the cases are tests/test_golden.py\'s'),
    # docs/versions.md
    'python3 -m venv /tmp/vf': Skip(PIP_NETWORK),
    '/tmp/vf/bin/pip install -q --upgrade pip': Skip(PIP_NETWORK),
    ('/tmp/vf/bin/pip install -q jax==0.8.1 flax==0.10.6 optax==0.2.4 chex==0.1.89 numpy==2.0.0 '
     'absl-py==2.1.0 ml_collections==1.0.0 pillow==10.4.0 orbax-checkpoint==0.11.17 '
     'tensorflow-datasets==4.9.10 matplotlib==3.8.4 tensorboardX==2.6 pytest==9.0.0 '
     'scikit-learn==1.9.0 nbclient==0.10.0 nbformat==5.10.0 ipykernel==6.29.0'): Skip(PIP_NETWORK),
    '/tmp/vf/bin/pip install -q --no-deps -e .': Skip(PIP_NETWORK),
    '/tmp/vf/bin/pip check': Skip('checks the /tmp/vf environment the lines above build'),
    # docs/workdir.md
    PLOT_WORKDIR: Run(
        'test_the_default_run_prints_the_readme_table', 'slow',
        'DIR=the default run above, no optional flags: the four figures in DIR/plots'),
}

PYTHON_BLOCKS: dict[str, Run | Elsewhere | Skip] = {
    'README.md: from fedjax_kd.data import sources': Run(
        'test_readme_data_snippet_registers_a_source', 'quick',
        'x_train ... y_test from the digits, config = presets.digits(): the config validates '
        "and the name loads the arrays"),
    'README.md: import jax.numpy as jnp': Run(
        'test_python_blocks_print_what_their_comments_say', 'quick',
        'executed; every # value on an expression is what it returns'),
    'docs/library.md: import jax.numpy as jnp': Run(
        'test_python_blocks_print_what_their_comments_say', 'quick',
        'executed; every # value on an expression is what it returns'),
    'docs/custom_algorithm.md: import dataclasses': Elsewhere(
        'tests/test_custom_algorithm.py::test_registered_algorithm_runs_with_bytes_counted',
        'executed as a module, its algorithm run for two rounds (and its math by hand)'),
    'docs/custom_algorithm.md: """FedAvg on the balanced softmax (Ren et al., NeurIPS 2020)."""':
        Elsewhere('tests/test_custom_algorithm.py::test_a_changed_loss_runs_and_is_the_balanced_softmax',
                  'executed; the loss by hand, and a round of it on tiny data'),
    'docs/custom_algorithm.md: """FedSAM: FedAvg with sharpness-aware local steps (Qu et al., ICML 2022)."""':
        Elsewhere('tests/test_custom_algorithm.py::test_a_local_step_of_its_own_is_fedavgs_at_rho_0',
                  'executed; rho = 0 gives FedAvg\'s round metric for metric, rho = 0.05 another'),
    'docs/custom_algorithm.md: from fedjax_kd.config import presets': Elsewhere(
        'tests/test_custom_algorithm.py::'
        'test_the_options_come_from_the_command_line_and_a_typo_is_refused',
        'the two blocks as one config file, parsed and validated (and run by this file\'s '
        'command tests)'),
    'docs/custom_algorithm.md: from fedjax_kd.algorithms import protocol': Elsewhere(
        'tests/test_custom_algorithm.py::test_a_protocol_member_with_only_aggregate_runs',
        'executed after the first block, its member run for two rounds with its bytes '
        'counted'),
    'docs/cluster.md: from fedjax_kd.sweep import executors': Elsewhere(
        'tests/test_executors.py::test_the_guide_executor_runs_a_sweep_from_its_config_file',
        'the block with a get_config() as a config file: a sweep with --executor=one_by_one '
        'and --jobs=2 runs its two runs one after the other'),
    'docs/design.md: state, out = algorithm.round(state, r) # r: Round(t, fed, active, epochs_k, carried)':
        Run('test_design_md_weighted_example', 'slow',
            "executed on the Weighted example's state and a Round(t, fed, active, epochs_k, carried=None)"),
    ("docs/design.md: SGD(loss, epochs, batch_size, slot='train', augment=None, fresh=False, "
     'transforms=())'): Run(
         'test_design_md_signatures_and_state_parts', 'quick',
         'the fields and defaults are those of core.program.SGD and Batches'),
    'docs/design.md: @flax.struct.dataclass': Run(
        'test_design_md_weighted_example', 'slow',
        'executed; one round on tiny data: every client counted once; the same weights in '
        'server state are refused with the quoted ValueError'),
}

OUTPUTS: dict[str, str] = {
    'README.md: -------------------------------------------------':
        'test_the_default_run_prints_the_readme_table (rows, rule, bytes); '
        'tests/test_reproduction.py::test_readme_example_output_is_the_archived_default_run '
        '(the accuracies are the archived seed-0 run\'s)',
    'docs/design.md: config (ml_collections) --validate--> ExperimentSpec (frozen; ConfigError '
    'names the field)': 'not output: a diagram of the engine',
    'docs/cluster.md: error: --executor=ray: node 5c1f9a0e27d4 (10.0.0.7) does not see this '
    "machine's files: it read 'cannot read it (No such file or directory)' from "
    '/shared/runs/sweep/runs/.fedjax_kd_storage_probe_9e0c..., written here just now. Every '
    "node must see the sweep's folder at the same path (shared storage such as NFS: put --out "
    'there); nothing was started':
        'test_quoted_error_lines (the line storage_error writes for that node and file; '
        'tests/test_executors.py::test_a_node_that_cannot_see_the_folder_is_one_line_and_'
        'nothing_starts holds a real node to it)',
    "docs/cluster.md: error: --executor=ray: no Ray cluster at --ray_address=10.0.0.7:6379 "
    "(nothing listens there); start one with 'ray start --head', or give its head's HOST:PORT "
    '(docs/cluster.md)':
        'test_quoted_error_lines (the line no_cluster writes for that address; '
        'tests/test_executors.py::test_a_ray_address_where_nothing_listens_is_one_line_within_'
        'seconds holds a real sweep to it)',
    'docs/cluster.md: Ray at 127.0.0.1:40123, in a network namespace with only lo; run the '
    'sweep there:': 'test_quoted_error_lines (local_clusters.announce for a cluster at that '
                    "address, its namespace's holder pid 4242)",
    'docs/cluster.md: #!/bin/bash':
        'test_the_cluster_docs_template_is_one_the_slurm_executor_takes (the block as '
        '--slurm_template: its lines, then the run\'s command)',
    'docs/design.md: AlgState': 'test_design_md_signatures_and_state_parts (the four fields)',
    "docs/design.md: ValueError: row['w'] has shape (8,), but this round has 4 clients (of 8): "
    'per-client': 'test_design_md_weighted_example (exactly)',
    'docs/multihost.md: error: process 1 of 2 stopped responding at round 4; rerun the same '
    'command on every process to resume from the newest checkpoint (round 2)':
        'test_quoted_error_lines (the form tests/test_faults_multiprocess.py holds a killed '
        "process's line to)",
    'docs/performance.md: round 1: compiling (persistent cache ~/.cache/fedjax_kd/jax_cache) ...':
        'test_the_default_run_prints_the_readme_table (the three lines, the program count and '
        'the bytes exactly)',
    'docs/workdir.md: error: --workdir: runs/x is in use by another fedjax_kd run (pid 4242 on '
    'node7, since 2026-11-24 21:03:11); wait for it to end, or use another directory.':
        'test_quoted_error_lines (exactly, from a held lock naming that holder)',
}


# ------------------------------------------------------------------------------ helpers
def _entry(key: str, table: dict[str, Any] = COMMANDS) -> Run:
  """The table's entry of ``key``, which must be run by the calling test."""
  entry = table[key]
  caller = sys._getframe(1).f_code.co_name   # pylint: disable=protected-access
  assert isinstance(entry, Run) and entry.test == caller, (key, entry, caller)
  return entry


def _sub(command: str, *pairs: tuple[str, str]) -> str:
  for old, new in pairs:
    assert old in command, (old, command)
    command = command.replace(old, new)
  return command


def _argv(command: str) -> list[str]:
  """A documented command as argv: ``python`` is this interpreter, the console scripts this
  venv's, the docs' MNIST paths the one the tests use."""
  argv = shlex.split(command)
  if argv[0] in ('python', 'python3') or argv[0].endswith('/bin/python'):
    argv[0] = sys.executable
  elif argv[0] in ('fedjax-kd', 'fedjax-kd-sweep'):
    script = shutil.which(argv[0], path=os.path.dirname(sys.executable))
    if script is None:
      pytest.skip(f'{argv[0]} is not installed beside {sys.executable}')
    argv[0] = script
  # One pass: the test's path may itself contain a docs path (CI's checkout
  # under /check/work holds /check/work/shared/...), so replacing one after
  # the other would rewrite the first replacement.
  mnist = str(conftest.mnist_path())
  pattern = re.compile('|'.join(re.escape(p) for p in DOC_MNIST))
  return [pattern.sub(lambda _: mnist, a) for a in argv]


def _needs_mnist() -> None:
  if not conftest.mnist_path().exists():
    pytest.skip(f'no real MNIST at {conftest.mnist_path()} ($FEDJAX_KD_MNIST)')


def _env() -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO), env.get('PYTHONPATH')]))
  env['XLA_FLAGS'] = ' '.join(filter(None, [env.get('XLA_FLAGS'), FAST_XLA]))
  return env


def _run(argv: list[str], cwd: pathlib.Path, timeout: int = 400,
         ok: bool = True) -> subprocess.CompletedProcess:
  r = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout,
                     check=False)
  if ok:
    assert r.returncode == 0, f'{shlex.join(argv)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}'
  return r


@pytest.fixture(scope='module')
def work(tmp_path_factory) -> pathlib.Path:
  """A folder to run the docs' commands in: configs/ and the code of benchmarks/ link to the
  checkout's; benchmarks/results/ holds links to the artefacts the commands read (what they
  write stays in this folder), and docs/ is empty."""
  root = tmp_path_factory.mktemp('docs_commands')
  (root / 'configs').symlink_to(REPO / 'configs')
  (root / 'docs').mkdir()
  (root / 'benchmarks' / 'results').mkdir(parents=True)
  for child in (REPO / 'benchmarks').iterdir():
    if child.name != 'results':
      (root / 'benchmarks' / child.name).symlink_to(child)
  for name in ('reproduction_runs', 'gpu_suite', 'memory_plan_h100.json',
               'memory_plan_cpu.json', 'memory_plan_configs.json', 'authors_lockstep.json'):
    (root / 'benchmarks' / 'results' / name).symlink_to(REPO / 'benchmarks' / 'results' / name)
  return root


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _doc_text(doc: str) -> str:
  return (REPO / doc).read_text()


# ------------------------------------------------------------------------------ the tables
def test_every_collected_item_has_an_entry():
  got = collect()
  for name, table in (('commands', COMMANDS), ('python', PYTHON_BLOCKS), ('output', OUTPUTS)):
    new = sorted(set(got[name]) - set(table))
    stale = sorted(set(table) - set(got[name]))
    assert not new and not stale, (
        f'tests/test_docs_commands.py: the docs {name} changed; update the table.\n'
        + ''.join(f'  new: {k!r} ({", ".join(got[name][k])})\n' for k in new)
        + ''.join(f'  no longer in the docs: {k!r}\n' for k in stale))


def test_every_entry_names_a_test_that_exists():
  here = sys.modules[__name__]
  for key, entry in [*COMMANDS.items(), *PYTHON_BLOCKS.items()]:
    if isinstance(entry, Run):
      fn = getattr(here, entry.test, None)
      assert callable(fn), (key, entry.test)
      slow = any(m.name == 'slow' for m in getattr(fn, 'pytestmark', []))
      assert entry.tier in ('quick', 'slow') and slow == (entry.tier == 'slow'), (key, entry)
    elif isinstance(entry, Elsewhere):
      path, name = entry.test.split('::')
      assert re.search(rf'^def {name}\(', (REPO / path).read_text(), flags=re.M), entry.test
    else:
      assert isinstance(entry, Skip) and entry.reason, key
  for key, checked_by in OUTPUTS.items():
    name = checked_by.split(' ', 1)[0]
    assert checked_by.startswith('not output') or callable(getattr(here, name, None)), key


def test_the_collector_on_a_block_of_each_kind():
  text = '\n'.join(left.ljust(20) + right for left, right in (
      ('# on host 0', '# on host 1'), ('python a.py \\', 'python a.py \\'),
      ('  --x=0', '  --x=1')))
  assert shell_commands(text) == ['python a.py --x=0', 'python a.py --x=1']
  assert shell_commands("run --s 'a # b' \\\n  --t=1   # note\n# only a comment\nnext") == [
      "run --s 'a # b' --t=1", 'next']
  assert shell_commands('for i in 0 1; do\n  echo $i &\ndone; wait') == [
      'for i in 0 1; do echo $i & done; wait']
  # A quoted string over several lines is one argument (a backslash in it is kept).
  assert shell_commands("cmd --c='\n  a \\\n  b'") == ["cmd --c=' a \\ b'"]


# ------------------------------------------------------------------------------ python blocks
def _comments(source: str) -> dict[int, str]:
  tokens = tokenize.generate_tokens(io.StringIO(source).readline)
  return {t.start[0]: t.string[1:].strip() for t in tokens if t.type == tokenize.COMMENT}


_LITERALS = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.BinOp, ast.UnaryOp,
             ast.Add, ast.Sub, ast.Mult, ast.Div, ast.USub, ast.Load)


def _literal(text: str) -> Any:
  """``text`` as a literal or arithmetic of literals (units after numbers dropped), or raises
  ValueError."""
  text = re.sub(r'(\d)\s+(bits?|B|kB|MB)\b', r'\1', text)
  try:
    node = ast.parse(text, mode='eval')
  except SyntaxError as e:
    raise ValueError(text) from e
  if not all(isinstance(n, _LITERALS) for n in ast.walk(node)):
    raise ValueError(text)
  return eval(compile(node, '<comment>', 'eval'), {'__builtins__': {}})  # pylint: disable=eval-used


def _quoted(comment: str) -> tuple[Any, float] | None:
  """The value a ``# comment`` quotes and its tolerance (half a unit of its last digit), or
  None for prose. ``550 = 10 * 100 * (0.5 + 0.05)``: the value and its arithmetic;
  ``VALUE: words``: the value (the longest part before a ': ' that is one)."""
  cuts = [len(comment)] + [m.start() for m in re.finditer(r':\s', comment)][::-1]
  for cut in cuts:
    text, _, rhs = comment[:cut].partition(' = ')
    try:
      value = _literal(text)
    except ValueError:
      continue
    if rhs:
      assert np.isclose(_literal(rhs), value), comment
    decimals = max((len(d) for d in re.findall(r'\d\.(\d+)', text)), default=0)
    arithmetic = bool(re.search(r'\d\s*[-+*/]\s*\(?\d', text))
    return value, (0.5 * 10.0**-decimals + 1e-7 if decimals and not arithmetic else 1e-6)
  return None


def _assert_value(got: Any, want: Any, atol: float, what: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  if isinstance(want, dict):
    assert isinstance(got, dict) and set(got) == set(want), (what, got, want)
    for k in want:
      _assert_value(got[k], want[k], atol, what)
  elif isinstance(want, tuple):
    assert isinstance(got, tuple) and len(got) == len(want), (what, got, want)
    for g, w in zip(got, want):
      _assert_value(g, w, atol, what)
  else:
    (leaf,) = jax.tree.leaves(got)
    leaf, want = np.asarray(leaf), np.asarray(want)
    assert want.ndim == 0 or leaf.shape == want.shape, (what, leaf, want)
    np.testing.assert_allclose(leaf, np.broadcast_to(want, leaf.shape), rtol=1e-5, atol=atol,
                               err_msg=what)


def run_python_block(key: str, namespace: dict[str, Any] | None = None) -> tuple[list, list]:
  """Executes a block statement by statement; returns the (checked, prose) comments of its
  expression statements, having checked each quoted value against the expression."""
  b = block(key)
  tree = ast.parse(b.text)
  comments = _comments(b.text)
  ns = {'__name__': 'doc_block'} if namespace is None else namespace
  checked, prose = [], []
  for stmt in tree.body:
    where = f'{b.doc}:{b.line + stmt.lineno}'
    if isinstance(stmt, ast.Expr):
      expression = compile(ast.Expression(stmt.value), where, 'eval')
      got = eval(expression, ns)  # pylint: disable=eval-used
      lines = list(range(stmt.lineno, stmt.end_lineno + 1))
      while (lines[-1] + 1 in comments
             and b.text.splitlines()[lines[-1]].lstrip().startswith('#')):
        lines.append(lines[-1] + 1)   # comment lines right below the expression
      found = [comments[n] for n in lines if n in comments]
      assert len(found) <= 1, (where, found)
      if not found:
        continue
      comment = found[0]
      quoted = _quoted(comment)
      if quoted is None:
        prose.append(comment)
        continue
      _assert_value(got, quoted[0], quoted[1], f'{where}: # {comment}: got {got!r}')
      checked.append(comment)
    else:
      exec(compile(ast.Module([stmt], []), where, 'exec'), ns)  # pylint: disable=exec-used
  return checked, prose


def test_python_blocks_print_what_their_comments_say():
  # The comments on expressions that describe rather than quote a value: listed, so that a
  # quoted value that fails to parse is not taken for prose.
  prose = {'README.md: import jax.numpy as jnp': [],
           'docs/library.md: import jax.numpy as jnp': [
               "SCARLET's Enhanced ERA", 'Eq. 3 weights a_n, sum 1']}
  for key in prose:
    _entry(key, PYTHON_BLOCKS)
    checked, found = run_python_block(key)
    assert found == prose[key], key
    assert checked, key
  # The README's lines are the first lines of docs/library.md's block.
  readme = block('README.md: import jax.numpy as jnp').text.splitlines()
  library = block('docs/library.md: import jax.numpy as jnp').text.splitlines()
  assert all(line in library for line in readme if line)


def test_readme_data_snippet_registers_a_source():
  key = 'README.md: from fedjax_kd.data import sources'
  _entry(key, PYTHON_BLOCKS)
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
  from fedjax_kd.data import sources  # pylint: disable=g-import-not-at-top
  digits = sources.load_source('digits')
  ns = {'x_train': digits.x_train, 'y_train': digits.y_train, 'x_test': digits.x_test,
        'y_test': digits.y_test, 'config': presets.digits()}
  try:
    run_python_block(key, ns)
    spec = config_lib.validate(ns['config'])
    assert spec.data.source == 'mine'
    mine = sources.load_source('mine')
    np.testing.assert_array_equal(mine.x_train, digits.x_train)
    np.testing.assert_array_equal(mine.y_test, digits.y_test)
  finally:
    sources.unregister_source('mine')


def test_design_md_signatures_and_state_parts():
  key = ("docs/design.md: SGD(loss, epochs, batch_size, slot='train', augment=None, "
         'fresh=False, transforms=())')
  _entry(key, PYTHON_BLOCKS)
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  calls = [n.value for n in ast.parse(block(key).text).body]
  assert [c.func.id for c in calls] == ['SGD', 'Batches']
  for call in calls:
    cls = getattr(program, call.func.id)
    fields = [(f.name, f.default) for f in dataclasses.fields(cls)]
    doc = [(a.id, dataclasses.MISSING) for a in call.args] + [
        (k.arg, ast.literal_eval(k.value)) for k in call.keywords]
    assert doc == fields, (call.func.id, doc, fields)
  # The state's four parts, as the block lists them, and a Round's fields, as the comment of
  # the round's line names them.
  parts = [ln.split()[0] for ln in block('docs/design.md: AlgState').text.splitlines()[1:]]
  assert parts == [f.name for f in dataclasses.fields(base.AlgState)]
  line = block('docs/design.md: state, out = algorithm.round(state, r) # r: Round(t, fed, '
                'active, epochs_k, carried)').text
  named = re.search(r'# r: Round\(([^)]*)\)', line).group(1).split(', ')
  assert named == [f.name for f in dataclasses.fields(base.Round)]


def test_quoted_error_lines(tmp_path, monkeypatch):
  # docs/workdir.md: a second run on a locked workdir, its holder as the quoted one.
  from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.errors import DataError  # pylint: disable=g-import-not-at-top
  (quoted,) = [k for k in OUTPUTS if k.startswith('docs/workdir.md: error: --workdir:')]
  monkeypatch.chdir(tmp_path)
  with workdir_lib.DirLock('runs/x'):
    fd = os.open(os.path.join('runs/x', workdir_lib.LOCK), os.O_RDWR)
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps({'pid': 4242, 'host': 'node7',
                                'since': '2026-11-24 21:03:11'}).encode() + b'\n', 0)
    finally:
      os.close(fd)
    with pytest.raises(DataError) as e:
      workdir_lib.DirLock('runs/x')
  assert f'error: {e.value}' == quoted.split(': ', 1)[1]
  # docs/multihost.md: the line a lost process leaves, in the form the multi-process fault test
  # holds a killed process's line to.
  from tests import test_faults_multiprocess  # pylint: disable=g-import-not-at-top
  (quoted,) = [k for k in OUTPUTS if k.startswith('docs/multihost.md: error: process')]
  assert re.fullmatch(r'error: process 1 of 2 stopped responding at round (\d+); '
                      + test_faults_multiprocess.RERUN, quoted.split(': ', 1)[1])
  # docs/cluster.md: the Ray executor's storage check, the node's and folder's names as
  # quoted (tests/test_executors.py holds a real node's line to the same form).
  from fedjax_kd.sweep import executor_options  # pylint: disable=g-import-not-at-top
  (quoted,) = [k for k in OUTPUTS if k.startswith('docs/cluster.md: error: --executor=ray: node')]
  line = executor_options.storage_error(
      'ray', 'node 5c1f9a0e27d4 (10.0.0.7)',
      f'/shared/runs/sweep/runs/{executor_options.PROBE_PREFIX}9e0c...',
      'cannot read it (No such file or directory)')
  assert f'error: {line}' == quoted.split(': ', 1)[1]
  # docs/cluster.md: a --ray_address where nothing listens.
  from fedjax_kd.sweep import ray_executor  # pylint: disable=g-import-not-at-top
  (quoted,) = [k for k in OUTPUTS if k.startswith('docs/cluster.md: error: --executor=ray: no ')]
  line = ray_executor.no_cluster('10.0.0.7:6379', 'nothing listens there')
  assert f'error: {line}' == quoted.split(': ', 1)[1]
  # docs/cluster.md: what local_clusters.py prints for a Ray cluster, its two lines.
  sys.path.insert(0, str(REPO / 'benchmarks' / 'performance'))
  import local_clusters  # pylint: disable=g-import-not-at-top
  holder = types.SimpleNamespace(pid=4242)
  cluster = local_clusters.RayCluster('127.0.0.1:40123', '/tmp/ray_here',
                                      local_clusters.Loopback(holder, '/tmp/hosts'), [])
  assert local_clusters.announce(cluster) == block(
      'docs/cluster.md: Ray at 127.0.0.1:40123, in a network namespace with only lo; run the '
      'sweep there:').text


def test_the_cluster_docs_template_is_one_the_slurm_executor_takes(tmp_path):
  """docs/cluster.md's sbatch template: its lines, then the run's command where it says."""
  from fedjax_kd.sweep import executor_options, slurm_executor  # pylint: disable=g-import-not-at-top
  text = block('docs/cluster.md: #!/bin/bash').text
  path = tmp_path / 'mine.sbatch'
  path.write_text(text + '\n')
  script = slurm_executor.script(
      executor_options.ExecutorOptions(executor='slurm', slurm_template=str(path)), '/x/list',
      ['sbatch'], None)
  head = text.split('{command}')[0]
  assert script.startswith(head) and '\nRUNDIR="$(sed -n' in script
  assert script.rstrip().endswith('--_worker=- <<< "$RUNDIR"')


# ------------------------------------------------------------------------------ quick commands
def test_memory_plan_prints_the_saved_tables(work):
  key = 'python benchmarks/performance/memory_plan.py --from_json=benchmarks/results/memory_plan_h100.json'
  _entry(key)
  doc = _doc_text('docs/performance.md').splitlines()
  for command in (key, key.replace('h100', 'cpu')):
    r = _run(_argv(command), work, timeout=60)
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith('|')]
    assert len(rows) == 5 and rows[0].startswith('| size |'), r.stdout
    assert all(row in doc for row in rows), (command, rows)


def test_memory_plan_prints_the_saved_config_table(work):
  key = 'python benchmarks/performance/memory_plan.py --from_json=benchmarks/results/memory_plan_configs.json'
  _entry(key)
  doc = _doc_text('docs/performance.md').splitlines()
  r = _run(_argv(key), work, timeout=60)
  rows = [ln for ln in r.stdout.splitlines() if ln.startswith('|')]
  assert len(rows) > 20 and rows[0].startswith('| config | clients at once |'), r.stdout
  assert all(row in doc for row in rows), rows


def test_scarlet_official_refuses_a_missing_checkout(work):
  for key, extra in ((SCARLET_OFFICIAL_CNN, ()), (SCARLET_OFFICIAL_BY_HAND, ())):
    _entry(key)
    command = _sub(key, ('--checkout=/work/scarlet_ref', f'--checkout={work}/no_checkout'))
    command = re.sub(r' \[--set [^\]]*\]', '', command).replace('[', '').replace(']', '')
    r = _run(_argv(command) + list(extra), work, timeout=60, ok=False)
    assert r.returncode == 2, (command, r.stdout, r.stderr)
    assert r.stderr.startswith('error: --checkout: ') and r.stderr.count('\n') == 1, r.stderr
    assert not (work / 'runs').exists() or not list((work / 'runs').rglob('summary.json'))


def test_the_matching_scarlet_runs_parse_and_validate():
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd import main as main_lib  # pylint: disable=g-import-not-at-top
  for algorithm in ('scarlet', 'dsfl'):
    key = SCARLET_MAIN.format(algorithm)
    _entry(key)
    _needs_mnist()
    argv = _argv(_sub(key, ('--config.seed=k', '--config.seed=0'),
                      ('--config.rounds=R', '--config.rounds=1'),
                      ('configs/', f'{REPO}/configs/')))
    spec = config_lib.validate(main_lib.parse(['main'] + argv[3:]).config)
    assert (spec.algorithm, spec.rounds, spec.seed) == (algorithm, 1, 0)
    assert set(spec.clients.models) == {spec.server.model} == {'resnet20@1'}


# ------------------------------------------------------------------------------ long commands
def _table(out: str) -> list[str]:
  """The closing table of a run: the lines between its two rules."""
  lines = out.splitlines()
  rules = [i for i, ln in enumerate(lines) if ln and set(ln) == {'-'}]
  assert len(rules) >= 2, out[-3000:]
  return lines[rules[-2]:rules[-1] + 1]


def _loose(text: str) -> str:
  """A regex of ``text`` where any number (with its byte unit) stands for a number and any run
  of spaces for one."""
  number = r'\d+(?:\.\d+)?(?: [kMG]?B\b)?'
  parts = re.split(rf'({number}| +)', text)
  return ''.join(r'[\d.]+(?: [kMG]?B)?' if re.fullmatch(number, p) else ' +'
                 if p and not p.strip() else re.escape(p) for p in parts)


def _shape(line: str, exact: tuple[str, ...] = (), subs: tuple[tuple[str, str], ...] = ()) -> str:
  """A regex of a quoted line: its numbers any numbers, but for the ``exact`` parts;
  ``subs``: (quoted text, regex) replacements."""
  pieces = sorted([(line.index(t), t, re.escape(t)) for t in exact]
                  + [(line.index(t), t, r) for t, r in subs])
  out, i = '', 0
  for at, text, regex in pieces:
    out += _loose(line[i:at]) + regex
    i = at + len(text)
  return out + _loose(line[i:])


@pytest.mark.slow
def test_the_default_run_prints_the_readme_table(work):
  from fedjax_kd.running.results import fmt_bytes  # pylint: disable=g-import-not-at-top
  _entry(DEFAULT_RUN)
  r = _run(_argv(DEFAULT_RUN) + ['--config.rounds=1'], work)
  out = r.stdout + r.stderr
  summary = json.loads((work / 'runs/default/summary.json').read_text())
  up, setup = summary['cum_up_bytes'], summary['setup_bytes']
  down = summary['cum_down_bytes'] - setup          # a round's downlink
  # The README's table: the same rows in the same order, a rule as long as the longest row.
  readme = block('README.md: -------------------------------------------------').text.splitlines()
  mine = _table(out)
  key = lambda ln: ln[:12].strip()
  assert [key(ln) for ln in mine[1:-1]] == [key(ln) for ln in readme[1:-1]], mine
  for table in (readme, mine):
    assert table[0] == table[-1] == '-' * max(len(ln) for ln in table[1:-1])
  rows = {key(ln): ln[13:] for ln in mine[1:-1]}
  want = {key(ln): ln[13:] for ln in readme[1:-1]}
  assert rows['algorithm'] == want['algorithm'] == 'dsfl'
  assert rows['workdir'] == want['workdir'] == 'runs/default'
  assert rows['rounds'] == '1 (1 in this call)'
  for name, what in (('final acc', 'server model, round 1'), ('best acc', 'round 1'),
                     ('client acc', 'mean over clients, round 1')):
    assert re.fullmatch(rf'\d\.\d{{4}} \({what}\)', rows[name]), rows[name]
  # Bytes are exact on every CPU: one round's here, and the README's 30 rounds are 30 of them.
  assert rows['bytes up'] == fmt_bytes(up)
  assert rows['bytes down'] == fmt_bytes(setup + down)
  assert rows['bytes total'] == f'{fmt_bytes(setup + up + down)} (setup {fmt_bytes(setup)})'
  assert want['bytes up'] == fmt_bytes(30 * up)
  assert want['bytes down'] == fmt_bytes(setup + 30 * down)
  assert want['bytes total'] == f'{fmt_bytes(setup + 30 * (up + down))} (setup {fmt_bytes(setup)})'
  # The round line as the README shows it (a round sends the same bytes), and round 1's lines
  # as docs/performance.md shows them (the program count and bytes exactly).
  err = r.stderr.splitlines()
  example = re.search(r'`(round +30/30 [^`]*)`', _doc_text('README.md')).group(1)
  sent = f'sent  {fmt_bytes(up + down):>9}'
  assert sent in example
  assert any(re.fullmatch(_shape(example, exact=(sent,)), ln) for ln in err), err
  cache = os.environ['FEDJAX_KD_COMPILATION_CACHE']
  doc = block('docs/performance.md: round 1: compiling (persistent cache '
              '~/.cache/fedjax_kd/jax_cache) ...').text.splitlines()
  home = '~/.cache/fedjax_kd/jax_cache'
  assert doc[0].replace(home, cache) in err, (doc[0], err)
  compiled = _shape(doc[1], exact=(' 72 programs',),
                    subs=(('all from', r'(all|none|\d+) from'), (home, re.escape(cache))))
  assert any(re.fullmatch(compiled, ln) for ln in err), (doc[1], err)
  cum = f'cum  {fmt_bytes(setup + up + down):>9}'
  assert cum in doc[2]
  assert any(re.fullmatch(_shape(doc[2], exact=(sent, cum)), ln) for ln in err), (doc[2], err)
  # The console script is the same program: it resumes this run for one more round.
  key = 'fedjax-kd --config=default --workdir=runs/default'
  _entry(key)
  r = _run(_argv(key) + ['--config.rounds=2'], work)
  rows2 = {ln[:12].strip(): ln[13:] for ln in _table(r.stdout + r.stderr)}
  assert rows2['rounds'] == '2 (1 in this call)' and rows2['bytes up'] == fmt_bytes(2 * up)
  # docs/configs.md's form: the config by its path is the same config, so it resumes too.
  _entry(CONFIGS_SYNOPSIS)
  command = _sub(CONFIGS_SYNOPSIS, ('<name>', 'default'), ('DIR', 'runs/default'),
                 ('[--config.<field>=value ...]', '--config.rounds=3'))
  r = _run(_argv(command), work)
  assert '3 (1 in this call)' in r.stdout + r.stderr
  # The plots of that run, as README.md and docs/workdir.md give the command.
  figures = re.findall(r'^\* `(\w+\.png)`', _doc_text('docs/workdir.md'), flags=re.M)
  assert len(figures) == 4, figures
  _entry(PLOT_README)
  command = _sub(PLOT_README, ('DIR [DIR ...]', 'runs/default'), ('[--out FOLDER]', '--out plots'),
                 ('[--labels a,b]', '--labels default'),
                 ('[--exclude_setup_bytes]', '--exclude_setup_bytes'))
  _run(_argv(command), work)
  assert sorted(p.name for p in (work / 'plots').iterdir()) == sorted(figures)
  _entry(PLOT_WORKDIR)
  command = _sub(PLOT_WORKDIR, (' DIR [DIR ...] [--out FOLDER] [--labels a,b]', ' runs/default'))
  _run(_argv(command), work)
  assert sorted(p.name for p in (work / 'runs/default/plots').iterdir()) == sorted(figures)


def _csv(path: pathlib.Path) -> list[dict[str, str]]:
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_the_readme_sweeps(work):
  _entry(SWEEP_VARIANTS)
  _run(_argv(SWEEP_VARIANTS) + ['--set', 'rounds=1', '--seeds=0'], work)
  out = work / 'runs/sw'
  assert {row['variant'] for row in _csv(out / 'compare.csv')} == {'dsfl', 'fd', 'single',
                                                                   'FedAvg'}
  for name in ('compare.md', 'accuracy_test_acc.png', 'accuracy_client_acc.png'):
    assert (out / name).exists(), name
  for slug in ('dsfl', 'fd', 'single', 'fedavg'):
    assert (out / 'runs' / slug / 'seed0' / 'summary.json').exists(), slug
  fedavg = json.loads((out / 'runs/fedavg/seed0/config.json').read_text())
  assert (fedavg['algorithm'], fedavg['clients']['models']) == ('fedavg', ['cnn@1.0'])
  # The grid: one row per cell; the cache serves part of round 2's draw once it keeps labels.
  _entry(SWEEP_GRID)
  _run(_argv(SWEEP_GRID) + ['--set', 'rounds=2', '--seeds=0'], work)
  rows = _csv(work / 'runs/scarlet_d/compare.csv')
  hits = {int(row['cache.duration']): float(row['hit_ratio_mean']) for row in rows}
  assert sorted(hits) == [0, 5, 10, 20], rows
  assert hits[0] == 0 and all(hits[d] > 0 for d in (5, 10, 20)), hits


@pytest.mark.slow
def test_the_baseline_sweeps_plan_every_run(work):
  want = {'fc2_baselines': 6 * 3, 'ace_baselines': 10 * 3, 'fe_baselines': 11 * 3}
  for command in BASELINE_SWEEPS:
    _entry(command)
    r = _run(_argv(command) + ['--dry_run'], work)
    out = command.split('--out=runs/')[1].split()[0]
    assert f'= {want[out]} runs in runs/{out}' in r.stdout, r.stdout[-2000:]


def _my_median(folder: pathlib.Path) -> None:
  guide = [b.text for b in fenced_blocks('docs/custom_algorithm.md') if b.kind == 'python']
  # The median's block and the config file's, as the guide puts them in one file.
  median = [b for b in guide if 'class MedianDistill' in b]
  config = [b for b in guide if 'def get_config' in b]
  assert len(median) == len(config) == 1, guide
  (folder / 'my_median.py').write_text(median[0] + '\n\n' + config[0] + '\n')


@pytest.mark.slow
def test_the_custom_algorithm_guide_runs_from_the_command_line(tmp_path):
  key = 'python -m fedjax_kd.main --config=my_median.py --workdir=runs/median'
  _entry(key)
  _my_median(tmp_path)
  _run(_argv(key) + ['--config.rounds=1'], tmp_path)
  summary = json.loads((tmp_path / 'runs/median/summary.json').read_text())
  assert (summary['algorithm'], summary['rounds']) == ('median_distill', 1)


@pytest.mark.slow
def test_the_custom_algorithm_guide_sweeps(tmp_path):
  key = 'python -m fedjax_kd.sweep --config=my_median.py --seeds=0,1,2 --out=runs/median_sweep'
  _entry(key)
  _my_median(tmp_path)
  _run(_argv(key) + ['--set', 'rounds=1', '--seeds=0'], tmp_path)
  run = tmp_path / 'runs/median_sweep/runs/median-distill/seed0'
  summary = json.loads((run / 'summary.json').read_text())
  assert (summary['algorithm'], summary['rounds']) == ('median_distill', 1)


@pytest.mark.slow
@pytest.mark.serial
def test_the_multihost_cpu_loop(work, tmp_path):
  _entry(MULTIHOST_LOOP)
  fast = f'XLA_FLAGS="--xla_force_host_platform_device_count=2 {FAST_XLA}"'
  command = _sub(MULTIHOST_LOOP, ('XLA_FLAGS=--xla_force_host_platform_device_count=2', fast),
                 ('python ', f'{shlex.quote(sys.executable)} '),
                 ('127.0.0.1:12345', f'127.0.0.1:{_free_port()}'),
                 ('/tmp/mh', str(tmp_path / 'mh')),
                 (' & done', " --config.rounds=1 --config.clients.models=\"('mlp@0.25',)\" "
                             '--config.server.model=mlp@0.25 & done'))
  r = _run(['bash', '-c', command], work, timeout=300)
  rows = [json.loads(ln) for ln in (tmp_path / 'mh/metrics.jsonl').read_text().splitlines()]
  summary = json.loads((tmp_path / 'mh/summary.json').read_text())
  assert [row['round'] for row in rows] == [1], r.stderr[-3000:]
  assert summary['device'] == {'platform': 'cpu', 'kind': 'cpu', 'count': 4, 'processes': 2}
  assert rows[0]['cum_bytes'] == 234_400    # the default run's round 1: 102.4 kB + 132 kB


@pytest.mark.slow
def test_reproduction_report_rebuilds_the_committed_report(work):
  _entry(REPORT)
  shutil.copy(REPO / 'README.md', work / 'README.md')
  readme = (work / 'README.md').read_text()
  r = _run(_argv(REPORT), work)
  assert 'wrote docs/reproduction.md' in r.stdout, r.stdout
  strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith('Generated on ')]
  assert strip((work / 'docs/reproduction.md').read_text()) == strip(
      _doc_text('docs/reproduction.md')), 'docs/reproduction.md is not what the report writes'
  assert (work / 'README.md').read_text() == readme, (
      "README.md's results block is not what the report writes")
  figures = lambda root: sorted(
      p.name for p in (root / 'benchmarks/results/figures/reproduction').iterdir())
  assert figures(work) == figures(REPO)


@pytest.mark.slow
def test_the_reproduction_runs_plan_and_validate(work):
  for key, planned in ((REPRO_DSFL_MNIST, r'dsfl_mnist: 25 runs, seeds 0,1,2,3,4'),
                       (REPRO_RUN, r'reproduction: \d+ runs planned'),
                       (REPRO_SCARLET, r'scarlet_mnist_official_cnn: 10 runs')):
    _entry(key)
    _needs_mnist()
    r = _run(_argv(key) + ['--dry_run'], work, timeout=120)
    assert re.search(planned, r.stdout), (key, r.stdout[-3000:])
    assert 'every config valid' in r.stdout, r.stdout[-3000:]
  assert not (work / 'runs/repro').exists()   # planned only
  _entry(SCARLET_SWEEP)
  _needs_mnist()
  r = _run(_argv(SCARLET_SWEEP) + ['--dry_run'], work, timeout=120)
  out = r.stdout + r.stderr
  assert re.search(r'2 variant\(s\) x 1 grid cell\(s\) x 3 seed\(s\) = 6 runs', out), out[-3000:]


@pytest.mark.slow
def test_convert_writes_an_npz(work):
  key = 'python -m fedjax_kd.data.convert SOURCE --out=FILE'
  _entry(key)
  from fedjax_kd.data import sources  # pylint: disable=g-import-not-at-top
  _run(_argv(_sub(key, ('SOURCE', 'digits'), ('FILE', 'digits.npz'))), work, timeout=120)
  got, want = sources.load_source(f'npz:{work / "digits.npz"}'), sources.load_source('digits')
  np.testing.assert_array_equal(got.x_train, want.x_train)
  np.testing.assert_array_equal(got.y_test, want.y_test)


@pytest.mark.slow
def test_scale_clients(work, tmp_path):
  data = f'--data_dir={tmp_path}'
  printed = []
  for key in (f'{SCALE} --markdown', f'{SCALE} --algorithm=dsfl --markdown',
              'python benchmarks/performance/scale_clients.py --clients=1000,10000 --store=device'):
    _entry(key)
    r = _run(_argv(key) + ['--clients=100', data], work)
    assert not re.search(r'failed|error', r.stdout), r.stdout
    printed += [ln[2:] for ln in r.stdout.splitlines() if ln.startswith('$ ')]
    if '--markdown' in key:
      header = [ln for ln in r.stdout.splitlines() if ln.startswith('| K |')]
      assert header and header[0] in _doc_text('docs/performance.md'), r.stdout
  # docs/performance.md's /usr/bin/time block is the first command's K=100,000 run.
  _entry(SCALE_TIME)
  doc = shlex.split(SCALE_TIME)
  if doc[0] != printed[0].split()[0]:
    doc = doc[2:]   # no /usr/bin/time here: the script runs the bare command
  got = printed[0].split()
  npz = f'npz:{tmp_path}/mnist_like_3000.npz'   # 100 clients x 10 images + 2,000
  want = [sys.executable if a == 'python' else a for a in doc]
  want = [a.replace(':100000', ':100').replace('npz:/tmp/fedjax_kd_scale/mnist_like_1002000.npz',
                                               npz) for a in want]
  workdir = [i for i, a in enumerate(want) if a.startswith('--workdir=')]
  assert len(got) == len(want) and workdir, (got, want)
  for i in workdir:
    got[i] = want[i]
  assert got == want


@pytest.mark.slow
def test_gpu_suite_rebuilds_the_h100_table(work):
  _entry(GPU_SUITE_LOGS)
  r = _run(_argv(GPU_SUITE_LOGS), work)
  rows = [ln for ln in r.stdout.splitlines() if ln.startswith('|')]
  doc = _doc_text('docs/performance.md').splitlines()
  assert len(rows) == 5 and all(row in doc for row in rows), rows


@pytest.mark.slow
def test_memory_plan_measures_the_small_size(work, tmp_path):
  key = 'python benchmarks/performance/memory_plan.py --out=benchmarks/results/memory_plan_cpu.json'
  _entry(key)
  out = tmp_path / 'memory_plan_cpu.json'
  r = _run(_argv(_sub(key, ('benchmarks/results/memory_plan_cpu.json', str(out)))) + ['--sizes=small'], work)
  rows = [ln for ln in r.stdout.splitlines() if ln.startswith('| small |')]
  (doc,) = [ln for ln in _doc_text('docs/performance.md').splitlines()
            if ln.startswith('| small | 0.4 | 0.9 | 25.5 |')]
  # Data, state, the largest step and the estimate come from shapes: exact; the peak is measured.
  assert len(rows) == 1 and rows[0].split(' | ')[:5] == doc.split(' | ')[:5], (rows, doc)
  assert out.exists()


# ------------------------------------------------------------------------------ docs/design.md
def weighted_ce(logits, batch, row):
  """The loss docs/design.md's example names (as in tests/test_client_table.py)."""
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  return row['w'] * program.ce_loss(logits, batch, row)


@pytest.mark.slow
def test_design_md_weighted_example(monkeypatch):
  from typing import Any as AnyType  # pylint: disable=g-import-not-at-top
  import flax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import experiment
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top
  key = 'docs/design.md: @flax.struct.dataclass'
  _entry(key, PYTHON_BLOCKS)
  module = types.ModuleType('design_md_example')   # dataclasses look their module up
  monkeypatch.setitem(sys.modules, module.__name__, module)
  module.__dict__.update(flax=flax, Any=AnyType, jnp=jnp, base=base, weighted_ce=weighted_ce)
  run_python_block(key, module.__dict__)
  weighted = module.Weighted

  class Forgetful(weighted):
    """The same weights kept in server state (``extra``) instead, as the doc goes on."""
    name = 'forgetful'

    def init(self):
      state = base.Algorithm.init(self)
      return state.replace(extra=jnp.linspace(0.5, 1.5, self.num_clients, dtype=jnp.float32))

    def round(self, state, r):
      state, loss = self.weighted_training(state, r, state.extra)
      return state, base.RoundOutput({'train_loss': loss}, [])

  monkeypatch.setitem(algorithms.ALGORITHMS, 'weighted', weighted)
  monkeypatch.setitem(algorithms.ALGORITHMS, 'forgetful', Forgetful)

  def build(name, store):   # tests/test_client_table.py's setting: its programs are cached
    c = tiny_config('single', rounds=3)
    c.algorithm, c.clients.num_clients, c.clients.participation = name, 8, 0.5
    c.clients.store = store
    return experiment.build(config_lib.validate(c))

  algo = build('weighted', 'device').algorithm
  active = algo.ctx.selector.plan(1).active
  line = ('docs/design.md: state, out = algorithm.round(state, r) # r: Round(t, fed, active, '
          'epochs_k, carried)')
  _entry(line, PYTHON_BLOCKS)
  run = {'algorithm': algo, 'state': base.init_state(algo),
         'r': base.round_input(algo, algo.ctx.fed, 1, active)}
  run_python_block(line, run)
  assert isinstance(run['out'], base.RoundOutput) and 'train_loss' in run['out'].metrics
  np.testing.assert_array_equal(np.asarray(run['state'].table.rounds), np.asarray(active, int))
  # The quoted refusal, word for word, on the first round that holds only some clients.
  exp = build('forgetful', 'host')
  quoted = block("docs/design.md: ValueError: row['w'] has shape (8,), but this round has 4 "
                 'clients (of 8): per-client').text
  with pytest.raises(ValueError) as e:
    base.play_round(exp.algorithm, base.init_state(exp.algorithm), 1,
                    exp.ctx.selector.plan(1).active)
  assert f'ValueError: {e.value}' == ' '.join(quoted.split())


if __name__ == '__main__':
  # python -m tests.test_docs_commands: what is collected and how each is handled.
  found = collect()
  for name, table in (('commands', COMMANDS), ('python', PYTHON_BLOCKS)):
    kinds = {}
    for key in found[name]:
      entry = table.get(key)
      kind = (f'{entry.tier} tier' if isinstance(entry, Run) else type(entry).__name__.lower())
      kinds[kind] = kinds.get(kind, 0) + 1
    print(f'{name}: {len(found[name])} ({", ".join(f"{v} {k}" for k, v in sorted(kinds.items()))})')
  print(f'quoted outputs: {len(found["output"])}')


def test_docs_holds_pages_and_the_artefacts_live_in_benchmarks_results():
  """docs/ is the pages a reader opens; what the benchmarks and the reproduction write (JSON
  numbers, logs, archived runs, figures) lives in benchmarks/results/, which the pages cite."""
  assert sorted(p.name for p in (REPO / 'docs').iterdir() if p.suffix != '.md') == []
  results = REPO / 'benchmarks' / 'results'
  for name in ('reproduction_runs', 'figures', 'gpu_suite', 'memory_plan_cpu.json'):
    assert (results / name).exists(), name
  assert not list(results.glob('*.py')), 'benchmarks/results/ holds artefacts, not code'


def test_the_readme_stays_short():
  """The README is the front page: at most 250 lines; the rest lives in docs/."""
  lines = (REPO / 'README.md').read_text().splitlines()
  assert len(lines) <= 250, f'README.md has {len(lines)} lines: move some into docs/'
