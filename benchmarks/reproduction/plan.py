"""Planning a sweep: its base config, --tiny settings and runs (:func:`plan_sweep`, every
config validated before anything trains), the commands that make the same runs by hand
(:func:`sweep_command`, :func:`torch_command`, :func:`official_command`) and what a plan
records of its making (:func:`commit`, :func:`command_line`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
from typing import Any, Sequence

import ml_collections

from benchmarks.reproduction.defs import (REPO, TINY, TINY_PUBLIC, TINY_SEEDS, Section, SweepDef,
                                          scarlet_official, torch_ref)
from fedjax_kd import config as config_lib
from fedjax_kd import sweep
from fedjax_kd.sweep import Variant

def _variants(d: SweepDef, tiny: bool) -> list[Variant]:
  keep = d.tiny_variants if tiny else None
  return [Variant(label, algo, fields) for label, algo, fields in d.variants
          if keep is None or label in keep]


def _grid(d: SweepDef, tiny: bool) -> dict[str, list[Any]]:
  if not tiny:
    return {f: list(v) for f, v in d.grid}
  if d.tiny_grid is not None:
    return {f: list(v) for f, v in d.tiny_grid}
  return {f: list(v)[:2] for f, v in d.grid}


def base_config(d: SweepDef, source: str) -> ml_collections.ConfigDict:
  """The sweep's base config: its config file, or its preset called with ``source``.

  A config file's data source is set by :func:`plan_sweep` as an override
  (so ``sweep.json`` records it and the sweep command can be rebuilt).
  """
  if d.config:
    return config_lib.load_file(os.path.join(REPO, d.config))
  return d.preset(source)


def _tiny_overrides(base: ml_collections.ConfigDict) -> dict[str, Any]:
  out = dict(TINY)
  if base.data.num_public > 0:
    out['data.num_public'] = min(base.data.num_public, TINY_PUBLIC[0])
  out['distill.public_per_round'] = min(base.distill.public_per_round, TINY_PUBLIC[1])
  if base.acepfl.clusters > TINY['clients.num_clients']:
    out['acepfl.clusters'] = TINY['clients.num_clients']
  return out


@dataclasses.dataclass(frozen=True)
class Planned:
  """A sweep ready to run: its definition, directory, runs and plan info."""
  section: Section
  sweep: SweepDef
  out: str
  runs: tuple[sweep.Run, ...]
  overrides: dict[str, Any]
  thresholds: tuple[float, ...]
  tiny: bool = False


def plan_sweep(section: Section, d: SweepDef, runs_dir: str, mnist: str,
               tiny: bool, official: tuple[str, str] = ('', '')) -> Planned | str:
  """Plans one sweep (every config validated); a string says why it is skipped.

  ``official``: ``(python, checkout)`` for the SCARLET authors' code (``--scarlet_python``,
  ``--scarlet_checkout``); its sweep is skipped without them.

  Raises:
    ConfigError: a run's config is bad.
  """
  if d.data == 'mnist':
    if tiny:
      return 'not part of --tiny (MNIST sweeps are skipped)'
    if not mnist:
      return ('no MNIST file was given; run with --mnist=PATH to a Keras mnist.npz (or set '
              '$FEDJAX_KD_MNIST)')
    if not os.path.exists(mnist):
      return (f'the MNIST file {mnist} was not found; run with --mnist=PATH to a Keras '
              'mnist.npz')
    source = f'npz:{os.path.abspath(mnist)}'
  else:
    source = 'digits'
  if d.engine == 'scarlet_official' and not all(official):
    return ("the SCARLET authors' code needs --scarlet_checkout (a clone of "
            'kitsuyaazuma/SCARLET, branch main) and --scarlet_python (a Python with torch, '
            'torchvision, tyro, tqdm and fedjax_kd; docs/scarlet_official.md has the steps)')
  if d.engine == 'torch' and importlib.util.find_spec('torch') is None:
    return ('PyTorch is not installed (`pip install -e .[bench]`; a benchmark extra, never a '
            'dependency)')
  base = base_config(d, source)
  overrides = {'data.source': source} if d.config else {}
  overrides.update(d.overrides)
  if tiny:
    overrides.update(_tiny_overrides(base))
  out = os.path.join(runs_dir, d.name)
  if d.engine == 'scarlet_official':
    ref = scarlet_official()
    model = str(d.variants[0][2].get('server.model', ref.MODEL)).partition('@')[0]
    runs = ref.plan(d.config, out, TINY_SEEDS if tiny else d.seeds,
                    [algo for _, algo, _ in d.variants], int(dict(d.overrides)['rounds']),
                    [(k, v) for k, v in overrides.items() if k != 'rounds'], model)
  elif d.engine == 'torch':
    runs = torch_ref().common.plan(base, _variants(d, tiny), TINY_SEEDS if tiny else d.seeds,
                                    out, overrides, _grid(d, tiny))
  else:
    runs = sweep.plan(base, _variants(d, tiny), TINY_SEEDS if tiny else d.seeds,
                      _grid(d, tiny), out, overrides)
  thresholds = tuple(float(x) for x in runs[0].config.comm.thresholds)
  return Planned(section, d, out, tuple(runs), overrides, thresholds, tiny)


def flag_literal(v: Any) -> str:
  """A value as ``--set``/``--variant`` text that :func:`fedjax_kd.sweep.parse_value` reads back.

  Strings stay bare where they read back as themselves, else they get double
  quotes (so shell single quotes need no escapes); tuples and lists become
  tuple literals.
  """
  if isinstance(v, str):
    bare = sweep.parse_value(v) == v and not any(ch in v for ch in ',;()[]{}\'"')
    return v if bare else json.dumps(v)
  if isinstance(v, (list, tuple)):
    items = [flag_literal(x) if not isinstance(x, str) else json.dumps(x) for x in v]
    return '(' + ','.join(items) + (',)' if len(items) == 1 else ')')
  return repr(v)


def sweep_command(plan_doc: dict[str, Any], out: str) -> str | None:
  """The ``python -m fedjax_kd.sweep`` command of a sweep's ``sweep.json``.

  Only for sweeps whose base is a config file; None for preset-based ones.
  """
  config = str(plan_doc.get('config') or '')
  if '.py' not in config:
    return None

  parts = ['python -m fedjax_kd.sweep', f'--config={config}']
  for v in plan_doc.get('variants', []):
    spec = f'{v["label"]}={v["algorithm"]}' + ''.join(
        f';{k}={flag_literal(val)}' for k, val in v.get('overrides', {}).items())
    parts.append(f'--variant {shlex.quote(spec)}')
  for f, val in (plan_doc.get('overrides') or {}).items():
    if f == 'data.source' and isinstance(val, str) and val.startswith('npz:'):
      val = 'npz:/path/to/' + os.path.basename(val[4:])   # the machine's path means nothing here
    parts.append('--set ' + shlex.quote(f'{f}={flag_literal(val)}'))
  for f, vals in (plan_doc.get('grid') or {}).items():
    if len(vals) > 1:
      parts.append('--set ' + shlex.quote(f + '=' + ','.join(flag_literal(v) for v in vals)))
  parts.append('--seeds=' + ','.join(str(x) for x in plan_doc.get('seeds', [])))
  if plan_doc.get('metrics'):
    parts.append('--metrics=' + ','.join(plan_doc['metrics']))
  parts.append(f'--out={out}')
  return ' '.join(parts)


def torch_command(plan_doc: dict[str, Any], out: str, module: str) -> str:
  """The ``python -m benchmarks.references.pytorch`` command of a PyTorch reference sweep's
  ``sweep.json`` (its variants by their keys in the module's ``VARIANTS``)."""
  ref = torch_ref().load(module)
  keys = {label: key for key, (label, _, _) in ref.VARIANTS.items()}
  parts = ['python -m benchmarks.references.pytorch', f'--algorithm={module}']
  config = str(plan_doc.get('config') or '')
  if '.py' in config:
    parts.append(f'--config={config}')
  parts += ['--mnist=/path/to/mnist.npz',
            '--seeds=' + ','.join(str(x) for x in plan_doc.get('seeds', [])),
            '--variants=' + ','.join(keys.get(v['label'], v['label'])
                                     for v in plan_doc.get('variants', []))]
  fixed = dict(ref.FIXED)
  for f, val in (plan_doc.get('overrides') or {}).items():
    if f != 'data.source' and fixed.get(f, object()) != val:
      parts.append('--set ' + shlex.quote(f'{f}={flag_literal(val)}'))
  for f, vals in (plan_doc.get('grid') or {}).items():
    parts.append('--set ' + shlex.quote(f + '=' + ','.join(flag_literal(v) for v in vals)))
  parts.append(f'--out={out}')
  return ' '.join(parts)


def official_command(plan_doc: dict[str, Any], out: str, python: str = 'python') -> str:
  """The ``benchmarks/references/scarlet_official.py`` command of the authors'-code sweep's plan."""
  algos = [v.get('algorithm', '') for v in plan_doc.get('variants', [])]
  rounds = {r.get('rounds') for r in plan_doc.get('runs', [])}
  models = {str(v.get('overrides', {}).get('server.model', 'resnet20')).partition('@')[0]
            for v in plan_doc.get('variants', [])}
  return ' '.join([f'{python} benchmarks/references/scarlet_official.py', '--checkout=/path/to/SCARLET',
                   '--mnist=/path/to/mnist.npz',
                   '--seeds=' + ','.join(str(x) for x in plan_doc.get('seeds', [])),
                   '--algorithms=' + ','.join(algos)]
                  + ([f'--model={m}' for m in models if m != 'resnet20'])
                  + ([f'--rounds={rounds.pop()}'] if len(rounds) == 1 else [])
                  + ['--threads=1', f'--out={out}'])


def _git(*args: str) -> str:
  try:
    return subprocess.run(['git', *args], cwd=REPO, capture_output=True, text=True,
                          timeout=10, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return ''


def commit() -> str:
  """``git rev-parse --short HEAD`` (``+dirty`` with uncommitted changes), or ``unknown``."""
  head = _git('rev-parse', '--short', 'HEAD')
  if not head:
    return 'unknown'
  return head + ('+dirty' if _git('status', '--porcelain', '--untracked-files=no') else '')


def command_line(argv: Sequence[str]) -> str:
  """The command as a reader reruns it: without the flags that only say how the runs were
  scheduled (``--jobs``, ``--torch_threads``, ``--plan_only``, and ``--variants``, which runs a
  part of a sweep whose plan still lists every run)."""
  valued, bare = ('--jobs', '--torch_threads', '--variants'), ('--plan_only',)
  shown, it = [], iter(argv)
  for a in it:
    if a in valued:             # ``--flag VALUE``: its value goes with it
      next(it, None)
    elif not a.startswith(tuple(f + '=' for f in valued) + bare):
      shown.append(a)
  return placeholder_paths(
      'python -m benchmarks.reproduction ' + ' '.join(shlex.quote(a) for a in shown))


# The script's entry points as they were typed when runs were made, and as they are typed
# today (the same program and flags): a recorded command is shown in today's spelling.
RENAMED = (('python benchmarks/reproduction.py ', 'python -m benchmarks.reproduction '),)


def placeholder_paths(command: str) -> str:
  """``command`` as a reader types it today: the MNIST file's path (a machine's own) shown as
  a placeholder, an entry point renamed since (:data:`RENAMED`) in its new spelling."""
  for old, new in RENAMED:
    command = new + command[len(old):] if command.startswith(old) else command
  return re.sub(r'--mnist=\S+', '--mnist=/path/to/mnist.npz', command)
