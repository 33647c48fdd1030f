"""Communication accounting reproduces DS-FL's Tables 1 and 2 and its ComU entries exactly."""

import pytest

from fedjax_kd.ops import comm
from fedjax_kd.ops.errors import ParamError

DSFL = comm.RULES['dsfl']


def per_round(payloads, rules=DSFL):
  return comm.count_bytes(payloads, rules)['total']


# Table 1 (images, K=100, N_L=10, |o_r|=1000) and Table 2 (text, K=10).
@pytest.mark.parametrize('k,p_total,c,fl,fd,dsfl', [
    (100, 584_458, 10, 236_121_032, 40_400, 4_040_000),      # MNIST: 236.1 MB, 40.4 kB, 4.0 MB
    (100, 2_762_272, 10, 1_115_957_888, 40_400, 4_040_000),  # FMNIST: 1.1 GB
    (10, 646_338, 2, 28_438_872, 176, 88_000),               # IMDb: 28.6 MB*, 176 B, 88 kB
    (10, 5_194_670, 46, 228_565_480, 93_104, 2_024_000),     # Reuters: 228.8 MB*, 93 kB, 2.0 MB
])
def test_dsfl_tables_1_and_2(k, p_total, c, fl, fd, dsfl):
  assert per_round(comm.model_exchange(k, p_total)) == fl
  fd_payloads = [comm.Payload('per_label_probs', comm.UP, 'float', c * c, k),
                 comm.Payload('per_label_probs', comm.DOWN, 'float', c * c, k, multicast=True)]
  assert per_round(fd_payloads) == fd
  assert per_round(comm.soft_label_exchange(k, 1000, c)) == dsfl


def test_table1_rounded_as_printed():
  assert round(per_round(comm.model_exchange(100, 584_458)) / 1e6, 1) == 236.1
  assert round(per_round(comm.model_exchange(100, 2_762_272)) / 1e9, 1) == 1.1
  assert round(per_round(comm.soft_label_exchange(100, 1000, 10)) / 1e6, 1) == 4.0
  assert per_round(comm.soft_label_exchange(100, 1000, 10)) / per_round(
      [comm.Payload('x', comm.UP, 'float', 100, 100),
       comm.Payload('x', comm.DOWN, 'float', 100, 100, multicast=True)]) == 100


@pytest.mark.parametrize('i_o,gb', [(5000, 0.016), (10000, 0.031), (20000, 0.063),
                                    (40000, 0.13)])
def test_comu_at_i_open_data(i_o, gb):
  b = per_round(comm.open_data_broadcast(i_o, 784 * 4, 100))
  assert b == i_o * 3136
  assert round(b / 1e9, 3 if gb < 0.1 else 2) == gb


@pytest.mark.parametrize('rounds,expected_gb', [(24, 5.67), (53, 12.5)])
def test_fl_comu_mnist(rounds, expected_gb):
  """FL cumulative cost = (1 + r(K+1)) P_total 4 B: the initial broadcast counts once."""
  init = per_round([comm.Payload('params', comm.DOWN, 'float', 584_458, 100, multicast=True)])
  total = init + rounds * per_round(comm.model_exchange(100, 584_458))
  assert round(total / 1e9, 2 if expected_gb < 10 else 1) == expected_gb


def test_scarlet_rules_count_broadcast_per_receiver_and_int64():
  p = [comm.Payload('soft_labels', comm.DOWN, 'float', 10, 5, multicast=True),
       comm.Payload('indices', comm.UP, 'index', 10, 1),
       comm.Payload('signals', comm.DOWN, 'signal', 10, 1)]
  sc = comm.count_bytes(p, comm.RULES['scarlet'])
  assert sc == {'up': 80, 'down': 5 * 40 + 80, 'total': 360}
  mn = comm.count_bytes(p, comm.RULES['minimal'])
  assert mn == {'up': 40, 'down': 40 + 3, 'total': 83}  # 10 x 2 bits -> 3 bytes


def test_comu_at_and_rules_errors():
  assert comm.comu_at([0.5, 0.81, 0.95], [10, 20, 30], 0.8) == 20
  assert comm.comu_at([0.5], [10], 0.8) is None
  assert comm.get_rules('paper', 'scarlet').name == 'scarlet'
  with pytest.raises(ParamError, match="name='exact'"):
    comm.get_rules('exact')


def test_ledger_counts_setup_and_rounds_by_hand():
  # DS-FL's rules: 3 senders upload 10 samples x 2 classes of float32 (3 * 80 = 240 bytes);
  # the server multicasts one [10, 2] array, counted once (80 bytes).
  ledger = comm.Ledger(comm.get_rules('dsfl'))
  # The setup: an open set of 5 samples of 64 bytes each, multicast to 3 clients: 320 bytes.
  ledger = ledger.opened(comm.open_data_broadcast(5, 64.0, 3))
  assert ledger.setup == {'up': 0, 'down': 320, 'total': 320} == ledger.cum
  assert ledger.opened(comm.open_data_broadcast(9, 64.0, 3)) is ledger   # counted once
  ledger, sent = ledger.add(comm.soft_label_exchange(3, 10, 2))
  assert sent == {'up': 240, 'down': 80, 'total': 320}
  ledger, sent = ledger.add(comm.soft_label_exchange(2, 10, 2))   # one client dropped out
  assert sent == {'up': 160, 'down': 80, 'total': 240}
  assert ledger.cum == {'up': 400, 'down': 480, 'total': 880}
  assert ledger.row(sent) == {'up_bytes': 160, 'down_bytes': 80, 'round_bytes': 240,
                              'cum_bytes': 880, 'cum_up_bytes': 400, 'cum_down_bytes': 480}
  # What a checkpoint keeps restores the same ledger; the setup is not counted again.
  again = comm.Ledger.restored(ledger.rules, ledger.meta())
  assert again == ledger and again.opened(comm.open_data_broadcast(5, 64.0, 3)) == ledger


# ------------------------------------------------- a round's output, read once
def test_device_counts_are_read_in_one_place():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  rows = jnp.sum(jnp.ones((3, 7), bool))                  # a device count: 21
  p = comm.Payload('uploads', comm.UP, 'float', rows, jnp.int32(3), scale=10)
  assert not p.is_read
  read = p.read()
  assert read == comm.Payload('uploads', comm.UP, 'float', 210, 3)   # 21 rows x 10 floats
  assert type(read.elements) is int and type(read.copies) is int and read.is_read
  assert read.read() == read
  # Bytes of an unread payload are those of the read one (count_bytes reads it then).
  assert comm.payload_bytes(p, DSFL) == comm.payload_bytes(read, DSFL) == 210 * 3 * 4
  # A float byte sum rounds half to even, as Python's round does.
  raw = comm.Payload('distilled_inputs', comm.UP, 'raw', jnp.float32(10.5),
                     bytes_per_element=1.0)
  assert raw.read().elements == 10 and comm.host_count(jnp.float32(11.5)) == 12


def test_round_output_reads_metrics_and_payloads_at_once(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  calls = []
  device_get = jax.device_get
  monkeypatch.setattr(jax, 'device_get', lambda x: calls.append(1) or device_get(x))
  metrics = {'loss': base.nanmean(jnp.asarray([1.0, jnp.nan, 2.0])),
             'requested': jnp.sum(jnp.ones(4, bool)), 'host_float': 0.25, 'host_int': 3,
             'numpy': np.float32(0.5), 'all_nan': base.nanmean(jnp.full(2, jnp.nan))}
  out = base.RoundOutput(
      metrics, [comm.Payload('request', comm.DOWN, 'index', jnp.int32(4), 2, multicast=True)])
  host = out.to_host()
  assert len(calls) == 1                                   # one transfer for everything
  m = host.metrics
  assert m['loss'] == 1.5 and type(m['loss']) is float
  assert m['requested'] == 4 and type(m['requested']) is int
  assert (m['host_float'], m['host_int']) == (0.25, 3) and type(m['host_int']) is int
  assert type(m['numpy']) is float and np.isnan(m['all_nan'])
  assert host.payloads == [comm.Payload('request', comm.DOWN, 'index', 4, 2, multicast=True)]
  # Host values only (a custom algorithm's plain dict of floats) come through unchanged.
  plain = base.RoundOutput({'train_loss': 0.5}, []).to_host()
  assert plain.metrics == {'train_loss': 0.5}
