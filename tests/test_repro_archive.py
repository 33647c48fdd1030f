"""The compact archive: one tar per sweep and a sha256 manifest, checked before any read."""

import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

from benchmarks.reproduction import archive as archive_lib
from fedjax_kd.errors import DataError

REPO = pathlib.Path(__file__).resolve().parents[1]
SWEEP = 'dsfl_digits'


@pytest.fixture(scope='module')
def sweep_tree(tmp_path_factory) -> pathlib.Path:
  """A runs folder holding one sweep of the committed archive, as plain files."""
  root = tmp_path_factory.mktemp('runs')
  with archive_lib.open_runs(str(REPO / archive_lib.ARCHIVE_DEFAULT)) as tree:
    shutil.copytree(pathlib.Path(tree) / SWEEP, root / SWEEP)
  return root


def _files(root: pathlib.Path) -> dict[str, bytes]:
  return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob('*'))
          if p.is_file()}


def _compact(sweep_tree, dest: pathlib.Path) -> pathlib.Path:
  shutil.copytree(sweep_tree, dest)
  (dest / archive_lib.ARCHIVE_MARKER).write_text('{}\n')
  assert archive_lib.compact(str(dest)) == [SWEEP]
  return dest


def test_compact_converts_in_place_and_reads_back_every_byte(sweep_tree, tmp_path):
  arch = _compact(sweep_tree, tmp_path / 'arch')
  assert sorted(os.listdir(arch)) == [archive_lib.MANIFEST, archive_lib.ARCHIVE_MARKER,
                                      SWEEP + '.tar.gz']
  line = (arch / archive_lib.MANIFEST).read_text()
  assert line.endswith(f'  {SWEEP}.tar.gz\n') and len(line.split()[0]) == 64
  with archive_lib.open_runs(str(arch)) as tree:
    assert _files(pathlib.Path(tree)) == _files(sweep_tree)
    kept = tree
  assert not os.path.exists(kept)   # the extracted tree is removed after
  # A plain folder is read as it is.
  with archive_lib.open_runs(str(sweep_tree)) as tree:
    assert tree == str(sweep_tree)


def test_the_bytes_are_deterministic(sweep_tree, tmp_path):
  a = _compact(sweep_tree, tmp_path / 'a')
  b = _compact(sweep_tree, tmp_path / 'b')
  name = SWEEP + '.tar.gz'
  assert (a / name).read_bytes() == (b / name).read_bytes()
  assert (a / archive_lib.MANIFEST).read_bytes() == (b / archive_lib.MANIFEST).read_bytes()
  data = (a / name).read_bytes()
  assert data[4:8] == b'\0\0\0\0'   # the gzip header's mtime
  with tarfile.open(a / name) as tar:
    members = tar.getmembers()
  assert [m.name for m in members] == sorted(m.name for m in members)
  assert all(m.mtime == 0 and m.uid == m.gid == 0 and not m.uname and not m.gname
             and m.isfile() and m.name.startswith(SWEEP + '/') for m in members)


@pytest.mark.parametrize('damage', ['byte', 'missing', 'extra'])
def test_the_manifest_is_checked_before_any_read(sweep_tree, tmp_path, damage):
  arch = _compact(sweep_tree, tmp_path / 'arch')
  tar = arch / (SWEEP + '.tar.gz')
  if damage == 'byte':
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 1
    tar.write_bytes(bytes(data))
    want = 'sha256 differs'
  elif damage == 'missing':
    tar.unlink()
    want = 'missing'
  else:
    (arch / 'notes.txt').write_text('x')
    want = 'not in MANIFEST.sha256'
  with pytest.raises(DataError, match=want) as e:
    with archive_lib.open_runs(str(arch)):
      pass
  named = 'notes.txt' if damage == 'extra' else SWEEP + '.tar.gz'
  assert named in str(e.value) and ('restore' in str(e.value) or 'remove' in str(e.value))
  # The report says so and stops.
  r = subprocess.run([sys.executable, '-m', 'benchmarks.reproduction', 'report', f'--runs={arch}',
                      f'--out={tmp_path / "r.md"}'], cwd=REPO, capture_output=True, text=True,
                     check=False)
  assert r.returncode == 2 and named in r.stderr and not (tmp_path / 'r.md').exists()


@pytest.mark.parametrize('member', ['../evil.json', '/abs.json', f'{SWEEP}/../x.json', 'link'])
def test_a_tar_member_outside_the_sweep_or_a_link_is_refused(tmp_path, member):
  raw = io.BytesIO()
  with tarfile.open(fileobj=raw, mode='w:gz') as tar:
    info = tarfile.TarInfo(f'{SWEEP}/sweep.json')
    info.size = 2
    tar.addfile(info, io.BytesIO(b'{}'))
    if member == 'link':
      info = tarfile.TarInfo(f'{SWEEP}/runs')
      info.type, info.linkname = tarfile.SYMTYPE, '/etc'
      tar.addfile(info)
    else:
      info = tarfile.TarInfo(member)
      info.size = 2
      tar.addfile(info, io.BytesIO(b'{}'))
  arch = tmp_path / 'arch'
  arch.mkdir()
  (arch / f'{SWEEP}.tar.gz').write_bytes(raw.getvalue())
  archive_lib.write_manifest(str(arch))
  with pytest.raises(DataError, match='is refused'):
    with archive_lib.open_runs(str(arch)):
      pass
  assert not (tmp_path / 'evil.json').exists() and not (tmp_path / 'x.json').exists()


def test_archive_merges_runs_into_the_sweeps_tar(sweep_tree, tmp_path):
  # Half the runs archived first, then all of them: the tar holds every run, byte for byte
  # what archiving them all at once gives.
  part = tmp_path / 'part'
  shutil.copytree(sweep_tree, part)
  seeds0 = sorted((part / SWEEP / 'runs').glob('*/seed0'))
  assert seeds0
  for d in seeds0:
    shutil.rmtree(d)
  arch = tmp_path / 'arch'
  n_sweeps, n_runs = archive_lib.archive(str(part), str(arch))
  whole_runs = len(list((sweep_tree / SWEEP).rglob('config.json')))
  assert n_sweeps == 1 and n_runs == whole_runs - len(seeds0)
  with archive_lib.open_runs(str(arch)) as tree:
    assert not list(pathlib.Path(tree).rglob('seed0'))
  assert archive_lib.archive(str(sweep_tree), str(arch)) == (1, whole_runs)
  once = tmp_path / 'once'
  archive_lib.archive(str(sweep_tree), str(once))
  name = SWEEP + '.tar.gz'
  assert (arch / name).read_bytes() == (once / name).read_bytes()
  assert (arch / archive_lib.MANIFEST).read_text() == (once / archive_lib.MANIFEST).read_text()
  with archive_lib.open_runs(str(arch)) as tree:
    assert _files(pathlib.Path(tree)) == _files(sweep_tree)
  # A plain archive given to `archive` is compacted first; an extra file is never removed.
  plain = tmp_path / 'plain'
  shutil.copytree(part, plain)
  (plain / SWEEP / 'notes.txt').write_text('mine')
  archive_lib.archive(str(sweep_tree), str(plain))
  assert sorted(os.listdir(plain)) == [archive_lib.MANIFEST, name]
  with archive_lib.open_runs(str(plain)) as tree:
    assert (pathlib.Path(tree) / SWEEP / 'notes.txt').read_text() == 'mine'


def test_a_copy_given_to_run_is_unpacked_in_place(sweep_tree, tmp_path):
  arch = _compact(sweep_tree, tmp_path / 'arch')
  assert archive_lib.unpack(str(arch)) == [SWEEP]
  assert sorted(os.listdir(arch)) == [archive_lib.ARCHIVE_MARKER, SWEEP]
  assert _files(arch / SWEEP) == _files(sweep_tree / SWEEP)
