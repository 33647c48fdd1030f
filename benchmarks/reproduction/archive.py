"""``archive``: the small files of finished runs that ``report`` reads and ``run`` needs to
skip them, kept in a directory that can be committed (:func:`archive`).

The archive is compact: one ``<sweep>.tar.gz`` per sweep, holding that sweep's tree
(``<sweep>/sweep.json``, ``<sweep>/skipped.json``, ``<sweep>/runs/.../seed<k>/*``), and
``MANIFEST.sha256`` (``sha256sum`` format, one line per tar) beside them. The tars are
written deterministically (sorted members, times and owners zeroed), so archiving the same
runs again gives the same bytes. ``archive.json`` and ``standing.json`` stay plain files.
:func:`open_runs` gives readers a directory tree for either form: a compact archive is
checked against its manifest and extracted into a temporary directory, a plain folder (a
runs folder such as ``runs/repro``, or an archive made before the compact form) is read as
it is. :func:`compact` converts a plain archive in place; :func:`unpack` turns a copy of
an archive back into a runs folder that ``run`` adds runs to.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from typing import Iterator

from benchmarks.reproduction.defs import SKIPPED
from fedjax_kd import sweep
from fedjax_kd.errors import DataError
from fedjax_kd.running import workdir as workdir_lib

ARCHIVE_DEFAULT = 'benchmarks/results/reproduction_runs'
ARCHIVE_MARKER = 'archive.json'   # written by `archive`: the report then says how to add runs
STANDING = 'standing.json'        # the stale-run ties (benchmarks/reproduction/standing.py)
MANIFEST = 'MANIFEST.sha256'
SUFFIX = '.tar.gz'
PLAIN_FILES = (ARCHIVE_MARKER, STANDING, MANIFEST)   # beside the tars, never packed
ARCHIVED_SWEEP_FILES = (sweep.PLAN_FILE, SKIPPED)
ARCHIVED_RUN_FILES = ('config.json', 'summary.json', workdir_lib.METRICS, 'sweep_run.json',
                      sweep.DIVERGED_FILE)


# ------------------------------------------------------------ the compact form
def is_compact(path: str) -> bool:
  """Whether ``path`` is a compact archive (it has a manifest, or any sweep tar)."""
  return os.path.isdir(path) and (
      os.path.exists(os.path.join(path, MANIFEST))
      or any(n.endswith(SUFFIX) for n in os.listdir(path)))


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      h.update(block)
  return h.hexdigest()


def _fix(path: str) -> str:
  return (f'rebuild {path} with `python -m benchmarks.reproduction archive` or `compact`, '
          'or restore it from git (`git checkout -- ' + path + '`)')


def read_manifest(path: str) -> dict[str, str]:
  """``{tar name: sha256}`` of the archive's manifest."""
  manifest = os.path.join(path, MANIFEST)
  if not os.path.exists(manifest):
    raise DataError(f'{manifest}: missing: the archive has sweep tars but no manifest; '
                    + _fix(path))
  out = {}
  with open(manifest, encoding='utf-8') as f:
    for n, line in enumerate(f, 1):
      digest, sep, name = line.rstrip('\n').partition('  ')
      if not sep or len(digest) != 64 or not name.endswith(SUFFIX) or '/' in name:
        raise DataError(f'{manifest}: line {n} is not "<sha256>  <sweep>{SUFFIX}"; '
                        + _fix(path))
      out[name] = digest
  return out


def verify(path: str) -> list[str]:
  """Checks the archive's files against its manifest; the sweeps it holds.

  Raises:
    DataError: a tar whose bytes differ from its manifest line, a tar the manifest lists
      that is missing, or a file or folder the manifest does not list (beside
      ``archive.json`` and ``standing.json``); the message names it and what to do.
  """
  want = read_manifest(path)
  for name in sorted(os.listdir(path)):
    if name in PLAIN_FILES or (name.startswith(STANDING + '.') and name.endswith('.tmp')):
      continue
    if name not in want:
      raise DataError(f'{os.path.join(path, name)}: not in {MANIFEST}: a compact archive holds '
                      f'only its sweep tars, {MANIFEST}, {ARCHIVE_MARKER} and {STANDING}; '
                      'remove it, or add its runs with `python -m benchmarks.reproduction '
                      'archive` (a plain sweep folder: `compact`)')
  _check_tars(path, want)
  return [n[:-len(SUFFIX)] for n in sorted(want)]


def _check_tars(path: str, want: dict[str, str]) -> None:
  for name, digest in sorted(want.items()):
    tar = os.path.join(path, name)
    if not os.path.exists(tar):
      raise DataError(f'{tar}: listed in {MANIFEST} but missing; ' + _fix(tar))
    if _sha256(tar) != digest:
      raise DataError(f'{tar}: its sha256 differs from {MANIFEST} (the file changed or is '
                      'corrupt); ' + _fix(tar))


def write_manifest(path: str) -> None:
  """Writes ``MANIFEST.sha256`` for every sweep tar in ``path`` (sorted by name)."""
  lines = [f'{_sha256(os.path.join(path, n))}  {n}\n'
           for n in sorted(os.listdir(path)) if n.endswith(SUFFIX)]
  _replace(os.path.join(path, MANIFEST), ''.join(lines).encode())


def _replace(path: str, data: bytes) -> None:
  tmp = f'{path}.{os.getpid()}.part'
  with open(tmp, 'wb') as f:
    f.write(data)
  os.replace(tmp, path)


def _files(root: str) -> list[str]:
  """Every file under ``root`` as a relative posix path, sorted.

  Raises:
    DataError: something under it is a link or not a plain file (it would not be packed).
  """
  out = []
  for d, dirs, files in os.walk(root):
    for n in dirs + files:
      full = os.path.join(d, n)
      if os.path.islink(full) or not (os.path.isdir(full) or os.path.isfile(full)):
        raise DataError(f'{full}: a link or special file; an archive holds plain files only')
    out += [os.path.relpath(os.path.join(d, n), root).replace(os.sep, '/') for n in files]
  return sorted(out)


def pack(src: str, name: str) -> bytes:
  """The deterministic ``.tar.gz`` of the tree ``src`` with its files under ``name/``:
  sorted members, mode 0644, mtime 0, uid/gid 0, no user names, gzip header mtime 0."""
  raw = io.BytesIO()
  with tarfile.open(fileobj=raw, mode='w', format=tarfile.PAX_FORMAT) as tar:
    for rel in _files(src):
      with open(os.path.join(src, rel), 'rb') as f:
        data = f.read()
      info = tarfile.TarInfo(f'{name}/{rel}')
      info.size, info.mode, info.mtime = len(data), 0o644, 0
      info.uid = info.gid = 0
      info.uname = info.gname = ''
      tar.addfile(info, io.BytesIO(data))
  out = io.BytesIO()
  with gzip.GzipFile(filename='', mode='wb', fileobj=out, compresslevel=9, mtime=0) as gz:
    gz.write(raw.getvalue())
  return out.getvalue()


def extract(tar_path: str, dest: str, name: str | None = None) -> None:
  """Extracts a sweep tar into ``dest`` (its files land at ``dest/<name>/...``).

  Raises:
    DataError: a member with an absolute path, a ``..`` part, outside ``name/``, or that
      is a link, a device or anything but a plain file or folder (nothing is extracted then).
  """
  with tarfile.open(tar_path, mode='r:gz') as tar:
    members = tar.getmembers()
    for m in members:
      parts = m.name.split('/')
      bad = (m.name.startswith('/') or '\\' in m.name or '..' in parts or '' in parts[:-1]
             or not (m.isfile() or m.isdir())
             or (name is not None and parts[0] != name))
      if bad:
        raise DataError(f'{tar_path}: member {m.name!r} is refused (an archive holds plain '
                        f'files under {name or "<sweep>"}/ only; no absolute paths, "..", '
                        'links or devices); ' + _fix(tar_path))
    for m in members:
      target = os.path.join(dest, *m.name.split('/'))
      if m.isdir():
        os.makedirs(target, exist_ok=True)
        continue
      os.makedirs(os.path.dirname(target), exist_ok=True)
      src = tar.extractfile(m)
      with open(target, 'wb') as f:
        shutil.copyfileobj(src, f)


def _extract_all(path: str, dest: str) -> list[str]:
  names = verify(path)
  for name in names:
    extract(os.path.join(path, name + SUFFIX), dest, name)
  return names


@contextlib.contextmanager
def open_runs(path: str) -> Iterator[str]:
  """A directory tree of ``path``'s sweeps, as ``run`` writes them, to read.

  A compact archive is checked against its manifest (:func:`verify`) and extracted into a
  temporary directory, removed on exit; a plain folder is given as it is. ``archive.json``
  and ``standing.json`` are read from ``path`` itself, never from the tree.
  """
  if not is_compact(path):
    yield path
    return
  with tempfile.TemporaryDirectory(prefix='repro_archive_') as tmp:
    _extract_all(path, tmp)
    yield tmp


def _sweep_folders(path: str) -> list[str]:
  return [n for n in sorted(os.listdir(path))
          if os.path.isdir(os.path.join(path, n)) and not os.path.islink(os.path.join(path, n))
          and any(os.path.exists(os.path.join(path, n, f)) for f in ARCHIVED_SWEEP_FILES)]


def _write_sweep(path: str, name: str, staged: str) -> None:
  """Packs ``staged/<name>`` as ``path/<name>.tar.gz`` and checks that it extracts to the
  same files, byte for byte."""
  tar = os.path.join(path, name + SUFFIX)
  _replace(tar, pack(os.path.join(staged, name), name))
  with tempfile.TemporaryDirectory() as back:
    extract(tar, back, name)
    src, got = os.path.join(staged, name), os.path.join(back, name)
    files = _files(src)
    if _files(got) != files:
      raise DataError(f'{tar}: extracting it does not give back the files it was made from')
    for rel in files:
      with open(os.path.join(src, rel), 'rb') as a, open(os.path.join(got, rel), 'rb') as b:
        if a.read() != b.read():
          raise DataError(f'{tar}: {rel} extracts to other bytes than it was made from')


def _stage_existing(path: str, name: str, staged: str) -> None:
  tar = os.path.join(path, name + SUFFIX)
  if os.path.exists(tar):
    extract(tar, staged, name)


def compact(path: str) -> list[str]:
  """Converts a plain archive in place: one tar per sweep folder and the manifest.

  Each sweep folder (one with ``sweep.json`` or ``skipped.json``) is packed (merged into
  its tar if one is there already), the tar is checked to extract to every file of the
  folder byte for byte, the manifest is written and checked, and only then are the files
  that were packed removed, and the folders they leave empty. Nothing else is touched.

  Returns:
    the sweeps converted.
  """
  if is_compact(path):   # the tars already there are the manifest's
    _check_tars(path, read_manifest(path))
  names = _sweep_folders(path)
  packed: dict[str, list[str]] = {}
  with tempfile.TemporaryDirectory() as staged:
    for name in names:
      _stage_existing(path, name, staged)
      files = _files(os.path.join(path, name))
      for rel in files:
        dst = os.path.join(staged, name, *rel.split('/'))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(path, name, *rel.split('/')), dst)
      _write_sweep(path, name, staged)
      packed[name] = files
  write_manifest(path)
  # Every folder file is in its tar, byte for byte, before any is removed.
  with tempfile.TemporaryDirectory() as back:
    for name, files in packed.items():
      extract(os.path.join(path, name + SUFFIX), back, name)
      for rel in files:
        with open(os.path.join(path, name, *rel.split('/')), 'rb') as a, open(
            os.path.join(back, name, *rel.split('/')), 'rb') as b:
          if a.read() != b.read():
            raise DataError(f'{path}/{name}/{rel}: its tar holds other bytes; nothing removed')
  for name, files in packed.items():
    for rel in files:
      os.remove(os.path.join(path, name, *rel.split('/')))
    for d, _, _ in sorted(os.walk(os.path.join(path, name)), key=lambda t: -len(t[0])):
      with contextlib.suppress(OSError):
        os.rmdir(d)   # empty ones only
  verify(path)
  return names


def unpack(path: str) -> list[str]:
  """Turns a copy of a compact archive back into a runs folder, in place: checks the
  manifest, extracts every tar beside it, then removes the tars and the manifest."""
  names = verify(path)
  for name in names:
    if os.path.exists(os.path.join(path, name)):
      raise DataError(f'{os.path.join(path, name)}: already there beside {name}{SUFFIX}; '
                      'nothing unpacked')
  for name in names:
    extract(os.path.join(path, name + SUFFIX), path, name)
  for name in names:
    os.remove(os.path.join(path, name + SUFFIX))
  os.remove(os.path.join(path, MANIFEST))
  return names


# ------------------------------------------------------------ archiving runs
def archive(runs: str, out: str) -> tuple[int, int]:
  """Adds what ``report`` reads, and what ``run`` needs to skip a finished run, to ``out``.

  Per sweep its plan (or skip marker); per finished or diverged run its config,
  summary, metrics, run record and divergence record, at the same relative
  paths, merged into the sweep's tar in ``out`` (a run already there is replaced; the
  manifest line is rewritten). A plain archive at ``out`` is compacted first.
  ``report --runs=<out>`` then writes the same tables, and ``run --runs=<copy of out>``
  skips those runs and starts only the rest. Checkpoints, event files and figures stay
  behind (they are large and rebuilt when needed).

  Returns:
    ``(sweeps, runs)`` copied.
  """
  n_sweeps = n_runs = 0
  os.makedirs(out, exist_ok=True)
  if _sweep_folders(out):
    compact(out)
  if is_compact(out):
    verify(out)
  with tempfile.TemporaryDirectory() as staged:
    for name in sorted(os.listdir(runs)):
      src = os.path.join(runs, name)
      if not any(os.path.exists(os.path.join(src, f)) for f in ARCHIVED_SWEEP_FILES):
        continue
      n_sweeps += 1
      _stage_existing(out, name, staged)
      os.makedirs(os.path.join(staged, name), exist_ok=True)
      for f in ARCHIVED_SWEEP_FILES:
        if os.path.exists(os.path.join(src, f)):
          shutil.copyfile(os.path.join(src, f), os.path.join(staged, name, f))
      if os.path.exists(os.path.join(src, sweep.PLAN_FILE)):
        for entry in sweep.load_plan(src).get('runs', []):
          wd = os.path.join(src, entry['workdir'])
          if not (sweep.is_complete(workdir_lib.read_json(wd, 'summary.json'),
                                    entry.get('rounds'))
                  or sweep.read_diverged(wd) is not None):
            continue
          dst = os.path.join(staged, name, entry['workdir'])
          os.makedirs(dst, exist_ok=True)
          for f in ARCHIVED_RUN_FILES:
            if os.path.exists(os.path.join(wd, f)):
              shutil.copyfile(os.path.join(wd, f), os.path.join(dst, f))
          n_runs += 1
      _write_sweep(out, name, staged)
  write_manifest(out)
  return n_sweeps, n_runs
