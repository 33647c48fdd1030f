"""What every paper's module fills in: a sweep (:class:`SweepDef`) and a paper's section
(:class:`Section`), the seeds and --tiny settings they share, and the variants of the
independent implementations (``benchmarks/references/pytorch``,
``benchmarks/references/scarlet_official.py``).

Editing: a paper's variants, grids and checks are in its module under
:mod:`benchmarks.reproduction.papers`; the seeds and the tiny settings are the tables below.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any, Callable, Sequence

import ml_collections

from benchmarks.reproduction.checks import Check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIPPED = 'skipped.json'    # in <runs>/<sweep>: why a sweep was not run

SEEDS = (0, 1, 2, 3, 4)   # a verdict needs MIN_CLAIM_SEEDS paired seeds
# Cheap settings run more seeds: enough that half the paper's effect would be detected with
# 80 % power at the measured spread (the report says how many a check would need).
SEEDS10 = tuple(range(10))
SEEDS15 = tuple(range(15))
PAIRED_SEEDS = SEEDS       # fedjax_kd against a reference: the same five seeds
TINY_SEEDS = (0,)         # --tiny checks the pipeline, not the numbers
# The classes of each sweep's task (SweepDef.data), for the report's runs-at-chance line.
CLASSES = {'digits': 10, 'mnist': 10}
# A run "ends at chance" when its last-10 accuracy is below this many times 1/C: collapsed or
# never learning (a label-skewed single client scores its own ~2 classes, about 2/C).
CHANCE_FACTOR = 1.5
MNIST_DEFAULT = os.environ.get('FEDJAX_KD_MNIST', '')
# PyTorch's default initialisation in fedjax_kd: the variant field that pairs a fedjax_kd run
# with a reference that draws its own initial weights (SCARLET, ACE-pFL).
TORCH_INIT = (('model.init', 'torch'),)
# The personalised methods' table headers (FedCache 2.0, ACE-pFL): UA is the mean over clients
# of their personalised test accuracy.
UA_HEADERS = (('acc', 'final UA †'), ('best', 'best UA †'), ('delta', 'Δ final UA vs ACE-pFL'))

# --tiny: applied last to every sweep (MNIST sweeps are not run).
TINY = {
    'rounds': 2, 'clients.num_clients': 4, 'train.epochs': 1, 'distill.epochs': 1,
    'data.source': 'synthetic:400', 'data.num_private': -1, 'data.partition': 'shards',
    'data.shards_per_client': 2, 'clients.models': ('mlp@0.25',),
    'clients.assignment': 'round_robin', 'server.model': 'mlp@0.25',
    'train.batch_size': 16, 'distill.batch_size': 16, 'fedcache2.dd_epochs': 1,
    'fedcache2.dd_batch_size': 16, 'checkpoint.every': 0, 'log.tensorboard': False,
    'eval.every': 1,
}
TINY_PUBLIC = (60, 30)    # data.num_public, distill.public_per_round where a public set is used


@dataclasses.dataclass(frozen=True)
class SweepDef:
  """One sweep of a section.

  Attributes:
    name: its directory under ``--runs`` and its figures' prefix.
    title: the heading of its table.
    variants: ``(label, algorithm, fields)`` rows.
    config: the base, a config file (``path[:arg]``, relative to the
      repository; its ``data.source`` is set as an override), or
    preset: the base, ``source -> ConfigDict`` (built on :mod:`fedjax_kd.config.presets`),
      described in the report by ``preset_text``.
    data: ``'digits'`` or ``'mnist'`` (needs ``--mnist``).
    grid: ``(field, values)`` pairs; the cross product runs for every variant.
    overrides: ``(field, value)`` pairs set on every run (after the variant
      and the grid cell).
    seeds: the seeds (default :data:`SEEDS`).
    metrics: per-round metrics averaged over rounds (extra columns).
    columns: the report table's columns (:data:`COLUMNS` keys, ``'rounds_to'``,
      ``'bytes_to'``, ``'delta'`` or ``'metric:<name>'``).
    headers: ``(column, header)`` pairs replacing default headers, e.g.
      ``(('acc', 'final UA'),)``.
    reference: the variant ``'delta'`` is computed against (per seed).
    tiny_variants: labels kept by ``--tiny`` (None: all).
    tiny_grid: grid values kept by ``--tiny`` (None: the first two of each field).
    curve_rounds: rounds at which a second table gives each variant's headline
      accuracy (mean ± std over seeds): the learning curve in numbers.
    seed_curves: variants whose every evaluated round is listed seed by seed (a
      third table), where the spread between seeds is the finding.
    metric_curves: ``(variant, metrics)``: a table of those per-round metrics
      of that variant (mean ± std over seeds) at every logged round; each metric
      must be among ``metrics``.
    engine: what makes the runs: ``'fedjax_kd'`` (:mod:`fedjax_kd.sweep`),
      ``'scarlet_official'`` (the SCARLET authors' code through
      ``benchmarks/references/scarlet_official.py``, skipped without ``--scarlet_checkout`` and
      ``--scarlet_python``) or ``'torch'``
      (an independent PyTorch implementation of ``benchmarks/references/pytorch``, module
      ``torch_module``, on the same data, partition and draws; skipped when PyTorch is not
      installed).
    torch_module: the ``benchmarks/references/pytorch`` module of a ``'torch'`` sweep; each
      variant label is one of that module's ``VARIANTS`` labels.
    official: for ``engine='scarlet_official'``: the authors' variants are
      ``benchmarks/references/scarlet_official.py``'s (its ``LABELS``).
    pairs: ``(fedjax_kd label, reference label)`` pairs (the first from ``beside``): one
      figure panel each, with both implementations' curves on the same axes.
    beside: ``((sweep, labels), ...)``: variants of earlier sweeps of the section shown
      next to this sweep's in its curve and seed tables, and seen by the checks that read
      this sweep (a paired comparison across sweeps).
    paired_rounds: rounds of a table of per-seed differences from ``pairs[0][0]`` (mean ±
      std over seeds), one row per other variant: how far each is from fedjax_kd.
    thresholds: the accuracies the report reads rounds and bytes to (() = the plan's, from
      the config's ``comm.thresholds``); read from the curves, so they change no run.
    floor: the single-client variant of the setting (a label here, or ``(sweep, label)`` of
      an earlier sweep of the section): the report prints how far below the best
      collaborative method it ends (the regime where a paper's effect can show).
  """
  name: str
  title: str
  variants: tuple[tuple[str, str, dict[str, Any]], ...]
  config: str = ''
  preset: Callable[[str], ml_collections.ConfigDict] | None = None
  preset_text: str = ''
  data: str = 'digits'
  grid: tuple[tuple[str, tuple[Any, ...]], ...] = ()
  overrides: tuple[tuple[str, Any], ...] = ()
  seeds: tuple[int, ...] = SEEDS
  metrics: tuple[str, ...] = ()
  columns: tuple[str, ...] = ('acc', 'best', 'client', 'bytes', 'bytes_to', 'wall')
  headers: tuple[tuple[str, str], ...] = ()
  reference: str = ''
  tiny_variants: tuple[str, ...] | None = None
  tiny_grid: tuple[tuple[str, tuple[Any, ...]], ...] | None = None
  curve_rounds: tuple[int, ...] = ()
  seed_curves: tuple[str, ...] = ()
  metric_curves: tuple[str, tuple[str, ...]] | None = None
  engine: str = 'fedjax_kd'
  beside: tuple[tuple[str, tuple[str, ...]], ...] = ()
  torch_module: str = ''
  pairs: tuple[tuple[str, str], ...] = ()
  paired_rounds: tuple[int, ...] = ()
  thresholds: tuple[float, ...] = ()
  floor: str | tuple[str, str] = ''


@dataclasses.dataclass(frozen=True)
class Section:
  """One paper.

  Attributes:
    key: its ``--only`` name.
    paper: the short name in the headline table.
    title: its heading.
    claim: what the paper claims (quoted numbers are the paper's).
    sweeps: the sweeps run for it.
    checks: the claims tested on their tables.
    notes: a closing paragraph (how to read the tables, caveats).
  """
  key: str
  paper: str
  title: str
  claim: str
  sweeps: tuple[SweepDef, ...]
  checks: tuple[Check, ...]
  notes: str = ''


# ------------------------------------------------------------ the independent implementations
def torch_ref():
  """``benchmarks/references/pytorch`` (its ``__main__`` module, which loads the algorithms)."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  import benchmarks.references.pytorch.__main__ as ref  # pylint: disable=g-import-not-at-top
  return ref


def scarlet_official():
  """``benchmarks/references/scarlet_official.py`` as a module (it is a script; loaded by path)."""
  name = 'fedjax_kd_benchmarks_scarlet_official'
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(REPO, 'benchmarks', 'references', 'scarlet_official.py'))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


def torch_variants(module: str, keys: Sequence[str]) -> tuple[tuple[str, str, dict], ...]:
  """``(label, algorithm, fields)`` of a ``benchmarks/references/pytorch`` module's variants."""
  ref = torch_ref().load(module)
  return tuple(ref.VARIANTS[k] for k in keys)


def torch_label(module: str, key: str) -> str:
  """The label of a ``benchmarks/references/pytorch`` module's variant ``key``."""
  return torch_ref().load(module).VARIANTS[key][0]
