"""Public (open) / private / test splits for federated distillation.

* One data set (DS-FL, Itahara et al., IEEE TMC 2021, §4.1): the
  training split is randomly permuted (the paper does not say how open and private
  samples are drawn); the first ``num_public`` samples form
  the unlabelled open set, the next ``num_private`` the private set that is
  later partitioned over clients. Test data is the official test split.
* Two data sets (SCARLET, Azuma et al. 2025, Table II, following COMET): the public
  set is ``num_public`` rows sampled without replacement from ANOTHER data
  set's training split (the code's ``random.sample(range(len(public_train)),
  10000)``), and the private set is the private data set's training split.

Public labels are kept for diagnostics (e.g. measuring the accuracy of
distilled soft labels). Only ACE-pFL trains on them: its public set is labelled
by design (He et al., IEEE/ACM ToN 2025, Eq. 4 "with the public dataset labels").

:func:`client_validation_split` carves a per-client validation set out of each
client's private shard (ACE-pFL picks each client's best past model on it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedjax_kd.data.sources import ArrayDataset
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError

__all__ = ['FDSplit', 'fd_split', 'client_validation_split']


@dataclasses.dataclass(frozen=True)
class FDSplit:
  """The data of one federated-distillation experiment.

  Attributes:
    x_private: private inputs ``[I_p, ...]`` (to be partitioned over clients).
    y_private: private labels ``[I_p]``.
    x_public: public / open inputs ``[I_o, ...]``, same trailing shape.
    y_public: public labels, for diagnostics only (never used for training);
      they index the public data set's own classes when it is another data set.
    x_test: server test inputs (the private data set's test split).
    y_test: test labels.
    num_classes: number of classes of the private task.
    client_ids_private: the client id of each private row, when the data set has
      them (``data.partition='natural'``), else None.
  """
  x_private: np.ndarray
  y_private: np.ndarray
  x_public: np.ndarray
  y_public: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  client_ids_private: np.ndarray | None = None

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.x_private.shape[1:])


def _is_int(v: Any) -> bool:
  return (isinstance(v, (int, np.integer)) and
          not isinstance(v, (bool, np.bool_)))


def fd_split(dataset: ArrayDataset,
             *,
             num_public: int,
             num_private: int | None,
             seed: int,
             public: ArrayDataset | None = None) -> FDSplit:
  """Splits data into disjoint public, private and test parts.

  Args:
    dataset: the private task's data set (its test split is the test set).
    num_public: size of the public set (>= 0).
    num_private: size of the private set (>= 1); None takes every training
      sample not used as public (one data set) or the whole training split
      (``public`` given).
    seed: seed of the permutation / public sample (``np.random.default_rng``).
    public: optional other data set whose training split supplies the public
      set (SCARLET); its inputs must have the same per-sample shape.

  Returns:
    The `FDSplit`. With one data set, public and private are disjoint slices of
    one permutation (public first). With ``public`` given, the private set
    keeps the training order when ``num_private`` is None and is otherwise a
    random subset.

  Raises:
    ParamError: impossible sizes (``num_public`` / ``num_private``) or a bad seed.
    DataError: public and private inputs have different shapes.
  """
  if not _is_int(seed) or seed < 0:
    raise ParamError('seed', seed, 'an integer >= 0')
  n = len(dataset.y_train)
  if not _is_int(num_public) or num_public < 0:
    raise ParamError('num_public', num_public, 'an integer >= 0')
  if num_private is not None and (not _is_int(num_private) or num_private < 1):
    raise ParamError('num_private', num_private,
                      'None (all remaining samples) or an integer >= 1')
  rng = np.random.default_rng(seed)

  if public is None:
    if num_public >= n:
      raise ParamError(
          'num_public', num_public,
          f'at most {n - 1} (the training set has {n} samples and the private '
          f'set must not be empty)')
    available = n - num_public
    if num_private is None:
      num_private = available
    elif num_private > available:
      raise ParamError(
          'num_private', num_private,
          f'at most {available} (the training set has {n} samples, '
          f'{num_public} of them public)')
    perm = rng.permutation(n)
    pub_idx = perm[:num_public]
    priv_idx = perm[num_public:num_public + num_private]
    x_pub = dataset.x_train[pub_idx]
    y_pub = dataset.y_train[pub_idx]
  else:
    m = len(public.y_train)
    if dataset.x_train.shape[1:] != public.x_train.shape[1:]:
      raise DataError(
          f'public data set {public.name!r} has inputs of shape '
          f'{tuple(public.x_train.shape[1:])} but private data set '
          f'{dataset.name!r} has {tuple(dataset.x_train.shape[1:])}; resize '
          f'the public set to the private resolution first.')
    if num_public > m:
      raise ParamError(
          'num_public', num_public,
          f'at most {m} (the public training set {public.name!r} has {m} '
          f'samples)')
    if num_private is not None and num_private > n:
      raise ParamError('num_private', num_private,
                        f'at most {n} (the training set has {n} samples)')
    pub_idx = rng.choice(m, size=num_public, replace=False)
    if num_private is None:
      priv_idx = np.arange(n)
    else:
      priv_idx = rng.permutation(n)[:num_private]
    x_pub = public.x_train[pub_idx]
    y_pub = public.y_train[pub_idx]

  return FDSplit(
      x_private=dataset.x_train[priv_idx],
      y_private=dataset.y_train[priv_idx],
      x_public=x_pub,
      y_public=y_pub,
      x_test=dataset.x_test,
      y_test=dataset.y_test,
      num_classes=dataset.num_classes,
      client_ids_private=(None if dataset.client_ids is None
                          else dataset.client_ids[priv_idx]))


def client_validation_split(client_indices, fraction: float,
                            seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Splits every client's private rows into training and validation rows.

  Each client keeps ``round(fraction * n)`` of its ``n`` rows for validation
  (at least 1 when ``fraction > 0`` and ``n >= 2``; never all of them), chosen
  uniformly at random with ``np.random.default_rng([seed, 7, k])`` for client
  ``k``, so a client's split does not depend on the other clients.

  Args:
    client_indices: per-client arrays of row indices (a partition).
    fraction: validation fraction in ``[0, 1)``.
    seed: experiment seed.

  Returns:
    ``(train_indices, val_indices)``, two lists of sorted int64 arrays.
  """
  if not 0.0 <= fraction < 1.0:
    raise ParamError('fraction', fraction, 'a number in [0, 1)')
  train, val = [], []
  for k, rows in enumerate(client_indices):
    rows = np.asarray(rows, np.int64)
    n = len(rows)
    m = int(round(fraction * n))
    if fraction > 0 and n >= 2:
      m = min(max(m, 1), n - 1)
    else:
      m = min(m, max(n - 1, 0))
    pick = np.random.default_rng([seed, 7, k]).permutation(n)
    val.append(np.sort(rows[pick[:m]]))
    train.append(np.sort(rows[pick[m:]]))
  return train, val


NO_CLASS = -1   # the label of an open-set row that belongs to no class of the task


def noisy_labels(y_private: np.ndarray, client_indices, classes: int, num_classes: int,
                 seed: int) -> np.ndarray:
  """DS-FL's noisy-label attack (Itahara et al., IEEE TMC 2021, Sec. 4, Fig. 7).

  Each client independently draws ``classes`` source classes S and ``classes`` other false
  classes F (2C distinct classes, ``np.random.default_rng([seed, 11, k])`` for client ``k``)
  and relabels every one of its rows of class S_c as F_c, so with C of 10 classes about
  C/10 of the private rows carry a wrong label. The rows stay where the partition put them.

  Args:
    y_private: the private pool's true labels.
    client_indices: per-client row indices into it (a partition; disjoint).
    classes: C, at least 1 and at most ``num_classes // 2``.
    num_classes: the task's classes.
    seed: the experiment's seed.

  Returns:
    A new label array; rows of no client keep their labels.
  """
  if not 1 <= classes <= num_classes // 2:
    raise ParamError('classes', classes,
                     f'an integer in [1, {num_classes // 2}] (C source and C other false classes '
                     f'of the {num_classes})')
  y = np.array(y_private, copy=True)
  for k, rows in enumerate(client_indices):
    rows = np.asarray(rows, np.int64)
    drawn = np.random.default_rng([seed, 11, k]).permutation(num_classes)[:2 * classes]
    to = np.arange(num_classes)
    to[drawn[:classes]] = drawn[classes:]
    y[rows] = to[y_private[rows]]
  return y


def add_public_noise(split: FDSplit, noise: ArrayDataset, num: int, seed: int) -> FDSplit:
  """DS-FL's noisy-open-data attack (Sec. 4, Fig. 8): ``num`` training rows of another data
  set (Fashion-MNIST in the paper) join the open set, which is then shuffled.

  The added rows are drawn without replacement with ``np.random.default_rng([seed, 13])``;
  their label is :data:`NO_CLASS` (the open set's labels are diagnostics; no task class is
  theirs).

  Raises:
    ParamError: ``num_noise`` above the noise source's rows.
    DataError: inputs of another shape than the private task's.
  """
  m = len(noise.x_train)
  if num > m:
    raise ParamError('num_noise', num, f'at most {m} (the noise source {noise.name!r} has '
                     f'{m} training rows)')
  if noise.x_train.shape[1:] != split.x_private.shape[1:]:
    raise DataError(f'the open-set noise source {noise.name!r} has inputs of shape '
                    f'{tuple(noise.x_train.shape[1:])} but the private data set has '
                    f'{tuple(split.x_private.shape[1:])}')
  rng = np.random.default_rng([seed, 13])
  pick = rng.choice(m, size=num, replace=False)
  x = np.concatenate([split.x_public, noise.x_train[pick].astype(split.x_public.dtype)])
  y = np.concatenate([split.y_public, np.full(num, NO_CLASS, split.y_public.dtype)])
  order = rng.permutation(len(y))
  return dataclasses.replace(split, x_public=x[order], y_public=y[order])
