"""The experiment loop: rounds, metrics files, progress, checkpoints, resume.

``workdir`` receives
  * ``config.json``   the resolved config;
  * ``metrics.jsonl`` and ``metrics.csv``, one row per round, written as it goes;
  * ``checkpoint.npz`` + ``checkpoint.json`` every ``checkpoint.every`` rounds
    (and after the last round); a rerun with the same workdir resumes from it;
  * ``summary.json``  final and best accuracy, communication, ComU@x, timing.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from fedjax_kd import experiment as experiment_lib
from fedjax_kd.algorithms.base import RoundOutput
from fedjax_kd.config import ExperimentSpec
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.ops import comm


def _fmt_bytes(b: float) -> str:
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('kB', 1e3)):
    if b >= scale:
      return f'{b / scale:.2f} {unit}'
  return f'{int(b)} B'


def _resumable(cfg: dict) -> dict:
  """The part of a config that must match to resume (rounds may be extended)."""
  return {k: v for k, v in cfg.items() if k not in ('rounds', 'checkpoint', 'eval')}


def _config_json(spec: ExperimentSpec) -> str:
  return spec.raw.to_json_best_effort(indent=2, sort_keys=True)


class MetricsWriter:
  """Appends rows to metrics.jsonl and keeps metrics.csv in step."""

  def __init__(self, workdir: str, keep_until: int | None = None):
    self.jsonl = os.path.join(workdir, 'metrics.jsonl')
    self.csv = os.path.join(workdir, 'metrics.csv')
    self.rows: list[dict[str, Any]] = []
    if keep_until is not None and os.path.exists(self.jsonl):
      with open(self.jsonl) as f:
        for line in f:
          row = json.loads(line)
          if row['round'] <= keep_until:
            self.rows.append(row)
    with open(self.jsonl, 'w') as f:
      for row in self.rows:
        f.write(json.dumps(row) + '\n')
    self.columns: list[str] = []
    self._rewrite_csv()

  def _rewrite_csv(self):
    cols = list(self.columns)
    for row in self.rows:
      cols += [k for k in row if k not in cols]
    self.columns = cols
    with open(self.csv, 'w', newline='') as f:
      w = csv.DictWriter(f, fieldnames=cols)
      w.writeheader()
      w.writerows(self.rows)

  def write(self, row: dict[str, Any]):
    self.rows.append(row)
    with open(self.jsonl, 'a') as f:
      f.write(json.dumps(row) + '\n')
    if any(k not in self.columns for k in row):
      self._rewrite_csv()
    else:
      with open(self.csv, 'a', newline='') as f:
        csv.DictWriter(f, fieldnames=self.columns).writerow(row)


def save_checkpoint(workdir: str, state: Any, meta: dict[str, Any]):
  """Writes the state's leaves (no pickle) and the loop's counters atomically."""
  leaves = jax.tree.leaves(jax.device_get(state))
  path = os.path.join(workdir, 'checkpoint.npz')
  with open(path + '.tmp', 'wb') as f:
    np.savez(f, **{f'leaf_{i:05d}': np.asarray(x) for i, x in enumerate(leaves)})
  with open(os.path.join(workdir, 'checkpoint.json.tmp'), 'w') as f:
    json.dump(meta, f)
  os.replace(path + '.tmp', path)
  os.replace(os.path.join(workdir, 'checkpoint.json.tmp'), os.path.join(workdir, 'checkpoint.json'))


def load_checkpoint(workdir: str, like: Any) -> tuple[Any, dict[str, Any]] | None:
  """Restores a state with the structure of ``like``; None if there is none."""
  path = os.path.join(workdir, 'checkpoint.npz')
  meta_path = os.path.join(workdir, 'checkpoint.json')
  if not (os.path.exists(path) and os.path.exists(meta_path)):
    return None
  with open(meta_path) as f:
    meta = json.load(f)
  try:
    with np.load(path, allow_pickle=False) as z:
      loaded = [z[k] for k in sorted(z.files)]
  except Exception as e:  # corrupt file
    raise DataError(f'checkpoint {path} cannot be read ({e}); delete it to start over') from e
  leaves, treedef = jax.tree.flatten(like)
  if len(loaded) != len(leaves) or any(a.shape != b.shape for a, b in zip(loaded, leaves)):
    raise DataError(f'checkpoint {path} does not match this experiment\'s state; '
                    'use a new --workdir or delete the checkpoint')
  restored = [jax.numpy.asarray(a, dtype=b.dtype) for a, b in zip(loaded, leaves)]
  return jax.tree.unflatten(treedef, restored), meta


def run(spec: ExperimentSpec, workdir: str, *, resume: bool = True,
        progress: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
  """Runs an experiment end to end; returns the summary dict."""
  log = log or (lambda s: print(s, file=sys.stderr, flush=True))
  os.makedirs(workdir, exist_ok=True)
  cfg_json = _config_json(spec)
  cfg_path = os.path.join(workdir, 'config.json')
  exp = experiment_lib.build(spec)
  algo = exp.algorithm
  rules = comm.get_rules(spec.comm_rules, algo.paper_rules)
  t_start = time.time()
  state = algo.init()

  start, cum, setup_bytes = 1, {'up': 0, 'down': 0, 'total': 0}, None
  restored = load_checkpoint(workdir, state) if resume else None
  if restored is not None:
    if os.path.exists(cfg_path):
      with open(cfg_path) as f:
        if _resumable(json.loads(f.read())) != _resumable(json.loads(cfg_json)):
          raise ConfigError('--workdir', workdir,
                            'a fresh directory, or the same config as the checkpoint in it')
    state, meta = restored
    start = int(meta['round']) + 1
    cum = meta['cum_bytes']
    setup_bytes = meta['setup_bytes']
    log(f'resumed from {workdir}/checkpoint.npz after round {meta["round"]}')
  with open(cfg_path, 'w') as f:
    f.write(cfg_json)
  selector = exp.ctx.selector
  with open(os.path.join(workdir, 'selection.json'), 'w') as f:
    json.dump(selector.description(), f)
  writer = MetricsWriter(workdir, keep_until=start - 1)
  if setup_bytes is None:
    setup_bytes = comm.count_bytes(algo.setup_payloads() + selector.setup_payloads(), rules)
    cum = dict(setup_bytes)

  n_done = 0
  t_loop = time.time()
  for t in range(start, spec.rounds + 1):
    t0 = time.time()
    plan = selector.plan(t, lambda mask, st=state: algo.selection_losses(st, mask))
    active = plan.active
    if active.any():
      state, out = algo.round(state, t, active)
    else:   # everybody dropped out: the model is unchanged (FedEntOpt A7)
      out = RoundOutput({}, [])
    sent = comm.count_bytes(out.payloads, rules)
    for k in cum:
      cum[k] += sent[k]
    row: dict[str, Any] = {'round': t, 'participants': int(active.sum())}
    row.update(selector.round_metrics(plan))
    row.update(out.metrics)
    if t % spec.eval_every == 0 or t == spec.rounds:
      row.update(algo.evaluate(state))
    row.update({'up_bytes': sent['up'], 'down_bytes': sent['down'],
                'round_bytes': sent['total'], 'cum_bytes': cum['total'],
                'cum_up_bytes': cum['up'], 'cum_down_bytes': cum['down'],
                'round_time_s': time.time() - t0})
    row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
           for k, v in row.items()}
    writer.write(row)
    n_done += 1
    if progress:
      per = (time.time() - t_loop) / n_done
      acc = row.get('test_acc')
      acc_s = f'acc {acc:.4f}' if acc is not None else 'acc   -   '
      log(f'round {t:>4}/{spec.rounds}  {acc_s}  sent {_fmt_bytes(sent["total"]):>10}  '
          f'cum {_fmt_bytes(cum["total"]):>10}  {row["round_time_s"]:.2f}s  '
          f'eta {per * (spec.rounds - t):.0f}s')
    if spec.checkpoint_every and (t % spec.checkpoint_every == 0 or t == spec.rounds):
      save_checkpoint(workdir, state, {'round': t, 'cum_bytes': cum, 'setup_bytes': setup_bytes})

  summary = summarize(writer.rows, spec, setup_bytes, rules.name)
  summary['wall_time_s'] = time.time() - t_start
  summary['rounds_run_this_call'] = n_done
  with open(os.path.join(workdir, 'summary.json'), 'w') as f:
    json.dump(summary, f, indent=2)
  log(f'done: final acc {summary["final_acc"]}, best {summary["top_acc"]} '
      f'(round {summary["top_round"]}), communication {_fmt_bytes(summary["cum_bytes"])}; '
      f'files in {workdir}')
  return summary


def summarize(rows, spec: ExperimentSpec, setup_bytes, rules_name: str) -> dict[str, Any]:
  evaluated = [r for r in rows if r.get('test_acc') is not None]
  accs = [r['test_acc'] for r in evaluated]
  top = int(np.argmax(accs)) if accs else None
  out = {
      'algorithm': spec.algorithm, 'rounds': rows[-1]['round'] if rows else 0,
      'final_acc': accs[-1] if accs else None,
      'top_acc': accs[top] if accs else None,
      'top_round': evaluated[top]['round'] if accs else None,
      # FD and single report the mean client accuracy as test_acc.
      'final_client_acc': (evaluated[-1].get('client_acc', evaluated[-1]['test_acc'])
                           if evaluated else None),
      'cum_bytes': rows[-1]['cum_bytes'] if rows else setup_bytes['total'],
      'setup_bytes': setup_bytes['total'], 'comm_rules': rules_name,
  }
  cum = [r['cum_bytes'] for r in evaluated]
  for x in spec.comm_thresholds:
    out[f'comu@{x:g}'] = comm.comu_at(accs, cum, x)
  out.update(convergence(rows))
  return out


def convergence(rows, patience: int = 20, min_delta: float = 0.001) -> dict[str, Any]:
  """Round, accuracy, bytes and time "to convergence" r* (spec ``acepfl.md`` §7).

  r* is the last round whose accuracy beat the best so far by more than
  ``min_delta`` (0.1 points), provided ``patience`` rounds followed without
  such a gain; otherwise the run has not converged and r* is its last round.
  The criterion is the per-client validation accuracy where a run logs one
  (``val_acc``), else ``test_acc``.
  """
  key = 'val_acc' if any(r.get('val_acc') is not None for r in rows) else 'test_acc'
  seq = [r for r in rows if r.get(key) is not None]
  if not seq:
    return {}
  best, at = -np.inf, 0
  for i, r in enumerate(seq):
    if r[key] > best + min_delta:
      best, at = r[key], i
  if seq[-1]['round'] - seq[at]['round'] < patience:
    at = len(seq) - 1
  r_star = seq[at]['round']
  upto = [r for r in rows if r['round'] <= r_star]
  tested = [r for r in upto if r.get('test_acc') is not None]
  return {'converged_round': r_star, 'converged_by': key,
          'converged_acc': tested[-1]['test_acc'] if tested else None,
          'converged_bytes': upto[-1]['cum_bytes'],
          'converged_time_s': float(sum(r.get('round_time_s') or 0.0 for r in upto))}
