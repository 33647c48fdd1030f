"""LEAF's federated data sets from their JSON files: FEMNIST (per writer), Shakespeare (per speaker).

Caldas et al., "LEAF: A Benchmark for Federated Settings" (2018). LEAF's scripts
(https://github.com/TalwalkarLab/leaf, ``data/femnist`` and ``data/shakespeare``:
``./preprocess.sh -s niid --sf 0.05 -k 0 -t sample``, for example) write a data set as
JSON files under ``<root>/train`` and ``<root>/test`` (LEAF's ``data/<task>/data``
folder), each file::

  {"users": ["f0000_14", ...], "num_samples": [...],
   "user_data": {"f0000_14": {"x": [...], "y": [...]}, ...}}

``data.source='femnist:<root>'`` or ``'shakespeare:<root>'`` reads every ``*.json`` of
both folders (nothing is downloaded). Each training row keeps its user as a client id,
so ``data.partition='natural'`` makes one client per writer or speaker (users in
sorted order of their names); the test rows of all users form the test set.

* **FEMNIST**: ``x`` is 784 floats (a 28x28 image, LEAF's values in [0, 1]), ``y`` one
  of 62 classes (10 digits, 26 upper- and 26 lower-case letters). Images whose values
  are all multiples of 1/255 are kept as uint8 pixels (a quarter of the memory; the
  model sees the same values).
* **Shakespeare**: ``x`` is an 80-character line, ``y`` the next character. Characters
  become ids in LEAF's 80-letter alphabet (:data:`LETTERS`, LEAF's ``ALL_LETTERS``), any
  other character the out-of-vocabulary id 80; inputs are int32 ``[80]`` token ids and
  the task has 81 classes (``char_lstm``).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np

# LEAF's Shakespeare alphabet (models/shakespeare/.. ALL_LETTERS in LEAF's language utils).
LETTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}")
SHAKESPEARE_VOCAB = len(LETTERS) + 1     # + the out-of-vocabulary id
SHAKESPEARE_OOV = len(LETTERS)
FEMNIST_CLASSES = 62
_INDEX = {c: i for i, c in enumerate(LETTERS)}

TASKS = ('femnist', 'shakespeare')


class LeafError(ValueError):
  """A LEAF folder or file that cannot be read (the message names it)."""


def char_ids(text: str) -> list[int]:
  """LEAF letter ids of ``text``; characters outside :data:`LETTERS` are the OOV id 80."""
  return [_INDEX.get(c, SHAKESPEARE_OOV) for c in text]


def _files(root: str, split: str) -> list[str]:
  folder = os.path.join(root, split)
  if not os.path.isdir(folder):
    raise LeafError(f'{folder} is missing: a LEAF data folder has train/ and test/ '
                    "subfolders of *.json files (LEAF's data/<task>/data)")
  files = sorted(glob.glob(os.path.join(folder, '*.json')))
  if not files:
    raise LeafError(f'{folder} has no *.json files')
  return files


def _users(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding='utf-8') as f:
      blob = json.load(f)
    data = blob['user_data']
    if not isinstance(data, dict):
      raise TypeError('user_data is not an object')
    return data
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise LeafError(f'{path}: not a LEAF JSON file ({type(e).__name__}: {e})') from None


def _femnist_rows(user: str, rec: dict[str, Any], path: str) -> tuple[np.ndarray, np.ndarray]:
  x = np.asarray(rec['x'], np.float32)
  y = np.asarray(rec['y'])
  if x.ndim != 2 or x.shape[1] != 784:
    raise LeafError(f'{path}: user {user!r}: x must be lists of 784 pixel values, got '
                    f'shape {x.shape}')
  return x.reshape(-1, 28, 28, 1), y


def _shakespeare_rows(user: str, rec: dict[str, Any],
                      path: str) -> tuple[np.ndarray, np.ndarray]:
  xs, ys = rec['x'], rec['y']
  if not all(isinstance(t, str) for t in xs) or not all(
      isinstance(t, str) and len(t) == 1 for t in ys):
    raise LeafError(f'{path}: user {user!r}: x must be strings and y single characters')
  lengths = {len(t) for t in xs}
  if len(lengths) > 1:
    raise LeafError(f'{path}: user {user!r}: lines of different lengths {sorted(lengths)}')
  x = np.asarray([char_ids(t) for t in xs], np.int32).reshape(len(xs), -1)
  y = np.asarray([char_ids(t)[0] for t in ys], np.int64)
  return x, y


def read_split(root: str, split: str, task: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """Every row of ``<root>/<split>/*.json``, grouped by user in sorted user order.

  Returns:
    ``(x, y, user_of_row)``.

  Raises:
    LeafError: a missing folder, no files, a malformed file or rows of the wrong kind.
  """
  rows = _femnist_rows if task == 'femnist' else _shakespeare_rows
  per_user: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
  for path in _files(root, split):
    for user, rec in _users(path).items():
      try:
        x, y = rows(user, rec, path)
      except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, LeafError):
          raise
        raise LeafError(f'{path}: user {user!r}: {type(e).__name__}: {e}') from None
      if len(x) != len(y):
        raise LeafError(f'{path}: user {user!r} has {len(x)} x and {len(y)} y')
      per_user.setdefault(str(user), []).append((x, y))
  users = sorted(per_user)
  xs = [x for u in users for x, _ in per_user[u]]
  ys = [y for u in users for _, y in per_user[u]]
  owner = [u for u in users for x, _ in per_user[u] for _ in range(len(x))]
  if not owner:
    raise LeafError(f'{os.path.join(root, split)}: no samples')
  shapes = {x.shape[1:] for x in xs}
  if len(shapes) > 1:
    raise LeafError(f'{os.path.join(root, split)}: samples of different shapes {sorted(shapes)}')
  return np.concatenate(xs), np.concatenate(ys), owner


def data_folder(root: str) -> str:
  """The folder holding ``train/`` and ``test/``: ``root``, or ``root/data`` (LEAF's
  ``data/<task>`` folder given)."""
  root = os.path.expanduser(root)
  if os.path.isdir(os.path.join(root, 'data', 'train')):
    return os.path.join(root, 'data')
  return root


def count_users(root: str) -> int:
  """The number of distinct users in ``<root>/train/*.json`` (the natural clients).

  Raises:
    LeafError: a missing folder, no files or a malformed file.
  """
  root = data_folder(root)
  return len({str(u) for path in _files(root, 'train') for u in _users(path)})


def as_pixels(x: np.ndarray) -> np.ndarray:
  """uint8 pixels when every value is a multiple of 1/255 in [0, 1], else ``x`` itself."""
  scaled = x * np.float32(255.0)
  pixels = np.rint(scaled)
  if x.size and (x.min() < 0 or x.max() > 1 or np.abs(scaled - pixels).max() > 1e-3):
    return x
  return pixels.astype(np.uint8)


def load(task: str, root: str) -> dict[str, Any]:
  """A LEAF task's arrays: Keras-layout keys, ``client_id`` per training row, and metadata.

  Args:
    task: ``'femnist'`` or ``'shakespeare'``.
    root: the folder holding ``train/`` and ``test/``.

  Returns:
    ``x_train, y_train, x_test, y_test, client_id`` (the index of the row's user among the
    training users in sorted order), ``users`` (those names), ``num_classes`` and
    ``vocab_size`` (Shakespeare; None for FEMNIST).
  """
  if task not in TASKS:
    raise LeafError(f'unknown LEAF task {task!r}: one of {TASKS}')
  root = data_folder(root)
  x_train, y_train, owner = read_split(root, 'train', task)
  x_test, y_test, _ = read_split(root, 'test', task)
  users = sorted(set(owner))
  index = {u: i for i, u in enumerate(users)}
  client_id = np.asarray([index[u] for u in owner], np.int64)
  if task == 'femnist':
    pixels = as_pixels(x_train), as_pixels(x_test)
    if all(p.dtype == np.uint8 for p in pixels):   # both or neither: one input kind
      x_train, x_test = pixels
  num_classes = FEMNIST_CLASSES if task == 'femnist' else SHAKESPEARE_VOCAB
  for what, y in (('train', y_train), ('test', y_test)):
    if y.size and (y.min() < 0 or y.max() >= num_classes):
      raise LeafError(f'{root}/{what}: labels must lie in 0..{num_classes - 1} for {task}, '
                      f'found {int(y.min())}..{int(y.max())}')
  return dict(x_train=x_train, y_train=y_train.astype(np.int64), x_test=x_test,
              y_test=y_test.astype(np.int64), client_id=client_id, users=users,
              num_classes=num_classes,
              vocab_size=SHAKESPEARE_VOCAB if task == 'shakespeare' else None)


def write_split(path: str, users: dict[str, tuple[list[Any], list[Any]]]) -> None:
  """Writes one LEAF JSON file: ``{user: (x_list, y_list)}`` (fixtures, conversions)."""
  blob = {'users': list(users), 'num_samples': [len(x) for x, _ in users.values()],
          'user_data': {u: {'x': x, 'y': y} for u, (x, y) in users.items()}}
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(blob, f)
