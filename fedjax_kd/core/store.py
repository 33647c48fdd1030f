"""Host- or disk-resident client state for many-client simulations.

With K = 10,000 or 100,000 clients at 1% participation, most clients sit idle
in a round. :class:`ClientStore` keeps every per-client array (the clients'
parameters, BatchNorm statistics and optimizer states, and the per-client
arrays of the algorithm's client table ``AlgState.table``: SCARLET's per-client
cache stamps, ACE-pFL's best past predictions, FedCache 2.0's synthetic sets,
SCAFFOLD's control variates) in host memory, or in ``.npy`` memory maps on disk
(``kind='disk'``). A round then runs on a
:class:`~fedjax_kd.core.federation.RoundView` of its participants:

1. :meth:`ClientStore.gather` copies only the participants' rows to the device
   (a NumPy fancy index, then one transfer per leaf);
2. the algorithm's unchanged ``round`` runs on that compact state;
3. :meth:`ClientStore.scatter` writes the participants' rows back in place.

Nothing of the non-participants is read, copied or transferred, so a round's
cost does not grow with K. Server-side state (the server model, the global
soft-label cache, the knowledge cache) stays on the device as before.

A host state is an ordinary pytree whose per-client leaves are NumPy arrays;
checkpoints save it as they save a device state.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ('device', 'host', 'disk')


def is_host(tree: Any) -> bool:
  """Whether ``tree``'s leaves live in host memory (NumPy arrays)."""
  leaves = jax.tree.leaves(tree)
  return bool(leaves) and all(isinstance(x, np.ndarray) for x in leaves)


class ClientStore:
  """Where per-client arrays live between rounds.

  Args:
    kind: ``'host'`` (NumPy arrays in memory) or ``'disk'`` (``.npy`` memory
      maps in ``directory``; the OS pages in only the rows a round touches).
    directory: folder for ``kind='disk'``.
    chunk: rows moved per transfer when every client is visited (evaluation,
      initialisation); bounds the device memory those passes use.
  """

  def __init__(self, kind: str = 'host', directory: str | None = None, chunk: int = 256):
    if kind not in ('host', 'disk'):
      raise ValueError(f'kind={kind!r}: expected one of host, disk')
    if kind == 'disk' and not directory:
      raise ValueError("kind='disk' needs a directory")
    self.kind = kind
    self.directory = directory
    self.chunk = int(chunk)
    self._count = 0
    if directory:
      os.makedirs(directory, exist_ok=True)

  # ---------------------------------------------------------- allocation
  def empty(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A new ``[K, ...]`` host array (a memory map for ``kind='disk'``)."""
    shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
    if self.kind == 'disk':
      path = os.path.join(self.directory, f'leaf{self._count:05d}.npy')
      self._count += 1
      return np.lib.format.open_memmap(path, mode='w+', dtype=dtype, shape=shape)
    return np.empty(shape, dtype)

  def put(self, tree: Any) -> Any:
    """``tree`` with every leaf copied into a store array (device arrays leave the device)."""
    def one(x):
      x = np.asarray(x)
      out = self.empty(x.shape, x.dtype)
      out[...] = x
      return out
    return jax.tree.map(one, tree)

  def init_rows(self, n: int, make: Callable[[np.ndarray], Any]) -> Any:
    """Builds ``n`` rows chunk by chunk: ``make(ids [chunk])`` returns device rows.

    Every call of ``make`` gets exactly ``chunk`` ids (the last chunk repeats
    its final id), so a jitted ``make`` compiles once.
    """
    out = None
    c = max(1, min(self.chunk, n))
    for lo in range(0, n, c):
      ids = np.arange(lo, lo + c)
      real = min(c, n - lo)
      rows = make(np.minimum(ids, n - 1))
      if out is None:
        out = jax.tree.map(lambda r: self.empty((n,) + tuple(r.shape[1:]), r.dtype), rows)
      jax.tree.map(lambda o, r: o.__setitem__(slice(lo, lo + real), np.asarray(r)[:real]),
                   out, rows)
    return out

  # ------------------------------------------------------- round traffic
  @staticmethod
  def take(tree: Any, rows: np.ndarray) -> Any:
    """Device copies of rows ``rows`` of every host leaf (only those rows move)."""
    rows = np.asarray(rows)
    return jax.tree.map(lambda a: jnp.asarray(a[rows]), tree)

  @staticmethod
  def write(tree: Any, rows: np.ndarray, values: Any, valid: np.ndarray) -> Any:
    """Writes ``values[valid]`` into rows ``rows[valid]`` of every host leaf, in place."""
    valid = np.asarray(valid, bool)
    dest = np.asarray(rows)[valid]
    if not len(dest):
      return tree

    def one(a, v):
      a[dest] = np.asarray(v)[valid]
      return a
    return jax.tree.map(one, tree, values)

  def gather(self, state: Any, view: Any) -> Any:
    """The device state of ``view``'s clients.

    Args:
      state: the host state: ``clients`` (one host pytree per cohort) and
        ``table`` (the client table, leading axis K) are per client; ``server``
        and ``extra`` are server-side and pass through as they are.
      view: the round's :class:`~fedjax_kd.core.federation.RoundView`.
    """
    clients = state.clients
    if clients:   # () for an algorithm without client models (the centralized reference)
      clients = tuple(self.take(clients[c], rows) for c, rows in view.cohort_rows)
    return state.replace(clients=clients, table=self.take(state.table, view.ids))

  def scatter(self, state: Any, view_state: Any, view: Any) -> Any:
    """Writes the view's participants back into the host ``state``.

    Server-side parts (``server``, ``extra``) are taken from ``view_state`` as they are.
    """
    clients = list(state.clients)
    for (c, rows), vc, cohort in zip(view.cohort_rows, view_state.clients, view.fed.cohorts):
      clients[c] = self.write(clients[c], rows, vc, view.active[cohort.client_ids])
    table = self.write(state.table, view.ids, view_state.table, view.active)
    return view_state.replace(clients=tuple(clients), table=table)

  def adopt(self, like: Any, restored: Any) -> Any:
    """A restored checkpoint placed like ``like``.

    For ``kind='disk'`` restored host arrays are copied into ``like``'s memory
    maps (no new files); otherwise ``restored`` is returned as is.
    """
    if self.kind != 'disk':
      return restored

    def one(a, r):
      if isinstance(a, np.memmap):
        a[...] = np.asarray(r)
        return a
      return r
    return jax.tree.map(one, like, restored)
