"""The files of a run's ``--workdir``: written crash-safe, read back for plots.

A workdir holds

* ``config.json``     the resolved config;
* ``metrics.jsonl``   one JSON row per round, appended as the run goes (the
  source of truth), and ``metrics.csv`` with the same rows for spreadsheets;
* ``partition.json``  the clients x classes label counts (train, and test
  where clients have their own test split) and each client's model;
* ``selection.json``  the client-selection method, counts and schedule;
* ``clients.json``    every client model's accuracy and loss at the last
  evaluation;
* ``summary.json``    final and best accuracy, communication, timing;
* ``checkpoints/``    orbax checkpoints (:mod:`fedjax_kd.running.checkpoint`);
* ``tensorboard/``    TensorBoard event files with every numeric metric.

Every row is appended with one ``write`` of a whole line to a file opened in
append mode, and whole-file rewrites go through a temporary file and
``os.replace``, so a crash (even SIGKILL) leaves either the old or the new
content; a reader skips a last line that does not end in a newline.

In a multi-host run (:mod:`fedjax_kd.running.distributed`) only process 0 writes: the
writers here are no-ops on the other processes (they still compute every row).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from typing import Any

import numpy as np

from fedjax_kd.errors import DataError, disk_full_as

METRICS = 'metrics.jsonl'
METRICS_CSV = 'metrics.csv'


def is_primary() -> bool:
  """False on the non-zero processes of a multi-host run (they write nothing)."""
  import sys  # pylint: disable=g-import-not-at-top
  jax = sys.modules.get('jax')
  if jax is None or not jax.distributed.is_initialized():
    return True
  return jax.process_index() == 0


def write_json(path: str, obj: Any, indent: int | None = None) -> None:
  """Writes ``obj`` as JSON atomically (temporary file, then ``os.replace``)."""
  write_text(path, json.dumps(obj, indent=indent))


def write_text(path: str, text: str) -> None:
  """Replaces ``path`` with ``text`` atomically (process 0 only)."""
  write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> None:
  """Replaces ``path`` with ``data`` atomically (process 0 only).

  Raises:
    DiskFullError: the device is full; ``path`` is left as it was and no temporary file
      stays behind.
  """
  if not is_primary():
    return
  tmp = f'{path}.tmp'
  with disk_full_as(path):
    try:
      with open(tmp, 'wb') as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    except OSError:
      if os.path.exists(tmp):
        os.remove(tmp)        # ours, half written; the old file stays as it was
      raise
  os.replace(tmp, path)


LOCK = '.fedjax_kd.lock'


class DirLock:
  """An exclusive lock on a directory for as long as a run uses it.

  The lock is an OS lock (``fcntl.flock``) on ``<directory>/.fedjax_kd.lock``, not the file's
  existence: the kernel drops it when the holding process ends, however it ends, so a killed
  run never blocks the next one. The file keeps the holder's pid, host and start time so the
  refusal can name them; it is left in place (removing it would race with the next holder).

  Args:
    directory: the directory to lock (created if missing).
    field: the flag or config field that named it, for the error message.

  Raises:
    DataError: another live process holds the lock (the message names it), or the lock
      file cannot be created.
  """

  def __init__(self, directory: str, field: str = '--workdir'):
    self.directory, self.field, self._fd, self.created = directory, field, None, False
    if not is_primary():   # process 0 holds the lock for a multi-host run
      return
    import fcntl  # pylint: disable=g-import-not-at-top
    import socket  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top
    path = os.path.join(directory, LOCK)
    self.created = not os.path.exists(directory)
    try:
      os.makedirs(directory, exist_ok=True)
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:   # a file, under a file, no permission, a read-only file system
      what = e.strerror or type(e).__name__
      if isinstance(e, (FileExistsError, NotADirectoryError)):
        what = 'it or a folder above it is a file'
      raise DataError(f'{field}: {directory} cannot be used as a run directory ({what}).'
                      ) from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.pread(fd, 4096, 0).decode(errors='replace').strip()
      os.close(fd)
      try:
        h = json.loads(holder)
        who = f'pid {h["pid"]} on {h["host"]}, since {h["since"]}'
      except (ValueError, KeyError, TypeError):
        who = 'another process'
      raise DataError(f'{field}: {directory} is in use by another fedjax_kd run ({who}); '
                      'wait for it to end, or use another directory.') from None
    holder = json.dumps({'pid': os.getpid(), 'host': socket.gethostname(),
                         'since': time.strftime('%Y-%m-%d %H:%M:%S')})
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode() + b'\n', 0)
    self._fd = fd

  def release(self) -> None:
    """Drops the lock (closing the descriptor releases it; the file stays)."""
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def discard(self) -> None:
    """Releases the lock and, if this lock created the directory and nothing else was
    written there, removes it again (a run refused for bad input leaves no folder)."""
    self.release()
    path = os.path.join(self.directory, LOCK)
    if self.created and os.listdir(self.directory) == [LOCK]:
      os.remove(path)
      os.rmdir(self.directory)

  def __enter__(self) -> 'DirLock':
    return self

  def __exit__(self, *exc) -> bool:
    self.release()
    return False


def _append(path: str, text: str) -> None:
  """Appends whole lines with one ``os.write`` per call (O_APPEND; process 0 only)."""
  if not is_primary():
    return
  data = text.encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    size = os.fstat(fd).st_size
    with disk_full_as(path):
      try:
        view = memoryview(data)
        while view:
          n = os.write(fd, view)
          view = view[n:]
      except OSError:
        os.ftruncate(fd, size)   # no half row: the file ends where it did
        raise
  finally:
    os.close(fd)


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """Rows of a JSON-lines file, skipping a torn last line.

  A last line without its newline (a write cut short by a crash) is ignored;
  an unreadable line before it is an error.

  Raises:
    DataError: a complete line is not a JSON object.
  """
  return [row for _, row in _numbered_rows(path)]


def _numbered_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
  """``(line number, row)`` of a JSON-lines file's complete lines (see :func:`read_jsonl`)."""
  with open(path, 'rb') as f:
    data = f.read()
  lines = data.split(b'\n')
  complete, torn = lines[:-1], lines[-1]
  del torn  # empty when the file ends in a newline; a partial row otherwise
  rows = []
  for i, line in enumerate(complete, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError as e:
      raise DataError(f'{path}: line {i} is not valid JSON ({e}).') from None
    if not isinstance(row, dict):
      raise DataError(f'{path}: line {i} is not a JSON object.')
    rows.append((i, row))
  return rows


def read_round_rows(path: str) -> list[dict[str, Any]]:
  """A run's ``metrics.jsonl`` rows, refusing rows a resume cannot continue from.

  Every complete line must be a JSON object with an integer ``round``, and the rounds must
  increase from one line to the next (a file edited by hand, or two runs' rows mixed).

  Raises:
    DataError: naming the line and what to do.
  """
  rows, prev = [], 0
  fix = ('fix or delete that line (rows after the newest checkpoint are recomputed), or rerun '
         'with --noresume to start over')
  for i, row in _numbered_rows(path):
    r = row.get('round')
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
      raise DataError(f'{path}: line {i} has no round number (round={r!r}); {fix}.')
    if r <= prev:
      raise DataError(f'{path}: line {i} is round {r}, after round {prev}: rows must be in '
                      f'round order; {fix}.')
    rows.append(row)
    prev = r
  return rows


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """The per-round rows of a workdir's ``metrics.jsonl`` (a torn last row is skipped)."""
  path = os.path.join(workdir, METRICS)
  if not os.path.exists(path):
    raise DataError(f'{workdir!r} has no {METRICS}: is it a fedjax_kd --workdir?')
  return read_jsonl(path)


def _clean(row: dict[str, Any]) -> dict[str, Any]:
  """JSON-safe scalars: numpy types to Python, non-finite floats to None."""
  out = {}
  for k, v in row.items():
    if isinstance(v, np.generic):
      v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
      v = None
    out[k] = v
  return out


class MetricsWriter:
  """Appends rows to ``metrics.jsonl`` and keeps ``metrics.csv`` in step.

  Args:
    workdir: the run's directory.
    keep_until: on resume, the last round whose rows are kept (later rows
      were computed after the checkpoint and are recomputed); None or 0 starts
      afresh. Resuming refuses a file whose rows are not in round order
      (:func:`read_round_rows`).
  """

  def __init__(self, workdir: str, keep_until: int | None = None):
    self.jsonl = os.path.join(workdir, METRICS)
    self.csv = os.path.join(workdir, METRICS_CSV)
    self.rows: list[dict[str, Any]] = []
    if keep_until and os.path.exists(self.jsonl):   # resuming after round keep_until
      self.rows = [r for r in read_round_rows(self.jsonl) if r['round'] <= keep_until]
    write_text(self.jsonl, ''.join(json.dumps(r) + '\n' for r in self.rows))
    self.columns: list[str] = []
    self._rewrite_csv()

  def _csv_text(self, rows, header: bool) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=self.columns)
    if header:
      w.writeheader()
    w.writerows(rows)
    return buf.getvalue()

  def _rewrite_csv(self):
    for row in self.rows:
      self.columns += [k for k in row if k not in self.columns]
    write_text(self.csv, self._csv_text(self.rows, header=True))

  def write(self, row: dict[str, Any]) -> dict[str, Any]:
    """Appends one round's row (non-finite floats become null); returns it."""
    row = _clean(row)
    self.rows.append(row)
    _append(self.jsonl, json.dumps(row) + '\n')
    if any(k not in self.columns for k in row):
      self._rewrite_csv()
    else:
      _append(self.csv, self._csv_text([row], header=False))
    return row


def _tensorboardx():
  """tensorboardX's ``(EventsWriter, event_pb2, summary_pb2)``, imported without PyTorch.

  tensorboardX imports ``torch`` at import time where it is installed (only to accept
  torch tensors, which scalars written here never are): 2-4 s of a run's start. While
  tensorboardX loads, ``torch`` is marked absent (``sys.modules['torch'] = None``, which
  makes ``import torch`` raise ImportError, the case tensorboardX handles); the mark is
  removed afterwards, so a later ``import torch`` elsewhere works as usual.
  """
  import sys  # pylint: disable=g-import-not-at-top
  hide = 'torch' not in sys.modules and 'tensorboardX' not in sys.modules
  if hide:
    sys.modules['torch'] = None   # type: ignore[assignment]
  try:
    # pylint: disable=g-import-not-at-top
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto import event_pb2, summary_pb2
  finally:
    if hide and sys.modules.get('torch', 0) is None:
      del sys.modules['torch']
  return EventsWriter, event_pb2, summary_pb2


def environment() -> dict[str, Any]:
  """What produced a run, for ``summary.json``: package versions, the devices and, when the
  package runs from a git checkout, its commit (``+dirty`` with uncommitted changes)."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import platform  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  versions = {}
  for name in ('fedjax_kd', 'jax', 'jaxlib', 'flax', 'optax', 'numpy', 'orbax-checkpoint'):
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  versions['python'] = platform.python_version()
  devices = jax.devices()
  device = {'platform': devices[0].platform, 'kind': devices[0].device_kind,
            'count': len(devices), 'processes': jax.process_count()}
  return {'versions': versions, 'device': device, 'git_commit': _git_commit()}


def _git_commit() -> str | None:
  import subprocess  # pylint: disable=g-import-not-at-top
  root = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
  if not os.path.exists(os.path.join(root, '.git')):
    return None   # an installed package, not a checkout

  def git(*args):
    return subprocess.run(['git', '-C', root, *args], capture_output=True, text=True,
                          timeout=10, check=False)
  try:
    head = git('rev-parse', 'HEAD')
    if head.returncode:
      return None
    dirty = git('status', '--porcelain', '--untracked-files=no').stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return head.stdout.strip() + ('+dirty' if dirty else '')


def tensorboard_available() -> bool:
  """Whether tensorboardX (the ``tensorboard`` extra) is installed."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  return importlib.util.find_spec('tensorboardX') is not None


class ScalarWriter:
  """TensorBoard scalars in ``<workdir>/tensorboard`` (tensorboardX's event format).

  Every numeric value of a round's row is logged under its metrics name with
  the round as the step. The event files are rebuilt from ``metrics.jsonl`` whenever a run
  starts: the event files this class wrote earlier (``events.out.tfevents.*``; nothing else
  in the folder is touched) are removed and ``rows``, the rounds kept from before, are
  written again. A run killed before its events were flushed, or resumed from an earlier
  checkpoint, or started over, so holds every round exactly once, as ``metrics.jsonl`` does.

  A round's event is written and flushed in the caller's thread (tensorboardX's own
  ``SummaryWriter`` writes from a background thread, whose failure on a full disk is a
  traceback on stderr and a writer that blocks), so a full disk is a
  :class:`~fedjax_kd.errors.DiskFullError` naming the event file, like any other file of
  the run.

  Args:
    workdir: the run's directory.
    rows: the rows kept from an earlier call (``MetricsWriter.rows``), re-logged first.
  """

  PREFIX = 'events.out.tfevents.'

  def __init__(self, workdir: str, rows: list[dict[str, Any]] = ()):
    self.logdir = os.path.join(workdir, 'tensorboard')
    self._w = None
    if not is_primary():
      return
    events_writer, self._event_pb2, self._summary_pb2 = _tensorboardx()
    if os.path.isdir(self.logdir):
      for name in os.listdir(self.logdir):
        path = os.path.join(self.logdir, name)
        if name.startswith(self.PREFIX) and os.path.isfile(path):
          os.remove(path)
    with disk_full_as(self.logdir):
      os.makedirs(self.logdir, exist_ok=True)
      self._w = events_writer(os.path.join(self.logdir, 'events'))
      self.path = self._w._file_name   # pylint: disable=protected-access
    for row in rows:
      self.write(row, flush=False)
    self.flush()

  def write(self, row: dict[str, Any], flush: bool = True) -> None:
    """Logs ``row``'s numbers at step ``row['round']`` (flushed to disk unless ``flush`` is
    False)."""
    if self._w is None:
      return
    values = [self._summary_pb2.Summary.Value(tag=k, simple_value=float(v))
              for k, v in row.items()
              if k != 'round' and not isinstance(v, bool) and isinstance(v, (int, float))]
    event = self._event_pb2.Event(wall_time=time.time(), step=int(row['round']),
                                  summary=self._summary_pb2.Summary(value=values))
    with disk_full_as(self.path):
      self._w.write_event(event)
      if flush:
        self._w.flush()

  def flush(self) -> None:
    if self._w is not None:
      with disk_full_as(self.path):
        self._w.flush()

  def close(self) -> None:
    if self._w is not None:
      w, self._w = self._w, None
      try:
        w.close()
      except OSError:   # a full disk was reported by the write that met it
        pass


def partition_record(data: Any, client_models, train_counts: np.ndarray) -> dict[str, Any]:
  """``partition.json``: the clients x classes label counts of a federation.

  Args:
    data: a :class:`fedjax_kd.data.federated.FederatedData`.
    client_models: each client's model spec.
    train_counts: ``[K, C]`` label counts of the clients' training rows
      (``data.client_labels()``, which the client selector already holds).

  Returns:
    ``num_clients``, ``num_classes``, ``train_counts`` ``[K][C]`` and, where
    clients have their own test split, ``test_counts``; ``client_models``.
  """
  out = {'num_clients': int(data.num_clients), 'num_classes': int(data.num_classes),
         'train_counts': np.asarray(train_counts).astype(int).tolist(), 'test_counts': None,
         'client_models': list(client_models)}
  if data.test_idx is not None:
    y = np.asarray(data.y_test)
    idx = np.asarray(data.test_idx)
    out['test_counts'] = [
        np.bincount(y[idx[k, :data.test_n[k]]], minlength=data.num_classes).astype(int).tolist()
        for k in range(data.num_clients)]
  return out


def read_json(workdir: str, name: str) -> Any:
  """A JSON file of a workdir, or None if it is not there."""
  path = os.path.join(workdir, name)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise DataError(f'{path} is not valid JSON ({e}).') from None


def read_run(workdir: str) -> dict[str, Any]:
  """Everything the plots need from one workdir.

  Returns:
    ``{'workdir', 'config', 'metrics', 'summary', 'partition', 'clients'}``;
    a file that is not there gives None (``metrics`` is required).
  """
  return {'workdir': workdir, 'metrics': read_metrics(workdir),
          'config': read_json(workdir, 'config.json'),
          'summary': read_json(workdir, 'summary.json'),
          'partition': read_json(workdir, 'partition.json'),
          'clients': read_json(workdir, 'clients.json')}
