"""fedjax_kd.running.results: the rules the runner, the sweep, the plots and the report share."""

import math

import numpy as np
import pytest

from fedjax_kd.running import results

SERVER = [{'round': 1, 'test_acc': 0.5, 'client_acc': 0.4, 'cum_bytes': 10},
          {'round': 2, 'test_acc': None, 'client_acc': None, 'cum_bytes': 20},
          {'round': 3, 'test_acc': 0.7, 'client_acc': 0.6, 'cum_bytes': 30}]
CLIENT = [{'round': 1, 'test_acc': 0.3, 'client_acc_min': 0.1, 'cum_bytes': 5},
          {'round': 2, 'test_acc': 0.4, 'client_acc_min': 0.2}]


def test_headline_reads_the_rows_then_the_algorithm():
  assert results.headline(SERVER) == 'server'
  assert results.headline(CLIENT, 'dsfl') == 'client'      # the rows tell, not the name
  bare = [{'round': 1, 'test_acc': 0.5}]
  assert results.headline(bare, 'fedcache2') == 'client'   # no server model
  assert results.headline(bare, 'dsfl') == 'server'
  assert results.headline(bare) == results.headline(bare, 'nope') == 'server'


def test_series_skips_unevaluated_rounds_and_falls_back_only_to_a_client_mean():
  s = results.series(SERVER, 'test_acc')
  np.testing.assert_array_equal(s['round'], [1, 3])
  np.testing.assert_allclose(s['acc'], [0.5, 0.7])
  np.testing.assert_allclose(s['cum_bytes'], [10, 30])
  np.testing.assert_allclose(results.series(SERVER, 'client_acc')['acc'], [0.4, 0.6])
  # FD-like rows: test_acc is the clients' mean, so it is their client accuracy too.
  c = results.series(CLIENT, 'client_acc')
  np.testing.assert_allclose(c['acc'], [0.3, 0.4])
  assert math.isnan(c['cum_bytes'][1])
  # A server model's rows without client accuracy have none to show.
  bare = [{'round': 1, 'test_acc': 0.5}]
  assert results.series(bare, 'client_acc', 'dsfl')['acc'].size == 0
  np.testing.assert_allclose(results.series(bare, 'client_acc', 'fd')['acc'], [0.5])


def test_round_summaries_read_only_the_final_models_rounds():
  # FedConcat-like: 12 rounds of cluster models (accuracy 0.9) then 3 of the concatenated
  # model (0.2, 0.3, 0.4). Mixing them would give a last-10 of (7 * 0.9 + 0.9) / 10 = 0.72.
  from fedjax_kd.sweep import collect  # pylint: disable=g-import-not-at-top
  rows = [{'round': t, 'test_acc': 0.9, 'scored_model': 0, 'cum_bytes': 10 * t,
           'round_bytes': 10} for t in range(1, 13)]
  rows += [{'round': 12 + i, 'test_acc': a, 'scored_model': 1, 'cum_bytes': 120 + 10 * i,
            'round_bytes': 10} for i, a in enumerate((0.2, 0.3, 0.4), 1)]
  assert [r['round'] for r in results.final_model_rows(rows)] == [13, 14, 15]
  got = collect.run_stats(rows, None, thresholds=(0.3, 0.8))
  assert got['last10_acc'] == pytest.approx(0.3)      # (0.2 + 0.3 + 0.4) / 3
  assert got['best_acc'] == pytest.approx(0.4) and got['final_acc'] == pytest.approx(0.4)
  assert got['rounds_to_0.3'] == 14                    # not round 1 (a cluster model)
  assert got['rounds_to_0.8'] is None
  plain = [{k: v for k, v in r.items() if k != 'scored_model'} for r in rows]
  assert results.final_model_rows(plain) == plain     # no marker: every round
  assert collect.run_stats(plain, None, thresholds=())['last10_acc'] == pytest.approx(
      (7 * 0.9 + 0.9) / 10)


def test_stat_and_formats_by_hand():
  s = results.stat({0: 0.5, 1: 0.7, 2: float('nan'), 3: None})
  assert s['n'] == 2 and s['mean'] == pytest.approx(0.6)
  assert s['std'] == pytest.approx(math.sqrt(0.02))        # ((0.1)^2 * 2 / 1) ** 0.5
  assert results.fmt_stat(s) == '0.600 ± 0.141'
  assert results.fmt_stat(results.stat({0: 2.5e6}), 'bytes') == '2.50 ± –'
  assert results.fmt_stat(results.stat({})) == '–'
  assert [results.fmt_time(x) for x in (5, 68.4, 7384)] == ['5s', '1m08s', '2h03m04s']
  assert [results.fmt_bytes(x) for x in (999, 2_250, 1_502_250, 3e9)] == [
      '999 B', '2.25 kB', '1.50 MB', '3.00 GB']
  assert results.slug('DS-FL (ERA, T=0.1)') == 'ds-fl-era-t-0.1'
  assert results.slug(('cnn@0.5', 'cnn@1')) == 'cnn-0.5-cnn-1'
  assert results.slug('((()))') == 'x'
  assert not results.finite(True) and not results.finite(None) and results.finite(3)
