"""benchmarks/references/pytorch: the independent PyTorch implementations fedjax_kd's curves are read against.

PyTorch is a benchmark extra: the tests that run it skip where it is not installed. They make
their own 28x28 data set (a Keras-layout npz), so they need no download; the setting a pair
of runs shares needs no PyTorch at all.
"""

import json
import pathlib

import numpy as np
import pytest

from benchmarks.references.pytorch import __main__ as cli
from benchmarks.references.pytorch import common
from fedjax_kd import config as config_lib
from fedjax_kd import sweep
from fedjax_kd.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[1]


def write_npz(path: pathlib.Path, n_train: int = 1200, n_test: int = 300,
              noise: float = 60.0) -> str:
  """A learnable 28x28 task in Keras' mnist.npz layout: noisy class prototypes (pixel noise
  of std ``noise``)."""
  rng = np.random.default_rng(0)
  protos = rng.uniform(0, 255, (10, 28, 28))

  def draw(n):
    y = rng.permutation(np.arange(n) % 10)
    x = np.clip(protos[y] + rng.normal(0, noise, (n, 28, 28)), 0, 255).astype(np.uint8)
    return x, y.astype(np.uint8)

  (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
  np.savez(path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
  return str(path)


def _config(path: str, preset: str, **fields):
  cfg = config_lib.load_file(str(REPO / preset))
  return sweep.apply_overrides(cfg, [('data.source', f'npz:{path}'), *fields.items()])


def _dsfl(path, seed=0, **fields):
  return _config(path, 'configs/dsfl_mnist_cpu.py', seed=seed, rounds=2,
                 **{'clients.num_clients': 2, 'data.num_private': 400, 'data.num_public': 500,
                    'distill.public_per_round': 200, 'eval.clients': False, **fields})


def test_setting_is_fixed_by_the_seed(tmp_path):
  """A pair of runs shares data, partition and open-set draws: all three follow the seed."""
  path = write_npz(tmp_path / 'm.npz')
  a = common.export_setting(_dsfl(path, 0, **{'dsfl.aggregation': 'era'}), ('dsfl',))
  b = common.export_setting(_dsfl(path, 0, **{'dsfl.aggregation': 'sa'}), ('dsfl',))
  c = common.export_setting(_dsfl(path, 1), ('dsfl',))
  assert a.train == (5, 100, 0.1) and a.distill == (5, 100, 0.1)   # the paper's DS-FL
  assert common._parse_model(a.client_models[0]) == ('dsfl_cnn', 1.0)  # pylint: disable=protected-access
  assert a.client_models == (a.server_model,) * 2 and a.x_private.shape[1:] == (28, 28, 1)
  rows = np.concatenate(a.client_rows)   # 2 clients x 2 label-sorted shards of 100
  assert len(a.client_rows) == 2 and len(rows) == len(np.unique(rows)) == 400
  for name in ('x_private', 'y_private', 'x_public', 'x_test', 'draws'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
  assert any((ra != rc).any() for ra, rc in zip(a.client_rows, c.client_rows))
  # o_r: 200 distinct open samples a round, a new draw every round.
  assert a.draws.shape == (2, 200) and (np.diff(a.draws, axis=1) > 0).all()
  assert a.draws.max() < len(a.x_public) and (a.draws[0] != a.draws[1]).any()


def test_reference_switches_are_checked():
  opts, rest = common.split_reference([('reference.init', 'fedjax'), ('rounds', 3),
                                       ('reference.seed_offset', 7)])
  assert opts == common.RefOptions(init='fedjax', seed_offset=7) and opts.lockstep
  assert rest == (('rounds', 3),)
  assert not common.RefOptions().lockstep
  with pytest.raises(ConfigError, match='reference.bn'):
    common.split_reference({'reference.bn': 'biased'})
  with pytest.raises(ConfigError, match='reference.batches'):
    common.split_reference({'reference.batches': 'keras'})
  with pytest.raises(ConfigError, match='reference.seed_offset'):
    common.split_reference({'reference.seed_offset': 1.5})


@pytest.mark.parametrize('name', ['dsfl_cnn@1.0', 'lenet5@1.0', 'cnn@0.5', 'cnn@1.0', 'mlp@0.5'])
def test_fedjax_kd_weights_give_the_same_predictions_in_pytorch(name):
  """The layout conversion (HWIO -> OIHW kernels, NHWC -> NCHW flattening, BatchNorm
  statistics): the same weights predict the same logits in both frameworks."""
  torch = pytest.importorskip('torch')
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.models import registry  # pylint: disable=g-import-not-at-top
  module = registry.get_model(name, num_classes=10, input_shape=(28, 28, 1))
  x = np.random.default_rng(1).normal(size=(6, 28, 28, 1)).astype(np.float32)
  variables = module.init(jax.random.PRNGKey(3), x, train=False)
  stats = dict(variables.get('batch_stats', {}))
  if stats:   # non-trivial running statistics, so that they are read too
    stats = jax.tree.map(lambda v: v + 0.3 * np.abs(np.random.default_rng(2).normal(
        size=v.shape)).astype(np.float32), stats)
    variables = {**variables, 'batch_stats': stats}
  want = np.asarray(module.apply(variables, x, train=False))
  base, width = common._parse_model(name)  # pylint: disable=protected-access
  model = common.MODELS[base](10, 1, **({'width': width} if base in ('cnn', 'mlp') else {}))
  sd = common.from_flax(model, variables['params'], stats)
  model.load_state_dict({k: torch.tensor(v) for k, v in sd.items()}, strict=False)
  model.eval()
  with torch.no_grad():
    got = model(common.nchw(x)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert set(model.state_dict()) - set(sd) <= {k for k in model.state_dict()
                                               if k.endswith('num_batches_tracked')}


def test_torch_model_has_the_papers_parameter_count():
  pytest.importorskip('torch')
  model = common.dsfl_cnn(10)
  trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
  running = sum(b.numel() for n, b in model.named_buffers() if 'running' in n)
  assert trainable == 583_242 and trainable + running == 584_458   # DS-FL's MNIST CNN


def _fedjax_rows(cfg, workdir):
  from fedjax_kd import runner  # pylint: disable=g-import-not-at-top
  runner.run(config_lib.validate(cfg), str(workdir), progress=False, log=lambda *_: None)
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize('algorithm', ['dsfl', 'scaffold'])
def test_lockstep_reference_reproduces_fedjax_kd(tmp_path, algorithm):
  """With fedjax_kd's initial weights, its minibatch order and its biased running variance,
  the PyTorch loop computes what fedjax_kd computes: the losses of two rounds agree to float
  rounding (SCAFFOLD's second round reads the control variates of the first)."""
  pytest.importorskip('torch')
  from benchmarks.references.pytorch import dsfl, fedentopt  # pylint: disable=g-import-not-at-top
  path = write_npz(tmp_path / 'm.npz')
  if algorithm == 'dsfl':
    cfg, module = _dsfl(path), dsfl
    keys = ('test_acc', 'train_loss', 'distill_loss', 'server_distill_loss')
  else:
    cfg = _config(path, 'configs/fedentopt_mnist_cpu.py', seed=0, rounds=2, algorithm='scaffold',
                  **{'clients.num_clients': 10, 'data.num_private': 1000,
                     'clients.participation': 0.3, 'selection.method': 'uniform'})
    module, keys = fedentopt, ('test_acc', 'train_loss')
  want = _fedjax_rows(cfg, tmp_path / 'fedjax')
  opts = common.RefOptions(bn_running_var='biased', init='fedjax', batches='fedjax')
  got = list(module.rounds(common.Context(common.export_setting(cfg, module.ALGORITHMS),
                                          opts, 0)))
  assert [r['round'] for r in got] == [r['round'] for r in want] == [1, 2]
  # test_acc counts 300 test images: with one intra-op thread instead of the default pool the
  # two frameworks' float sums differ enough to flip one image of a model near chance
  # (measured: 0.1000 against 0.0967 at round 1), so two images are allowed.
  for g, w in zip(got, want):
    for k in keys:
      np.testing.assert_allclose(g[k], w[k], rtol=2e-3, atol=2 / 300 if k == 'test_acc' else 0,
                                 err_msg=f'round {g["round"]} {k}')


@pytest.mark.slow   # two full DS-FL runs on 28x28 images: a minute and more on 2 cores
def test_tiny_reference_run_is_a_sweep(tmp_path):
  """Two rounds with 2 clients: a sweep directory that aggregate reads, and that a rerun
  skips."""
  pytest.importorskip('torch')
  path = write_npz(tmp_path / 'm.npz')
  out = tmp_path / 'ref'
  argv = [f'--mnist={path}', '--seeds=0', '--variants=era', '--rounds=2', f'--out={out}',
          '--set', 'clients.num_clients=2', '--set', 'data.num_private=400', '--set',
          'data.num_public=500', '--set', 'distill.public_per_round=200', '--threads=2']
  assert cli.main(argv) == 0
  wd = out / 'runs' / 'pytorch-ds-fl-era' / 'seed0'
  rows = [json.loads(line) for line in (wd / 'metrics.jsonl').read_text().splitlines()]
  assert [row['round'] for row in rows] == [1, 2]
  assert 0 <= rows[-1]['upload_acc'] <= 1 and rows[-1]['test_acc'] > 0.1
  config = json.loads((wd / 'config.json').read_text())
  assert config['clients']['num_clients'] == 2 and config['reference']['init'] == 'torch'
  (cell,) = sweep.aggregate(str(out))
  assert cell['variant'] == 'PyTorch DS-FL ERA' and cell['n'] == 1
  assert cell['stats']['final_acc']['mean'] == rows[-1]['test_acc']
  before = (wd / 'metrics.jsonl').read_text()
  assert cli.main(argv) == 0
  assert (wd / 'metrics.jsonl').read_text() == before      # finished: skipped


def test_bad_flags_exit_2(tmp_path, capsys):
  assert cli.main([f'--mnist={tmp_path / "none.npz"}', f'--out={tmp_path}']) == 2
  assert 'none.npz' in capsys.readouterr().err
  path = write_npz(tmp_path / 'm.npz', 100, 20)
  assert cli.main([f'--mnist={path}', '--algorithm=fedmd', f'--out={tmp_path}']) == 2
  assert '--algorithm' in capsys.readouterr().err
  assert cli.main([f'--mnist={path}', '--variants=ear', f'--out={tmp_path}']) == 2
  assert '--variants' in capsys.readouterr().err
  assert cli.main([f'--mnist={path}', '--set', 'reference.init=keras',
                   f'--out={tmp_path}']) == 2
  assert 'reference.init' in capsys.readouterr().err
