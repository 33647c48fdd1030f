"""Communication accounting: payload descriptions -> bytes under a rule set.

An algorithm's round returns the list of :class:`Payload` it sent (what, which
direction, how many elements per copy, how many copies). One function,
:func:`count_bytes`, turns them into bytes under a named :class:`CommRules`, so
there are no per-algorithm byte formulas. Inside a round a payload's counts may
be device scalars (the round does not wait for them); :meth:`Payload.read` is
the one place they become Python ints, once the round's output is read
(``RoundOutput.to_host`` reads every payload of a round in one transfer).

Rule sets:
  * ``dsfl`` -- the DS-FL paper's rules (Itahara et al., IEEE TMC 2021, Tables 1-3):
    every number is a 4-byte float, a server broadcast is a multicast counted
    once, the open-set indices are not counted (shared seed), the one-time
    open-data broadcast is (ComU@I). These reproduce the paper's Tables 1 and 2
    exactly (see ``tests/test_comm.py``).
  * ``scarlet`` -- the SCARLET authors' code (``pipeline.py``): float32 labels,
    int64 indices, signals and CFD hard labels, broadcasts counted once per receiving client, and the one-time
    public-set download excluded.
  * ``fedcache2`` -- FedCache 2.0 (the paper's App. D): distilled samples
    are counted by their encoded size (``kind='raw'``: uint8 pixels, PNG or
    JPEG file sizes, or float32 for non-image inputs), each hard label as one
    byte (the paper and code ignore labels; they are small but not free).
  * ``acepfl`` -- ACE-pFL: float32 values, int32 indices
    (top-K uploads are K values + K indices per sample), every receiver's copy
    counted (the paper reports per-client traffic), the one-time public-set
    download not counted (the paper's GB figures have no such term).
    ``scarlet`` is the same with int64 (8-byte) indices.
  * ``minimal`` -- what a careful implementation would send: float32 labels,
    int32 indices, 2-bit signals, ``ceil(log2 C)``-bit hard labels, multicasts
    counted once.

``paper`` in a config resolves to the rule set of the algorithm's own paper.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

import jax
import numpy as np

from fedjax_kd.ops.errors import ParamError

UP = 'up'
DOWN = 'down'
KINDS = ('float', 'index', 'signal', 'label', 'raw', 'dataset')


@dataclasses.dataclass(frozen=True)
class Payload:
  """One message type sent in a round.

  Attributes:
    name: what is sent, e.g. ``'soft_labels'``, ``'params'``, ``'open_data'``.
    direction: ``'up'`` (clients -> server) or ``'down'`` (server -> clients).
    kind: ``'float'`` (model outputs or weights), ``'index'`` (sample ids),
      ``'signal'`` (cache signals), ``'label'`` (hard class labels, needs
      ``classes``), ``'raw'`` (``bytes_per_element`` given) or ``'dataset'``
      (a one-time data-set download, ``bytes_per_element`` given).
    elements: number of elements in one copy: an int, or a device scalar until
      :meth:`read` (a float one, e.g. a sum of encoded bytes, is rounded then).
    copies: number of senders (up) or receivers (down); an int or a device scalar.
    multicast: for ``down``: every receiver gets the same content, so rule sets
      with ``multicast_once`` count it once.
    bytes_per_element: only for ``kind='raw'`` and ``'dataset'``.
    classes: number of classes, for ``kind='label'``.
    scale: a host factor ``elements`` is multiplied by when read: a device count
      of rows times the elements of a row, multiplied on the host so the product
      cannot overflow the device's int32. 1 once read.
  """
  name: str
  direction: str
  kind: str
  elements: Any
  copies: Any = 1
  multicast: bool = False
  bytes_per_element: float = 0.0
  classes: int = 0
  scale: int = 1

  def __post_init__(self):
    if self.direction not in (UP, DOWN):
      raise ValueError(f'Payload.direction={self.direction!r}: expected up or down')
    if self.kind not in KINDS:
      raise ValueError(f'Payload.kind={self.kind!r}: expected one of {KINDS}')

  @property
  def counts(self) -> tuple[Any, Any]:
    """``(elements, copies)`` as the round left them (device scalars or ints)."""
    return self.elements, self.copies

  @property
  def is_read(self) -> bool:
    """Whether the counts are host numbers already (nothing left on the device)."""
    return (self.scale == 1 and not isinstance(self.elements, jax.Array)
            and not isinstance(self.copies, jax.Array))

  def read(self, counts: tuple[Any, Any] | None = None) -> Payload:
    """This payload with Python-int counts: the one conversion of a payload's counts.

    Args:
      counts: :attr:`counts` already fetched to the host (one ``jax.device_get``
        for a whole round, see ``RoundOutput.to_host``); None fetches them here.
    """
    if counts is None:
      counts = self.counts if self.is_read else jax.device_get(self.counts)
    elements, copies = counts
    return dataclasses.replace(self, elements=host_count(elements) * self.scale,
                               copies=host_count(copies), scale=1)


def host_count(value: Any) -> int:
  """A count read from the device (or given on the host) as a Python int.

  Integers convert exactly; a float (a sum of encoded bytes) rounds half to even.
  """
  a = np.asarray(value)
  if a.dtype.kind in 'iub':
    return int(a)
  return int(round(float(a)))


@dataclasses.dataclass(frozen=True)
class CommRules:
  """How payloads are turned into bytes."""
  name: str
  float_bytes: int = 4
  index_bytes: int = 4
  signal_bits: int = 2
  multicast_once: bool = True
  label_bits: int = 0            # hard labels; 0 = ceil(log2 C)
  count_dataset: bool = True     # count the one-time public-set download


RULES: dict[str, CommRules] = {
    'dsfl': CommRules('dsfl', float_bytes=4, index_bytes=0, signal_bits=32,
                      multicast_once=True, label_bits=32, count_dataset=True),
    'scarlet': CommRules('scarlet', float_bytes=4, index_bytes=8, signal_bits=64,
                         multicast_once=False, label_bits=64, count_dataset=False),
    'fedcache2': CommRules('fedcache2', float_bytes=4, index_bytes=4, signal_bits=2,
                           multicast_once=True, label_bits=8, count_dataset=True),
    'acepfl': CommRules('acepfl', float_bytes=4, index_bytes=4, signal_bits=2,
                        multicast_once=False, label_bits=0, count_dataset=False),
    'minimal': CommRules('minimal', float_bytes=4, index_bytes=4, signal_bits=2,
                         multicast_once=True, label_bits=0, count_dataset=True),
}


def get_rules(name: str, paper_rules: str = 'dsfl') -> CommRules:
  """Resolves ``name`` (``'paper'`` -> ``paper_rules``) to a rule set."""
  if name == 'paper':
    name = paper_rules
  if name not in RULES:
    raise ParamError('name', name, ('paper',) + tuple(RULES))
  return RULES[name]


def payload_bytes(p: Payload, rules: CommRules) -> int:
  """Bytes on the wire for one payload type (all its copies); device counts are read here
  when nobody read them before (one transfer each: read a round's at once instead)."""
  if not p.is_read:
    p = p.read()
  if p.kind == 'float':
    per = p.elements * rules.float_bytes
  elif p.kind == 'index':
    per = p.elements * rules.index_bytes
  elif p.kind == 'signal':
    per = math.ceil(p.elements * rules.signal_bits / 8)
  elif p.kind == 'label':
    bits = rules.label_bits or max(1, math.ceil(math.log2(max(p.classes, 2))))
    per = math.ceil(p.elements * bits / 8)
  elif p.kind == 'dataset' and not rules.count_dataset:
    per = 0
  else:
    per = math.ceil(p.elements * p.bytes_per_element)
  copies = 1 if (p.direction == DOWN and p.multicast and rules.multicast_once) else p.copies
  return int(per * copies)


def count_bytes(payloads: Iterable[Payload], rules: CommRules) -> dict[str, int]:
  """Sums payloads into ``{'up': bytes, 'down': bytes, 'total': bytes}``."""
  out = {UP: 0, DOWN: 0}
  for p in payloads:
    out[p.direction] += payload_bytes(p, rules)
  out['total'] = out[UP] + out[DOWN]
  return out


@dataclasses.dataclass(frozen=True)
class Ledger:
  """The bytes a run has sent: the one-time setup exchange and the rounds', cumulative.

  A frozen value: :meth:`opened` and :meth:`add` return a new ledger. Its :meth:`meta` is what
  a checkpoint stores and :meth:`restored` reads back.

  Attributes:
    rules: the byte-accounting rules.
    setup: ``{'up', 'down', 'total'}`` bytes of the setup exchange (None until opened).
    cum: the same, cumulative: the setup plus every round so far.
  """
  rules: CommRules
  setup: dict[str, int] | None = None
  cum: dict[str, int] = dataclasses.field(
      default_factory=lambda: {UP: 0, DOWN: 0, 'total': 0})

  def opened(self, payloads: Iterable[Payload]) -> 'Ledger':
    """The ledger with the setup exchange counted (unchanged when it already is)."""
    if self.setup is not None:
      return self
    setup = count_bytes(payloads, self.rules)
    return dataclasses.replace(self, setup=setup, cum=dict(setup))

  def add(self, payloads: Iterable[Payload]) -> tuple['Ledger', dict[str, int]]:
    """``(ledger, sent)``: a round's payloads counted and added to the cumulative bytes."""
    sent = count_bytes(payloads, self.rules)
    cum = {k: v + sent[k] for k, v in self.cum.items()}
    return dataclasses.replace(self, cum=cum), sent

  def row(self, sent: dict[str, int]) -> dict[str, int]:
    """A round's byte columns of ``metrics.jsonl``, after :meth:`add` returned ``sent``."""
    return {'up_bytes': sent[UP], 'down_bytes': sent[DOWN], 'round_bytes': sent['total'],
            'cum_bytes': self.cum['total'], 'cum_up_bytes': self.cum[UP],
            'cum_down_bytes': self.cum[DOWN]}

  def meta(self) -> dict[str, dict[str, int] | None]:
    """What a checkpoint keeps of the ledger."""
    return {'cum_bytes': dict(self.cum), 'setup_bytes': self.setup}

  @classmethod
  def restored(cls, rules: CommRules, meta: dict) -> 'Ledger':
    """The ledger a checkpoint's :meth:`meta` recorded."""
    return cls(rules, meta['setup_bytes'], dict(meta['cum_bytes']))


def soft_label_exchange(num_senders: int, num_samples: int, num_classes: int,
                        num_receivers: int | None = None,
                        name: str = 'soft_labels') -> list[Payload]:
  """DS-FL-style round: each client uploads ``[n, C]``, the server multicasts ``[n, C]``."""
  receivers = num_senders if num_receivers is None else num_receivers
  n = num_samples * num_classes
  return [Payload(name, UP, 'float', n, num_senders),
          Payload(name, DOWN, 'float', n, receivers, multicast=True)]


def model_exchange(num_clients: int, num_model_elements: int) -> list[Payload]:
  """FedAvg round: each client uploads its model, the server multicasts the mean."""
  return [Payload('params', UP, 'float', num_model_elements, num_clients),
          Payload('params', DOWN, 'float', num_model_elements, num_clients,
                  multicast=True)]


def open_data_broadcast(num_open: int, bytes_per_sample: float,
                        num_clients: int) -> list[Payload]:
  """One-time multicast of the open (public) data set: DS-FL's ComU@I."""
  return [Payload('open_data', DOWN, 'dataset', num_open, num_clients, multicast=True,
                  bytes_per_element=bytes_per_sample)]


def comu_at(accuracies: Sequence[float], cumulative_bytes: Sequence[int],
            threshold: float) -> int | None:
  """DS-FL's ComU@x: cumulative bytes at the first round with accuracy >= x."""
  for acc, b in zip(accuracies, cumulative_bytes):
    if acc >= threshold:
      return int(b)
  return None
