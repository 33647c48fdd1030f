"""Hand-computed checks of FD's teachers (eqs. 5-6) and FedAvg's average (eq. 3)."""

import jax.numpy as jnp
import numpy as np

from fedjax_kd.algorithms.fd import fd_teachers
from fedjax_kd.algorithms.fedavg import broadcast
from fedjax_kd.ops.param_aggregate import weighted_average
from fedjax_kd.core.state import ModelState


def test_fd_teachers_exclude_own_contribution():
  # K=3 clients, C=2 classes. Client 2 has no class-1 samples; client 0 is inactive below.
  means = jnp.asarray([[[0.9, 0.1], [0.3, 0.7]],
                       [[0.7, 0.3], [0.1, 0.9]],
                       [[0.8, 0.2], [0.0, 0.0]]])
  counts = jnp.asarray([[5, 5], [3, 2], [4, 0]], jnp.float32)
  glob, teacher, weight = fd_teachers(means, counts, jnp.asarray([True, True, True]))
  # class 0: |K_0| = 3, mean = (0.9+0.7+0.8)/3 = 0.8 ; class 1: |K_1| = 2, mean = (0.3+0.1)/2 = 0.2
  np.testing.assert_allclose(glob, [[0.8, 0.2], [0.2, 0.8]], atol=1e-6)
  # teacher of client 0 for class 0: (3*0.8 - 0.9)/2 = 0.75 ; class 1: (2*0.2 - 0.3)/1 = 0.1
  np.testing.assert_allclose(teacher[0], [[0.75, 0.25], [0.1, 0.9]], atol=1e-6)
  np.testing.assert_allclose(teacher[1, 1], [0.3, 0.7], atol=1e-6)   # = client 0's own
  np.testing.assert_array_equal(weight, [[1, 1], [1, 1], [1, 0]])    # client 2 lacks class 1


def test_fd_teacher_dropped_when_class_held_by_one_client():
  means = jnp.asarray([[[0.6, 0.4], [0.5, 0.5]], [[0.9, 0.1], [0.2, 0.8]]])
  counts = jnp.asarray([[1, 0], [1, 3]], jnp.float32)
  _, teacher, weight = fd_teachers(means, counts, jnp.asarray([True, True]))
  # |K_1| = 1: no teacher (eq. 6 would divide by |K_1| - 1 = 0).
  np.testing.assert_array_equal(weight, [[1, 0], [1, 0]])
  np.testing.assert_allclose(teacher[0, 0], [0.9, 0.1], atol=1e-6)
  # An inactive client contributes nothing.
  _, _, weight = fd_teachers(means, counts, jnp.asarray([False, True]))
  np.testing.assert_array_equal(weight, [[0, 0], [0, 0]])


def test_fedavg_weighted_average_and_broadcast():
  cohort = ModelState(params={'w': jnp.asarray([[1.0, 2.0], [3.0, 6.0], [9.0, 9.0]])},
                      batch_stats={'m': jnp.asarray([[0.0], [4.0], [8.0]])}, opt_state={})
  server = ModelState(params={'w': jnp.zeros((1, 2))}, batch_stats={'m': jnp.zeros((1, 1))},
                      opt_state={})
  # I_k = 100, 300 and an inactive client (weight 0): (1*100 + 3*300)/400 = 2.5
  w = jnp.asarray([100.0, 300.0, 0.0])
  out = server.replace(params=weighted_average(cohort.params, w),
                       batch_stats=weighted_average(cohort.batch_stats, w))
  np.testing.assert_allclose(out.params['w'], [[2.5, 5.0]])
  np.testing.assert_allclose(out.batch_stats['m'], [[3.0]])
  b = broadcast(cohort, out, jnp.asarray([True, False, True]))
  np.testing.assert_allclose(b.params['w'], [[2.5, 5.0], [3.0, 6.0], [2.5, 5.0]])
  np.testing.assert_allclose(b.batch_stats['m'], [[3.0], [4.0], [3.0]])


def _diag_owner(y_public, public_source='', num_public_noise=0):
  import types
  return types.SimpleNamespace(
      ctx=types.SimpleNamespace(data=types.SimpleNamespace(y_public=np.asarray(y_public))),
      spec=types.SimpleNamespace(data=types.SimpleNamespace(
          public_source=public_source, num_public_noise=num_public_noise)))


def test_label_diagnostics_by_hand():
  from fedjax_kd.algorithms.protocol import Protocol
  # Open set labels 0..4; the round draws samples 3, 1, 4 (true classes 1, 0, 2).
  owner = _diag_owner([2, 0, 1, 1, 2])
  idx = jnp.asarray([3, 1, 4])
  zhat = jnp.asarray([[0.1, 0.8, 0.1],    # argmax 1: right
                      [0.2, 0.7, 0.1],    # argmax 1: wrong (true 0)
                      [0.6, 0.1, 0.3]])   # argmax 0: wrong, but unlabelled (use False)
  use = jnp.asarray([True, True, False])
  # Two clients; client 1 did not upload sample 2.
  probs = jnp.asarray([[[0, 1, 0], [1, 0, 0], [0, 0, 1]],     # right, right, right
                       [[1, 0, 0], [1, 0, 0], [0, 0, 0]]], jnp.float32)  # wrong, right, -
  mask = jnp.asarray([[True, True, True], [True, True, False]])
  out = Protocol.label_diagnostics(owner, idx, zhat, use, probs, mask)
  assert np.isclose(out['label_acc'], 1 / 2)       # 1 right of the 2 labelled samples
  assert np.isclose(out['upload_acc'], 4 / 5)      # 4 right of the 5 uploads


def test_label_diagnostics_leave_out_open_set_noise_rows():
  from fedjax_kd.algorithms.protocol import Protocol
  # Sample 4 is an added noise row (label -1): it is neither right nor wrong.
  owner = _diag_owner([2, 0, 1, 1, -1], num_public_noise=1)
  idx = jnp.asarray([3, 1, 4])
  zhat = jnp.asarray([[0.1, 0.8, 0.1], [0.2, 0.7, 0.1], [0.6, 0.1, 0.3]])
  use = jnp.asarray([True, True, True])
  probs = jnp.asarray([[[0, 1, 0], [1, 0, 0], [0, 0, 1]],
                       [[1, 0, 0], [1, 0, 0], [0, 0, 1]]], jnp.float32)
  mask = jnp.ones((2, 3), bool)
  out = Protocol.label_diagnostics(owner, idx, zhat, use, probs, mask)
  assert np.isclose(out['label_acc'], 1 / 2)       # samples 3 (right) and 1 (wrong)
  assert np.isclose(out['upload_acc'], 3 / 4)      # of the 4 uploads of samples 3 and 1


def test_label_diagnostics_skip_foreign_public_set():
  from fedjax_kd.algorithms.protocol import Protocol
  owner = _diag_owner([0, 1], public_source='tfds:cifar100')   # another data set's classes
  out = Protocol.label_diagnostics(owner, jnp.asarray([0]), jnp.ones((1, 2)),
                                   jnp.ones(1, bool), jnp.ones((1, 1, 2)), jnp.ones((1, 1), bool))
  assert out == {}
