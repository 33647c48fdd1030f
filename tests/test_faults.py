"""Faults a long run meets, injected for real: damaged checkpoints, hand-edited metrics, a
full disk.

Each test damages what a run left on disk, resumes it, and checks the one line the user sees,
what is on disk afterwards, and that the resumed rounds equal an uninterrupted run's.
"""

import errno
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from fedjax_kd.errors import DataError, DeviceMemoryError, DiskFullError
from fedjax_kd.running import checkpoint as checkpoint_lib
from fedjax_kd.running import experiment as experiment_lib
from fedjax_kd.running import memory as memory_lib
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import workers
from tests.shared import steps_of_activations, tiny_config
from tests.test_main import REPO

# The multi-process rows of docs/workdir.md's table, checked by tests/test_faults_multiprocess.py.
MULTIPROCESS_ROWS = ('process lost in a multi-process run',
                     'coordinator lost in a multi-process run')

ROUNDS = 6


def _config(rounds=ROUNDS):
  c = tiny_config(rounds=rounds)
  c.checkpoint.every = 2     # checkpoints after rounds 2, 4, 6; the newest two are kept
  return c


def _run(workdir, rounds=ROUNDS, **kw):
  return runner.run(config_lib.validate(_config(rounds)), str(workdir), progress=False, **kw)


def _deterministic(rows):
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


def _entries(workdir):
  return sorted(os.listdir(os.path.join(workdir, 'checkpoints')))


def _largest_file(step_dir):
  files = [os.path.join(r, n) for r, _, ns in os.walk(step_dir) for n in ns
           if n != checkpoint_lib.CHECKSUMS]
  return max(files, key=os.path.getsize)


def _truncate_every_step(work):
  """Every checkpoint of ``work`` damaged: its largest file cut to one byte."""
  for step in ('4', '6'):
    with open(_largest_file(os.path.join(work, 'checkpoints', step)), 'r+b') as f:
      f.truncate(1)


def _flip_bit(f, at):
  """Silent corruption: one bit of the byte at ``at`` flipped, the size unchanged."""
  f.seek(at)
  b = f.read(1)
  f.seek(at)
  f.write(bytes([b[0] ^ 1]))


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """An uninterrupted run: its rows, and a copy to damage per test."""
  work = tmp_path_factory.mktemp('reference')
  _run(work)
  return work


def _copy(reference, tmp_path):
  dst = tmp_path / 'run'
  shutil.copytree(reference, dst)
  return dst


@pytest.mark.slow
def test_each_checkpoint_records_the_checksums_of_its_files(reference):
  assert _entries(reference) == ['4', '6']
  step = os.path.join(reference, 'checkpoints', '6')
  with open(os.path.join(step, checkpoint_lib.CHECKSUMS)) as f:
    recorded = json.load(f)
  assert recorded == checkpoint_lib.file_digests(step) and len(recorded) >= 3
  assert checkpoint_lib.verify(step) is None


@pytest.mark.slow
@pytest.mark.parametrize('damage', ['truncated', 'flipped byte'])
def test_a_damaged_newest_checkpoint_is_kept_aside_and_the_one_before_resumes(
    reference, tmp_path, damage):
  work = _copy(reference, tmp_path)
  path = _largest_file(os.path.join(work, 'checkpoints', '6'))
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    if damage == 'truncated':
      f.truncate(size // 2)
    else:                        # silent corruption: same size, one bit differs
      _flip_bit(f, size // 2)
  logs = []
  summary = _run(work, log=logs.append)
  rel = os.path.relpath(path, os.path.join(work, 'checkpoints', '6'))
  want = (f'{rel} has {size // 2} bytes, {size} when saved' if damage == 'truncated'
          else f'{rel} differs from its checksum')
  assert logs[0] == (f'warning: checkpoint {work}/checkpoints/6 is damaged ({want}); kept '
                     f'aside as {work}/checkpoints/6.damaged; trying the one before it')
  assert logs[1] == f'resumed from {work}/checkpoints after round 4'
  # Rounds 5 and 6 ran again and equal the uninterrupted run's, row for row.
  assert summary['rounds_run_this_call'] == 2
  assert _deterministic(workdir_lib.read_metrics(str(work))) == _deterministic(
      workdir_lib.read_metrics(str(reference)))
  # The damaged step is kept (renamed, never deleted); a fresh round 6 replaced it.
  assert _entries(work) == ['4', '6', '6.damaged']
  assert checkpoint_lib.verify(os.path.join(work, 'checkpoints', '6')) is None


@pytest.mark.slow
def test_no_checkpoint_that_restores_is_one_line_that_says_what_to_do(reference, tmp_path):
  work = _copy(reference, tmp_path)
  _truncate_every_step(work)
  rows_before = (work / 'metrics.jsonl').read_text()
  with pytest.raises(DataError) as e:
    _run(work, log=lambda line: None)
  msg = str(e.value)
  assert msg == (f'no checkpoint in {work}/checkpoints restores (kept aside: '
                 f'{work}/checkpoints/6.damaged, {work}/checkpoints/4.damaged); rerun with '
                 '--noresume to start this workdir over, or use a new --workdir')
  assert '\n' not in msg
  assert _entries(work) == ['4.damaged', '6.damaged']
  assert (work / 'metrics.jsonl').read_text() == rows_before     # nothing rewritten
  # As it says: --noresume starts over and keeps the damaged steps.
  summary = _run(work, resume=False)
  assert summary['rounds_run_this_call'] == ROUNDS
  assert _entries(work) == ['4', '4.damaged', '6', '6.damaged']


EDITS = [
    (lambda rows: rows[:2] + ['{"round": 2, "test_acc": 0.5}'] + rows[2:], 3,
     'is round 2, after round 2: rows must be in round order'),
    (lambda rows: rows[:1] + ['{"test_acc": 0.5}'] + rows[1:], 2,
     'has no round number (round=None)'),
    (lambda rows: rows[:3] + ['not json'] + rows[3:], 4, 'is not valid JSON'),
]


@pytest.mark.parametrize('edit,line,what', EDITS)
def test_rows_out_of_order_or_unreadable_are_refused_naming_the_line(tmp_path, edit, line,
                                                                    what):
  path = tmp_path / 'metrics.jsonl'
  rows = [json.dumps({'round': t, 'test_acc': 0.1 * t}) for t in (1, 2, 3, 4)]
  path.write_text('\n'.join(edit(rows)) + '\n')
  with pytest.raises(DataError, match='^' + re.escape(f'{path}: line {line} {what}')):
    workdir_lib.read_round_rows(str(path))
  path.write_text('\n'.join(rows) + '\n{"round": 5')       # a torn last row is not an edit
  assert [r['round'] for r in workdir_lib.read_round_rows(str(path))] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize('edit,line,what', EDITS)
def test_hand_edited_metrics_are_refused_at_resume_naming_the_line(reference, tmp_path, edit,
                                                                  line, what):
  work = _copy(reference, tmp_path)
  path = work / 'metrics.jsonl'
  path.write_text('\n'.join(edit(path.read_text().splitlines())) + '\n')
  with pytest.raises(DataError, match='^' + re.escape(f'{path}: line {line} {what}')):
    _run(work, rounds=ROUNDS + 2)
  # Refused before anything was built or written: the file is as the user left it.
  assert path.read_text().count('\n') == ROUNDS + 1


def _save_tiny(directory, rounds):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  ckpt = checkpoint_lib.Checkpointer(str(directory), keep=len(rounds))
  for t in rounds:
    ckpt.save(t, {'w': jnp.full((64, 64), float(t))}, {'round': t})
  ckpt.close()
  return {'w': jnp.zeros((64, 64))}


def test_checkpointer_verifies_falls_back_and_keeps_the_damaged_step(tmp_path):
  like = _save_tiny(tmp_path, (2, 4))
  step4 = tmp_path / 'checkpoints' / '4'
  assert checkpoint_lib.verify(str(step4)) is None
  recorded = json.loads((step4 / checkpoint_lib.CHECKSUMS).read_text())
  assert recorded == checkpoint_lib.file_digests(str(step4))
  path = _largest_file(str(step4))
  with open(path, 'r+b') as f:   # one bit flipped, same size: only the checksum sees it
    _flip_bit(f, 100)
  rel = os.path.relpath(path, str(step4))
  assert checkpoint_lib.verify(str(step4)) == f'{rel} differs from its checksum'
  warnings = []
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path))
  state, meta = ckpt.restore(like, warn=warnings.append)
  assert meta == {'round': 2} and float(state['w'][0, 0]) == 2.0
  assert warnings == [f'warning: checkpoint {tmp_path}/checkpoints/4 is damaged ({rel} '
                      f'differs from its checksum); kept aside as {tmp_path}/checkpoints/'
                      '4.damaged; trying the one before it']
  assert ckpt.latest_round() == 2 and _entries(tmp_path) == ['2', '4.damaged']
  # --noresume removes the steps it wrote, never a step kept aside.
  ckpt.close()
  assert checkpoint_lib.remove_steps(str(tmp_path)) == ['2']
  assert _entries(tmp_path) == ['4.damaged']


@pytest.mark.slow
def test_the_command_line_shows_one_line_and_exits_2(reference, tmp_path):
  work = _copy(reference, tmp_path)
  _truncate_every_step(work)
  cfg = tmp_path / 'cfg.py'
  cfg.write_text('from tests.test_faults import _config\n\n'
                 'def get_config():\n  return _config()\n')
  r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                      f'--workdir={work}', '--noprogress'], cwd=REPO,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'),
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 2
  lines = [x for x in r.stderr.splitlines() if x.strip()]
  assert [x for x in lines if x.startswith('error: ')] == [
      f'error: no checkpoint in {work}/checkpoints restores (kept aside: '
      f'{work}/checkpoints/6.damaged, {work}/checkpoints/4.damaged); rerun with --noresume '
      'to start this workdir over, or use a new --workdir']
  # The two warnings and the error; no traceback.
  assert len(lines) == 3 and 'Traceback' not in r.stderr, r.stderr


# ------------------------------------------------------------------ a full disk
def _enospc(*_):
  raise OSError(errno.ENOSPC, 'No space left on device')


def test_a_full_disk_mid_row_leaves_no_half_row(tmp_path, monkeypatch):
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"round": 1}\n')
  real_write = os.write
  calls = []

  def write_then_fail(fd, data):   # the row's first 5 bytes reach the disk, then it is full
    if not calls:
      calls.append(1)
      return real_write(fd, bytes(data[:5]))
    _enospc()

  monkeypatch.setattr(os, 'write', write_then_fail)
  with pytest.raises(DiskFullError) as e:
    workdir_lib._append(str(path), '{"round": 2}\n')   # pylint: disable=protected-access
  monkeypatch.undo()
  assert path.read_text() == '{"round": 1}\n'            # as it was, no torn row
  assert str(e.value).startswith(f'no space left to write {path} (')
  assert str(e.value).endswith('free on its device): free some space or move the workdir to '
                               'a larger disk, then rerun the same command to resume from '
                               'the newest checkpoint')
  # An atomic rewrite that cannot finish leaves the old file and no temporary one.
  monkeypatch.setattr(workdir_lib.os, 'fsync', _enospc)
  with pytest.raises(DiskFullError):
    workdir_lib.write_text(str(path), 'new')
  assert path.read_text() == '{"round": 1}\n' and not (tmp_path / 'metrics.jsonl.tmp').exists()


def test_a_full_disk_during_a_checkpoint_leaves_no_partial_step(tmp_path, monkeypatch):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  ckpt = checkpoint_lib.Checkpointer(str(tmp_path), keep=2)
  ckpt.save(2, {'w': jnp.ones(8)}, {'round': 2})

  def full(step, **_):             # what orbax does: a temporary step, then TensorStore fails
    os.makedirs(tmp_path / 'checkpoints' / f'{step}.orbax-checkpoint-tmp' / 'state')
    raise ValueError('RESOURCE_EXHAUSTED: Error writing "w/.zarray" in OCDBT database: Failed '
                     'to write 4096 bytes to file 21: No space left on device '
                     "[os_error_code='28']")

  monkeypatch.setattr(ckpt._mgr, 'save', full)   # pylint: disable=protected-access
  with pytest.raises(DiskFullError, match=f'^no space left to write {tmp_path}/checkpoints/4 '):
    ckpt.save(4, {'w': jnp.ones(8)}, {'round': 4})
  assert _entries(tmp_path) == ['2']                      # round 2 intact, no orphan tmp
  monkeypatch.undo()
  ckpt.close()


def test_a_full_disk_under_tensorboard_is_one_error_naming_the_event_file(tmp_path,
                                                                           monkeypatch):
  """tensorboardX's own writer fails in a background thread (a traceback, then a writer that
  blocks); the run's scalar writer writes in its own thread and raises DiskFullError."""
  pytest.importorskip('tensorboardX')
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  w = workdir_lib.ScalarWriter(str(tmp_path), [{'round': 1, 'test_acc': 0.5}])
  size = os.path.getsize(w.path)
  monkeypatch.setattr(record_writer.RecordWriter, 'write', lambda self, data: _enospc())
  with pytest.raises(DiskFullError, match=f'^no space left to write {re.escape(w.path)} \\('):
    w.write({'round': 2, 'test_acc': 0.6})
  monkeypatch.undo()
  w.close()
  assert os.path.getsize(w.path) == size           # round 1's event, as it was flushed


def _mount_tiny(path, size='600k'):
  os.makedirs(path, exist_ok=True)
  r = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                     capture_output=True, text=True, check=False)
  return r.returncode == 0


@pytest.mark.slow
def test_the_default_run_on_a_full_disk_is_one_line_and_resumes_elsewhere(tmp_path):
  tiny_fs = tmp_path / 'tiny'
  if not _mount_tiny(tiny_fs):
    pytest.skip('mounting a 600 kB tmpfs needs root here; the patched-writer tests cover it')
  try:
    work = tiny_fs / 'w'
    cmd = [sys.executable, '-m', 'fedjax_kd.main', '--config=default', '--noprogress',
           '--config.rounds=3', '--config.checkpoint.every=1']
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu')
    r = subprocess.run(cmd + [f'--workdir={work}'], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        f'error: no space left to write {work}/checkpoints/1 ('), r.stderr[-3000:]
    assert not [n for n in os.listdir(work / 'checkpoints') if 'tmp' in n]
    # Moved to a larger disk, the same command finishes the run.
    moved = tmp_path / 'moved'
    shutil.copytree(work, moved)
    r = subprocess.run(cmd + [f'--workdir={moved}'], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [row['round'] for row in workdir_lib.read_metrics(str(moved))] == [1, 2, 3]
  finally:
    subprocess.run(['umount', str(tiny_fs)], check=False)


# ------------------------------------------------------------------ the documented table
def _table():
  """``{fault: message template}`` of docs/workdir.md's Faults table."""
  with open(os.path.join(REPO, 'docs', 'workdir.md')) as f:
    text = f.read()
  section = text.split('## Faults', 1)[1].split('\n## ', 1)[0]
  rows = [line for line in section.splitlines() if line.startswith('| ') and '`' in line]
  out = {}
  for line in rows:
    fault, seen, _ = [c.strip() for c in line.strip('|').split(' | ')]
    out[fault] = re.search('`([^`]+)`', seen)[1]     # the message, without words around it
  return out


def _matches(template, message):
  pattern = re.escape(template)
  pattern = re.sub(r'<[^<>]+>', '.+', pattern.replace(r'\<', '<').replace(r'\>', '>'))
  return re.fullmatch(pattern, message) is not None


def test_the_faults_table_says_what_the_code_says(tmp_path, monkeypatch):
  table = _table()
  assert set(table) == {'disk full', 'damaged checkpoint', 'no checkpoint restores',
                        'metrics edited by hand', 'run too big for the device',
                        'out of device memory mid-run', 'sweep killed with runs in flight',
                        'sweep run directory still held'} | set(MULTIPROCESS_ROWS)
  assert _matches(table['disk full'], f'error: {DiskFullError(str(tmp_path / "m.jsonl"))}')
  # Two damaged steps: the newest is kept aside and the one before tried, then none is left.
  like = _save_tiny(tmp_path, (2, 4))
  for step in ('2', '4'):
    with open(_largest_file(str(tmp_path / 'checkpoints' / step)), 'r+b') as f:
      _flip_bit(f, 10)
  warnings = []
  with pytest.raises(DataError) as e:
    checkpoint_lib.Checkpointer(str(tmp_path)).restore(like, warn=warnings.append)
  assert _matches(table['damaged checkpoint'], warnings[0]), warnings[0]
  assert _matches(table['no checkpoint restores'], f'error: {e.value}')
  path = tmp_path / 'metrics.jsonl'
  path.write_text('{"round": 1}\n{"round": 3}\n{"round": 2}\n')
  with pytest.raises(DataError) as e:
    workdir_lib.read_round_rows(str(path))
  assert _matches(table['metrics edited by hand'], f'error: {e.value}')
  # Device memory: refused before compiling, and out of memory mid-run. The steps' figures
  # are stood in for (the lines' wording is under test, not XLA's figures).
  steps_of_activations(monkeypatch)
  c = tiny_config(rounds=2)
  c.clients.num_clients, c.train.batch_size = 8, 5     # fewer clients would halve its steps
  exp = experiment_lib.build(config_lib.validate(c))
  plan = memory_lib.plan(exp)
  with pytest.raises(DeviceMemoryError) as e:
    memory_lib.check(exp, limit=plan.total - plan.step // 2)
  assert _matches(table['run too big for the device'], f'error: {e.value}'), str(e.value)
  oom = memory_lib.exhausted_advice(exp, RuntimeError(
      'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1024 bytes.'))
  assert _matches(table['out of device memory mid-run'], f'error: {oom}'), str(oom)
  # A sweep's run directory held by another process (the kill row is checked by
  # tests/test_faults_sweep.py against the rerun's own output).
  held = workers.in_use_message(str(tmp_path / 'runs' / 'dsfl'), 'pid 7 on host, since 10:00',
                                120)
  assert _matches(table['sweep run directory still held'], f'failed: dsfl: {held}')
