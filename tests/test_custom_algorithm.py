"""docs/custom_algorithm.md's worked examples run as written: its code blocks are executed
here (a changed loss, a local step of its own, a server aggregate with options, its config
file and a Protocol member)."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from typing import ClassVar

import numpy as np
import pytest

from fedjax_kd import algorithms
from fedjax_kd import config as config_lib
from fedjax_kd import runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(REPO, 'docs', 'custom_algorithm.md')


def guide_blocks():
  with open(GUIDE) as f:
    return [textwrap.dedent(b) for b in re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)]


def guide_block(marker: str) -> str:
  """The guide's one block holding ``marker``."""
  (found,) = [b for b in guide_blocks() if marker in b]
  return found


def run_block(marker: str, module: str) -> dict:
  """The guide's block holding ``marker``, executed as module ``module``: its namespace."""
  namespace = {'__name__': module}
  exec(compile(guide_block(marker), GUIDE, 'exec'), namespace)   # pylint: disable=exec-used
  return namespace


@pytest.fixture
def guide():
  """The guide's median block, executed as a module (it registers MedianDistill)."""
  namespace = run_block('class MedianDistill', 'median_guide')
  yield namespace
  algorithms.unregister('median_distill')


def test_the_guide_has_its_three_examples_its_config_and_a_protocol_member():
  blocks = guide_blocks()
  assert len(blocks) == 5
  assert 'def balanced_ce' in blocks[0] and 'class SharpnessAware(program.Program)' in blocks[1]
  assert 'class MedianDistill' in blocks[2] and 'def get_config' in blocks[3]
  assert 'class MedianProtocol(protocol.Protocol)' in blocks[4]


def test_a_changed_loss_runs_and_is_the_balanced_softmax(tmp_path):
  """Example 1: the balanced softmax by hand (uniform frequencies leave the cross-entropy as
  it is; a skewed one shifts the logits by its log), and a round of it on tiny data."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops import losses  # pylint: disable=g-import-not-at-top
  from tests.test_golden import golden_tiny_config  # pylint: disable=g-import-not-at-top
  ns = run_block('def balanced_ce', 'balanced_guide')
  try:
    logits = jnp.asarray([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    y = jnp.asarray([0, 2])
    uniform = {'log_prior': jnp.log(jnp.full((3,), 1 / 3))}
    np.testing.assert_allclose(ns['balanced_ce'](logits, {'y': y}, uniform),
                               losses.cross_entropy(logits, y), rtol=1e-6)
    prior = np.asarray([0.7, 0.2, 0.1])
    z = np.asarray(logits) + np.log(prior)
    want = -(z - np.log(np.exp(z).sum(1, keepdims=True)))[np.arange(2), [0, 2]]
    np.testing.assert_allclose(ns['balanced_ce'](logits, {'y': y},
                                                 {'log_prior': jnp.log(prior)}), want, rtol=1e-5)
    c = golden_tiny_config('fedavg')
    c.algorithm = 'balanced_fedavg'
    runner.run(config_lib.validate(c), str(tmp_path / 'run'), progress=False)
    rows = _rows(tmp_path / 'run')
    assert [r['round'] for r in rows] == [1, 2] and np.isfinite(rows[1]['train_loss'])
  finally:
    algorithms.unregister('balanced_fedavg')


@pytest.mark.slow
def test_a_local_step_of_its_own_is_fedavgs_at_rho_0(tmp_path):
  """Example 2: FedSAM's program with rho = 0 takes FedAvg's steps (every metric of its
  rounds equal to FedAvg's); rho = 0.05 takes others."""
  from tests.test_golden import golden_tiny_config  # pylint: disable=g-import-not-at-top
  run_block('class SharpnessAware', 'sam_guide')
  try:
    rows = {}
    for name, rho in (('fedavg', None), ('fedsam', 0.0), ('fedsam', 0.05)):
      c = golden_tiny_config('fedavg')
      c.algorithm = name
      if rho is not None:
        c.fedsam.rho = rho
      runner.run(config_lib.validate(c), str(tmp_path / f'{name}{rho}'), progress=False)
      rows[(name, rho)] = _rows(tmp_path / f'{name}{rho}')
    for a, b in zip(rows[('fedavg', None)], rows[('fedsam', 0.0)]):
      assert set(a) == set(b)
      for key, value in a.items():
        np.testing.assert_allclose(b[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    assert rows[('fedsam', 0.05)][-1]['train_loss'] != rows[('fedsam', 0.0)][-1]['train_loss']
  finally:
    algorithms.unregister('fedsam')


def test_median_labels_by_hand(guide):
  import jax.numpy as jnp
  probs = jnp.asarray([[[0.6, 0.4], [0.1, 0.9]],
                       [[0.2, 0.8], [0.3, 0.7]],
                       [[0.9, 0.1], [0.5, 0.5]],
                       [[0.0, 1.0], [0.0, 1.0]]])   # client 3 is inactive
  active = jnp.asarray([True, True, True, False])
  got = np.asarray(guide['median_labels'](probs, active))
  # Sample 0: medians (0.6, 0.4); sample 1: (0.3, 0.7); both already sum to 1.
  np.testing.assert_allclose(got, [[0.6, 0.4], [0.3, 0.7]], atol=1e-6)
  # Medians that do not sum to 1 are renormalised: (0.5, 0.3) -> (0.625, 0.375).
  p2 = jnp.asarray([[[0.5, 0.5]], [[0.5, 0.3]], [[0.1, 0.3]]])
  got2 = np.asarray(guide['median_labels'](p2, jnp.ones(3, bool)))
  np.testing.assert_allclose(got2, [[0.625, 0.375]], atol=1e-6)
  # temperature 0.5 squares the medians before renormalising: (0.6, 0.4) -> (0.36, 0.16) / 0.52.
  got3 = np.asarray(guide['median_labels'](probs, active, 0.5, 0.5))
  np.testing.assert_allclose(got3[0], [0.36 / 0.52, 0.16 / 0.52], atol=1e-6)
  # quantile 0.25 of (0.6, 0.2, 0.9) is 0.4 (linear between 0.2 and 0.6); of (0.4, 0.8, 0.1),
  # 0.25: (0.4, 0.25) -> (0.615..., 0.384...).
  got4 = np.asarray(guide['median_labels'](probs, active, 0.25, 1.0))
  np.testing.assert_allclose(got4[0], [0.4 / 0.65, 0.25 / 0.65], atol=1e-6)


@pytest.mark.slow
def test_the_options_come_from_the_command_line_and_a_typo_is_refused(guide, tmp_path):
  # The guide's one declaration of two options is all it takes: the command line sets both,
  # a misspelt one is refused by name, a bad value by its check, and both reach the run's
  # config.json and the generated option table.
  from fedjax_kd import main as main_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.errors import ConfigError  # pylint: disable=g-import-not-at-top
  cfg = tmp_path / 'my_median.py'
  # The guide's algorithm with the tests' tiny experiment (its programs are compiled already).
  cfg.write_text(guide_block('class MedianDistill') + '\n\nfrom tests.shared import tiny_config\n\n\n'
                 'def get_config():\n'
                 "  c = tiny_config(rounds=1, **{'checkpoint.every': 0})\n"
                 "  c.algorithm = 'median_distill'\n  return c\n")
  # The group is part of the default config once the class is registered.
  assert dict(config_lib.default_config().median_distill) == {'quantile': 0.5,
                                                               'temperature': 1.0}
  fv = main_lib.parse(['main', f'--config={cfg}', '--config.median_distill.quantile=0.25',
                       '--config.median_distill.temperature=0.5'])
  spec = config_lib.validate(fv.config)
  assert spec.algorithm == 'median_distill'
  assert (spec.options.quantile, spec.options.temperature) == (0.25, 0.5)
  with pytest.raises(ConfigError, match=r"^median_distill\.quantil='0\.25' is not allowed: "
                                        r".*quantile, temperature \(did you mean "
                                        r"median_distill\.quantile\?\)"):
    main_lib.parse(['main', f'--config={cfg}', '--config.median_distill.quantil=0.25'])
  fv = main_lib.parse(['main', f'--config={cfg}', '--config.median_distill.quantile=1.5'])
  with pytest.raises(ConfigError, match=r'^median_distill\.quantile=1\.5 is not allowed'):
    config_lib.validate(fv.config)
  # The command line runs it with both set; config.json records both.
  workdir = tmp_path / 'run'
  assert main_lib.cli(['main', f'--config={cfg}', f'--workdir={workdir}', '--progress=false',
                       '--config.median_distill.quantile=0.25',
                       '--config.median_distill.temperature=0.5']) == 0
  saved = json.loads((workdir / 'config.json').read_text())
  assert saved['median_distill'] == {'quantile': 0.25, 'temperature': 0.5}
  # The option table has both, with their defaults, checks and docs.
  tables = config_lib.option_tables()
  assert ("| `median_distill.quantile` | `0.5` | a number in (0, 1] | which quantile of the "
          'uploads (0.5: the median) |') in tables
  assert '| `median_distill.temperature` | `1.0` | a number > 0 |' in tables


def _options(group: str, **defaults):
  """An options class of ``group`` with float fields at ``defaults``."""
  from fedjax_kd import options  # pylint: disable=g-import-not-at-top
  return dataclasses.make_dataclass(
      f'{group.title()}Options',
      [(k, float, options.option(v, 'x')) for k, v in defaults.items()] + [
          ('group', ClassVar[str], group)], frozen=True)


def test_a_group_another_algorithm_declares_otherwise_is_refused(guide):
  class Clash(algorithms.Algorithm):
    name = 'clash'
    options_class = _options('median_distill', quantile=0.9)
  with pytest.raises(ValueError, match="config group 'median_distill'"):
    algorithms.register(Clash)
  class Bad(algorithms.Algorithm):
    name = 'bad_groups'
    options_class = dict
  with pytest.raises(ValueError, match='options_class must be a frozen dataclass'):
    algorithms.register(Bad)
  # A group named like one of the engine's is refused when the config is built.
  class Engine(algorithms.Algorithm):
    name = 'engine_group'
    options_class = _options('train', x=1.0)
  algorithms.register(Engine)
  try:
    with pytest.raises(ValueError, match="config group 'train' of an algorithm"):
      config_lib.default_config()
  finally:
    algorithms.unregister('engine_group')


@pytest.mark.slow
def test_registered_algorithm_runs_with_bytes_counted(guide, tmp_path):
  from tests.shared import tiny_config
  assert algorithms.ALGORITHMS['median_distill'] is guide['MedianDistill']
  c = tiny_config(rounds=2)
  c.algorithm = 'median_distill'
  spec = config_lib.validate(c)
  runner.run(spec, str(tmp_path / 'run'), progress=False)
  rows = [json.loads(line) for line in open(tmp_path / 'run' / 'metrics.jsonl')]
  assert [r['round'] for r in rows] == [1, 2]
  # 4 clients upload 100 public samples x 10 classes of float32 each round.
  assert all(r['up_bytes'] == 4 * 100 * 10 * 4 for r in rows)
  assert rows[1]['train_loss'] < rows[0]['train_loss']
  assert np.isfinite(rows[1]['distill_loss']) and 0.0 <= rows[1]['test_acc'] <= 1.0


def test_register_refuses_a_built_in_name_or_a_non_algorithm():
  class Fake(algorithms.Algorithm):
    name = 'dsfl'
  with pytest.raises(ValueError, match='built-in'):
    algorithms.register(Fake)
  with pytest.raises(ValueError, match='not a subclass'):
    algorithms.register(object)


@pytest.mark.slow
def test_the_guide_as_a_config_file_runs_from_the_command_line(tmp_path):
  """Both blocks in one config file, as the guide says: the CLI validates and runs it."""
  cfg = tmp_path / 'my_median.py'
  cfg.write_text(guide_block('class MedianDistill') + '\n\n' + guide_block('def get_config'))
  r = subprocess.run(
      [sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}', f'--workdir={tmp_path / "w"}',
       '--noprogress', '--config.rounds=1', '--config.data.source=synthetic:600',
       '--config.data.num_public=150', '--config.distill.public_per_round=100',
       "--config.clients.models=('mlp@0.25',)", '--config.server.model=mlp@0.25',
       '--config.train.epochs=1', '--config.distill.epochs=1',
       '--config.median_distill.quantile=0.25', '--config.median_distill.temperature=0.5'],
      cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
      timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads((tmp_path / 'w' / 'summary.json').read_text())
  assert summary['algorithm'] == 'median_distill'
  cfg = json.loads((tmp_path / 'w' / 'config.json').read_text())
  assert cfg['median_distill'] == {'quantile': 0.25, 'temperature': 0.5}


def test_a_class_defined_again_replaces_itself_another_is_refused(guide):
  first = guide['MedianDistill']
  again = {'__name__': 'median_guide'}
  exec(compile(guide_block('class MedianDistill'), GUIDE, 'exec'), again)   # loaded twice
  assert algorithms.ALGORITHMS['median_distill'] is again['MedianDistill'] is not first

  class Other(algorithms.Algorithm):
    name = 'median_distill'
  with pytest.raises(ValueError, match='already registered to MedianDistill'):
    algorithms.register(Other)


def _rows(workdir) -> list[dict]:
  """metrics.jsonl without its clock columns."""
  rows = [json.loads(line) for line in open(workdir / 'metrics.jsonl')]
  return [{k: v for k, v in row.items() if not k.endswith('_s')} for row in rows]


@pytest.mark.slow
def test_a_protocol_member_with_only_aggregate_runs(guide, tmp_path):
  """The guide's third block: a ``Protocol`` subclass that defines nothing but ``aggregate``,
  and no options class, runs the family's round with its bytes counted."""
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top
  exec(compile(guide_block('class MedianProtocol'), GUIDE, 'exec'), guide)   # pylint: disable=exec-used
  try:
    c = tiny_config(rounds=2)
    c.algorithm = 'median_protocol'
    spec = config_lib.validate(c)
    runner.run(spec, str(tmp_path / 'run'), progress=False)
    rows = _rows(tmp_path / 'run')
    assert [r['round'] for r in rows] == [1, 2]
    # 4 clients upload 100 public samples x 10 float32 classes a round; the labels go down
    # once, multicast, from round 2 on (the family's next-round schedule).
    assert all(r['up_bytes'] == 4 * 100 * 10 * 4 for r in rows)
    assert rows[0]['down_bytes'] < rows[1]['down_bytes']
    assert np.isfinite(rows[1]['distill_loss']) and 0.0 <= rows[1]['test_acc'] <= 1.0
  finally:
    algorithms.unregister('median_protocol')


@pytest.mark.slow
def test_a_protocol_member_with_the_mean_as_aggregate_is_dsfl_sa(tmp_path):
  """A member that defines only ``aggregate`` runs exactly the family's round: with the
  uploaders' mean it is DS-FL with SA in the next-round schedule, every metric equal."""
  from fedjax_kd.algorithms import protocol  # pylint: disable=g-import-not-at-top
  from fedjax_kd.ops import aggregate  # pylint: disable=g-import-not-at-top
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top

  @algorithms.register
  class MeanOnly(protocol.Protocol):
    name = 'mean_only'

    def aggregate(self, probs, mask):
      mean, count = aggregate.uploader_mean(probs, mask)
      return mean, count > 0, {}

  try:
    out = {}
    for name, extra in (('mean_only', {}),
                        ('dsfl', {'dsfl.aggregation': 'sa', 'dsfl.schedule': 'next_round'})):
      c = config_lib.override(tiny_config(rounds=2), extra)
      c.algorithm = name
      runner.run(config_lib.validate(c), str(tmp_path / name), progress=False)
      out[name] = _rows(tmp_path / name)
    dsfl = [{k: v for k, v in row.items() if k != 'sa_entropy'} for row in out['dsfl']]
    assert out['mean_only'] == dsfl
  finally:
    algorithms.unregister('mean_only')
