"""The client axis sharded over 8 (forced CPU) devices gives the one-device results."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import jax, numpy as np, optax
    assert len(jax.devices()) == 8, jax.devices()
    from tests.test_engine import TinyMLP, make_data
    from fedjax_kd.core.federation import Federation
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
      st, _ = fed.train_private(st, root, 1, epochs=2, batch_size=4, active=active)
      p = fed.predict(st, data.x_public)
      st, _ = fed.distill(st, root, 1, data.x_public, p.mean(0), epochs=1, batch_size=10)
      acc, _ = fed.evaluate(st)
      outs.append((np.asarray(fed.predict(st, data.x_public)), acc))
      if use_mesh:
        s = st[0].params['Dense_0']['kernel'].sharding
        print('slots sharded over', len(fed.mesh.devices.flat), 'devices;', s)
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[0][1], outs[1][1])
    print('OK')
''')


def test_eight_devices_match_one_device():
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             JAX_PLATFORMS='cpu', PYTHONPATH=repo)
  r = subprocess.run([sys.executable, '-c', SCRIPT], cwd=repo, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout + r.stderr
  assert 'OK' in r.stdout
