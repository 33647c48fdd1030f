"""The client axis sharded over 8 (forced CPU) devices gives the one-device results."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import jax, numpy as np, optax
    assert len(jax.devices()) == 8, jax.devices()
    from tests.shared import distill, train
    from tests.test_engine import TinyMLP, make_data
    from fedjax_kd.algorithms.fedcache2 import SyntheticDistillation
    from fedjax_kd.core.federation import Federation
    from fedjax_kd.core.program import Rows
    data = make_data([9, 14, 20, 11, 17])
    root = jax.random.PRNGKey(0)
    outs = []
    for use_mesh in (False, True):
      fed = Federation(data, ['a', 'b', 'a', 'b', 'a'],
                       {'a': TinyMLP(8, True), 'b': TinyMLP(16, True)},
                       {'train': optax.sgd(0.1)}, use_mesh=use_mesh)
      assert (fed.mesh is not None) == use_mesh
      st = fed.init(root)
      active = np.array([True, True, False, True, True])
      st, _ = train(fed, st, root, 1, 2, 4, active=active)
      p = fed.predict(st, data.x_public)
      st, _ = distill(fed, st, root, 1, data.x_public, p.mean(0), 1, 10)
      acc, _ = fed.evaluate(st)
      # FedCache 2.0's KRR distillation of per-client synthetic inputs (3 per class).
      x0 = jax.numpy.asarray(np.random.RandomState(1).rand(5, 3, 4), jax.numpy.float32)
      v0 = jax.numpy.asarray(np.random.RandomState(2).rand(5, 3) > 0.3)
      program = SyntheticDistillation(epochs=2, batch_size=4, lr=0.01, reg=1e-6, bn_mode='eval',
                                      augment=None, chunk=20, value_range=(-1.0, 1.0))
      xb, dd_loss, _ = fed.run(
          program, st, root, 1, 'distill', active=active,
          data=Rows({}, data.client_idx, data.client_n), row={'x': x0, 'valid': v0},
          shared={'y_b': jax.numpy.eye(3), 'x': data.x_private, 'y': data.y_private},
          fill=(x0, jax.numpy.full((5,), np.nan), jax.numpy.zeros((5,), jax.numpy.int32))).out
      outs.append((np.asarray(fed.predict(st, data.x_public)), acc, np.asarray(xb), dd_loss))
      if use_mesh:
        s = st[0].params['Dense_0']['kernel'].sharding
        print('slots sharded over', len(fed.mesh.devices.flat), 'devices;', s)
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[0][1], outs[1][1])
    np.testing.assert_allclose(outs[0][2], outs[1][2], rtol=1e-5, atol=1e-6)
    # The KRR loss solves a ridge system with reg=1e-6, which amplifies rounding: its spread
    # between XLA builds (device counts, instruction sets) is measured at up to 3e-5 relative
    # (docs/testing.md), so it is held to the golden test's 1e-4.
    np.testing.assert_allclose(outs[0][3], outs[1][3], rtol=1e-4)
    assert not np.allclose(outs[0][2][0], np.asarray(x0)[0])   # an active client moved
    np.testing.assert_array_equal(outs[0][2][2], np.asarray(x0)[2])   # inactive: untouched
    print('OK')
''')


@pytest.mark.slow
def test_eight_devices_match_one_device():
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             JAX_PLATFORMS='cpu', PYTHONPATH=repo)
  r = subprocess.run([sys.executable, '-c', SCRIPT], cwd=repo, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout + r.stderr
  assert 'OK' in r.stdout


ACE_SCRIPT = textwrap.dedent('''
    import json, sys, tempfile
    import jax
    from tests.test_acepfl import ace_tiny, run
    rows, _ = run(tempfile.mkdtemp(), ace_tiny(rounds=2, **{'acepfl.aggregation': 'per_cluster'}))
    print(json.dumps({'devices': len(jax.devices()),
                      'acc': [r['test_acc'] for r in rows],
                      'loss': [r['distill_loss'] for r in rows]}))
''')


def _on_eight_and_one_device(script: str) -> list[dict]:
  """Runs ``script`` on 8 forced CPU devices, then on 1; its last stdout line is JSON."""
  import json
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = []
  for flags in ('--xla_force_host_platform_device_count=8', ''):
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS='cpu', PYTHONPATH=repo)
    r = subprocess.run([sys.executable, '-c', script], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out.append(json.loads(r.stdout.strip().splitlines()[-1]))
  assert [o['devices'] for o in out] == [8, 1]
  return out


@pytest.mark.slow
def test_acepfl_on_eight_devices_matches_one_device():
  """ACE-pFL's per-client teachers and past-model arrays sharded with the client axis."""
  out = _on_eight_and_one_device(ACE_SCRIPT)
  for a, b in zip(out[0]['acc'], out[1]['acc']):
    assert abs(a - b) < 1e-6
  for a, b in zip(out[0]['loss'], out[1]['loss']):
    assert abs(a - b) < 1e-4 * max(1.0, abs(b))


FL_SCRIPT = textwrap.dedent('''
    import json, tempfile
    import jax
    from tests.test_fedentopt import fe_tiny, run
    kw = {'selection.stragglers': 0.5, 'selection.dropout': 0.2, 'fedprox.mu': 0.01}
    out = {'devices': len(jax.devices())}
    for algo in ('scaffold', 'fedprox', 'fednova'):
      rows, _ = run(tempfile.mkdtemp(), fe_tiny(algo, rounds=2, **kw))
      out[algo] = [r['test_acc'] for r in rows] + [r['train_loss'] for r in rows]
    print(json.dumps(out))
''')


@pytest.mark.slow
def test_parameter_exchange_with_stragglers_on_eight_devices_matches_one_device():
  """SCAFFOLD's per-client control variates, FedProx's anchor and per-client epoch budgets, sharded."""
  out = _on_eight_and_one_device(FL_SCRIPT)
  for algo in ('scaffold', 'fedprox', 'fednova'):
    for a, b in zip(out[0][algo], out[1][algo]):
      assert abs(a - b) < 1e-4 * max(1.0, abs(b)), (algo, out)


# How far a whole default run may drift between device counts (docs/workdir.md, "Device
# counts"): float32 sums inside XLA's kernels are grouped differently per device layout, so
# round 1's losses differ in the last bits and 30 rounds of training amplify that.
FINAL_TOLERANCE = 0.01     # final server accuracy (the test set has 360 images: 3.6 of them)
ROUND_TOLERANCE = 0.03     # the server accuracy of any round


@pytest.mark.slow
def test_a_full_default_run_on_four_devices_is_within_the_documented_tolerance(tmp_path):
  """`configs/default.py` end to end on 4 forced CPU devices against the archived one-device
  run of the same command (seed 0): identical bytes, round-1 losses equal to float32
  rounding, accuracy within the tolerances above at every round. Two minutes on 2 cores:
  outside CI's time budget, ``FEDJAX_KD_GOLDEN=all`` runs it (the three tests above cover the
  sharded engine in CI)."""
  import json
  if os.environ.get('FEDJAX_KD_GOLDEN') != 'all':
    pytest.skip('outside the CI subset; FEDJAX_KD_GOLDEN=all runs it')
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  from benchmarks.reproduction import archive as archive_lib   # pylint: disable=g-import-not-at-top
  with archive_lib.open_runs(os.path.join(repo, archive_lib.ARCHIVE_DEFAULT)) as tree:
    ref = [json.loads(x) for x in open(os.path.join(tree, 'dsfl_digits', 'runs', 'ds-fl-era',
                                                    'seed0', 'metrics.jsonl'))]
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
             JAX_PLATFORMS='cpu', PYTHONPATH=repo)
  r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', '--config=configs/default.py',
                      f'--workdir={tmp_path}', '--noprogress'], cwd=repo, env=env,
                     capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  read = lambda d: [json.loads(x) for x in open(os.path.join(d, 'metrics.jsonl'))]
  got = read(str(tmp_path))
  assert len(got) == len(ref) == 30
  assert [g['cum_bytes'] for g in got] == [x['cum_bytes'] for x in ref]
  for key in ('train_loss', 'distill_loss', 'test_loss'):
    assert abs(got[0][key] - ref[0][key]) <= 1e-5 * max(1.0, abs(ref[0][key])), key
  worst = max(abs(g['test_acc'] - x['test_acc']) for g, x in zip(got, ref))
  assert worst <= ROUND_TOLERANCE, worst
  assert abs(got[-1]['test_acc'] - ref[-1]['test_acc']) <= FINAL_TOLERANCE


LOOP_SCRIPT = textwrap.dedent('''
    import jax, numpy as np, optax
    assert len(jax.devices()) == 2, jax.devices()
    from fedjax_kd.core.federation import Federation
    from fedjax_kd.data.federated import build_federated_data
    from fedjax_kd.models import registry
    from tests.shared import distill, train
    rs = np.random.RandomState(0)
    x = rs.randint(0, 256, (90, 8, 8, 1)).astype(np.uint8)
    y = rs.randint(0, 10, 90)
    data = build_federated_data(x[:60], y[:60], np.split(np.arange(60), 4), x[60:], x[60:],
                                y[60:], 10)
    cnn = registry.get_model('cnn@0.5', num_classes=10, input_shape=(8, 8, 1))
    fed = Federation(data, ['c'] * 4, {'c': cnn}, {'train': optax.sgd(0.1)})
    st = fed.init(jax.random.PRNGKey(0))
    st, _ = train(fed, st, jax.random.PRNGKey(1), 1, 2, 5)
    p = fed.predict(st, data.x_public)
    st, _ = distill(fed, st, jax.random.PRNGKey(2), 1, data.x_public, p.mean(0), 1, 10)
    fed.evaluate(st)
    print('OK')
''')
COLLECTIVES = ('all-gather', 'all-reduce', 'collective-permute', 'all-to-all', 'reduce-scatter')


def _loop_computations(hlo: str) -> dict[str, str]:
  """The computations of an HLO module that run inside a ``while`` loop (bodies, conditions and
  everything they call), by name -> text."""
  import re
  comps, name = {}, None
  for line in hlo.splitlines():
    m = re.match(r'^(?:ENTRY )?%?([\w.\-]+) .*\{$', line)
    if m and not line.startswith(' '):
      name = m.group(1)
      comps[name] = ''
    elif name is not None:
      comps[name] += line + '\n'
  callee = re.compile(r'(?:body|condition|calls|to_apply)=%?([\w.\-]+)')
  todo = [c for text in comps.values() for c in re.findall(r'body=%?([\w.\-]+)', text)]
  todo += [c for text in comps.values() for c in re.findall(r'condition=%?([\w.\-]+)', text)]
  inside = set()
  while todo:
    c = todo.pop()
    if c in inside or c not in comps:
      continue
    inside.add(c)
    todo.extend(callee.findall(comps[c]))
  return {c: comps[c] for c in inside}


@pytest.mark.slow
def test_no_collective_inside_a_training_or_inference_loop(tmp_path):
  """Every device trains and predicts its own clients: the compiled step loops hold no
  cross-device collective (XLA's propagation alone all-gathered activations and weights at
  every step, which made a two-process run 2.5x slower than one process)."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  dump = tmp_path / 'hlo'
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=repo,
             XLA_FLAGS=f'--xla_force_host_platform_device_count=2 --xla_dump_to={dump} '
                       '--xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*_impl.*',
             FEDJAX_KD_COMPILATION_CACHE='off')
  r = subprocess.run([sys.executable, '-c', LOOP_SCRIPT], cwd=repo, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0 and 'OK' in r.stdout, r.stdout + r.stderr
  checked = 0
  for f in sorted(os.listdir(dump)):
    if not f.endswith('after_optimizations.txt'):
      continue
    kernel = f.split('.')[1]
    if kernel not in ('jit__run_impl', 'jit__predict_impl', 'jit__evaluate_impl'):
      continue
    hlo = (dump / f).read_text()
    assert 'num_partitions=2' in hlo, f   # compiled for the 2-device mesh
    loops = _loop_computations(hlo)
    assert loops, f
    for name, text in loops.items():
      found = [c for c in COLLECTIVES if f' {c}(' in text]
      assert not found, f'{f}: {found} inside loop computation {name}'
    checked += 1
  assert checked >= 3, os.listdir(dump)
