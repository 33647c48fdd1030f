"""The federated data on the device: the pooled arrays placed once, and each client's rows.

Data lives on device once, in its stored dtype: uint8 pixels for image sources (the engine's
kernels map them to float32 model inputs where they gather a batch,
:class:`fedjax_kd.data.inputs.Normalize`), token ids as int32, float32 otherwise. Clients
hold index tables into one shared private array (``client_idx[k, :client_n[k]]``), never
copies; :func:`build_federated_data` packs them from the partition's per-client rows.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd.data.inputs import Normalize, is_tokens

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FederatedData:
  """All arrays of an FD experiment, placed on device once.

  Attributes:
    x_private, y_private: the pooled private training data (inputs in their
      stored dtype: uint8 pixels or float32, see ``normalize``).
    client_idx: ``[K, n_max]`` int32 rows of ``x_private`` per client (padded).
    client_n: ``[K]`` host int array, real rows per client.
    x_public: ``[N_pub, ...]`` unlabelled open/public data.
    x_test, y_test: the server's test set.
    test_idx, test_n: optional per-client test splits (rows of ``x_test``).
    val_idx, val_n: optional per-client validation splits (rows of
      ``x_private`` held out of ``client_idx``; ``data.val_fraction``).
    num_classes: number of classes.
    normalize: the map from stored inputs (``x_private``, ``x_public``,
      ``x_test``) to model inputs; the kernels apply it to every gathered
      batch, host code through ``normalize.host``.
  """
  x_private: Array
  y_private: Array
  client_idx: Array
  client_n: np.ndarray
  x_public: Array
  x_test: Array
  y_test: Array
  num_classes: int
  test_idx: Array | None = None
  test_n: np.ndarray | None = None
  y_public: np.ndarray | None = None  # diagnostics; only ACE-pFL trains on them
  val_idx: Array | None = None
  val_n: np.ndarray | None = None
  normalize: Normalize = Normalize()

  @property
  def num_clients(self) -> int:
    return int(self.client_n.shape[0])

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.x_private.shape[1:])

  @property
  def model_input_dtype(self) -> str:
    """The dtype a model sees: ``'int32'`` for token ids, else ``'float32'`` (pixels and
    floats after `normalize`)."""
    return 'int32' if is_tokens(self.x_private) else 'float32'

  def client_labels(self) -> np.ndarray:
    """``[K, C]`` host label counts of each client's private data (one vectorised pass)."""
    y = np.asarray(self.y_private)
    idx = np.asarray(self.client_idx)
    k, c = self.num_clients, self.num_classes
    real = np.arange(idx.shape[1])[None, :] < np.asarray(self.client_n)[:, None]
    codes = (np.arange(k)[:, None] * c + y[idx])[real]
    return np.bincount(codes, minlength=k * c).reshape(k, c).astype(np.int64)

  def subset(self, ids: np.ndarray) -> 'FederatedData':
    """The same data seen by clients ``ids`` only (their index tables, in that order).

    The pooled arrays are shared, not copied; only the ``[len(ids), n_max]``
    index tables are gathered.
    """
    ids = np.asarray(ids, np.int32)
    g = jnp.asarray(ids)
    take = lambda a: None if a is None else jnp.take(a, g, axis=0)
    host = lambda a: None if a is None else np.asarray(a)[ids]
    return dataclasses.replace(
        self, client_idx=take(self.client_idx), client_n=host(self.client_n),
        test_idx=take(self.test_idx), test_n=host(self.test_n), val_idx=take(self.val_idx),
        val_n=host(self.val_n))


def pack_indices(index_lists: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """Pads per-client index lists into ``([K, n_max] int32, [K] counts)``."""
  n = np.asarray([len(i) for i in index_lists], np.int32)
  n_max = max(1, int(n.max()) if len(n) else 1)
  table = np.zeros((len(index_lists), n_max), np.int32)
  for k, rows in enumerate(index_lists):
    table[k, :len(rows)] = rows
  return table, n


def _device_inputs(x) -> Array:
  """Inputs on the device in their stored dtype: uint8 pixels stay uint8, token ids int32,
  else float32."""
  x = x if hasattr(x, 'dtype') else np.asarray(x)
  if is_tokens(x):
    return jnp.asarray(x, jnp.int32)
  return jnp.asarray(x, jnp.uint8 if x.dtype == np.uint8 else jnp.float32)


def build_federated_data(x_private, y_private, client_indices, x_public, x_test,
                         y_test, num_classes: int, test_indices=None,
                         y_public=None, val_indices=None,
                         normalize: Normalize | None = None) -> FederatedData:
  """Places host arrays on device and packs the per-client index tables.

  Inputs keep their dtype (uint8 pixels or float32, see
  :func:`fedjax_kd.data.inputs.stored_inputs`); ``normalize`` maps them to
  model inputs (default: pixels / 255).
  """
  table, n = pack_indices(client_indices)
  test_idx = test_n = None
  if test_indices is not None:
    t, test_n = pack_indices(test_indices)
    test_idx = jnp.asarray(t)
  val_idx = val_n = None
  if val_indices is not None:
    v, val_n = pack_indices(val_indices)
    val_idx = jnp.asarray(v)
  return FederatedData(
      x_private=_device_inputs(x_private),
      y_private=jnp.asarray(y_private, jnp.int32),
      client_idx=jnp.asarray(table), client_n=n,
      x_public=_device_inputs(x_public),
      x_test=_device_inputs(x_test), y_test=jnp.asarray(y_test, jnp.int32),
      num_classes=int(num_classes), test_idx=test_idx, test_n=test_n,
      y_public=None if y_public is None else np.asarray(y_public),
      val_idx=val_idx, val_n=val_n, normalize=normalize or Normalize())
