"""Every BatchNorm model predicts as well with its running statistics as with batch statistics.

Federated distillation exchanges inference-mode predictions: clients upload `train=False`
outputs, ERA aggregates them, and the server is scored with `train=False`. A model whose
running statistics lag its weights (the DS-FL CNN with Keras' BatchNorm defaults: momentum
0.99, epsilon 1e-3, Glorot init) predicts one class in inference mode for hundreds of steps
while its batch-statistics accuracy is already high, and DS-FL then stalls. Each model below is
trained with plain SGD: the DS-FL CNN for the 50 steps at a constant rate in which the Keras
reading collapses; the others for 300 steps on the embedded digits with a rate decaying
linearly to 0, so that the weights settle and the running averages (which lag the weights by
~10 steps at momentum 0.9) can catch up; at a constant rate the deeper ResNets still lag by
5-11 points after 100-300 steps. Inference-mode test accuracy must be within 5 points of the
accuracy with batch statistics (the whole test set as one batch).
"""

import jax
import numpy as np
import optax
import pytest

from tests.conftest import mnist_path
from fedjax_kd.data import sources
from fedjax_kd.data.inputs import as_float
from fedjax_kd.models import registry

GAP = 0.05


def _train(spec, x, y, *, steps, lr, batch, seed=0, decay=False, **options):
  """Trains `spec` for `steps` SGD steps on (x, y) (the rate decays linearly to 0 with
  `decay`); returns a function of x giving the predictions with running and batch stats."""
  model = registry.get_model(spec, num_classes=10, input_shape=x.shape[1:], **options)
  v = registry.init_variables(model, jax.random.PRNGKey(seed), x.shape[1:])
  params, stats = v['params'], v['batch_stats']
  tx = optax.sgd(optax.linear_schedule(lr, 0.0, steps) if decay else lr)
  opt = tx.init(params)

  @jax.jit
  def step(params, stats, opt, xb, yb):
    def loss(p):
      logits, upd = model.apply({'params': p, 'batch_stats': stats}, xb, train=True,
                                mutable=['batch_stats'])
      return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), upd

    (_, upd), g = jax.value_and_grad(loss, has_aux=True)(params)
    u, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, u), upd['batch_stats'], opt

  order = np.random.default_rng(seed).permutation(np.resize(np.arange(len(y)), steps * batch))
  for t in range(steps):
    j = order[t * batch:(t + 1) * batch]
    params, stats, opt = step(params, stats, opt, x[j], y[j])

  @jax.jit
  def predict(x):
    """Class predictions with the running statistics and with the batch's own."""
    v = {'params': params, 'batch_stats': stats}
    running = model.apply(v, x, train=False)
    batch, _ = model.apply(v, x, train=True, mutable=['batch_stats'])
    return running.argmax(-1), batch.argmax(-1)

  return predict


def _accuracies(predict, x, y):
  running, batch = predict(x)
  return float(np.mean(np.asarray(running) == y)), float(np.mean(np.asarray(batch) == y))


def _mnist_iid(n):
  path = mnist_path()
  if not path.exists():
    pytest.skip(f'{path} is absent (real MNIST for this test)')
  d = sources.load_source(f'npz:{path}')
  idx = np.random.default_rng(0).choice(len(d.y_train), n, replace=False)
  return (as_float(d.x_train[idx]), d.y_train[idx], as_float(d.x_test[:2000]),
          d.y_test[:2000])


@pytest.mark.slow
def test_dsfl_cnn_inference_mode_on_mnist():
  """The issue's setting: 50 steps of batch 100 on 1,000 IID MNIST images, SGD 0.1."""
  x, y, xt, yt = _mnist_iid(1000)
  running, batch = _accuracies(_train('dsfl_cnn', x, y, steps=50, lr=0.1, batch=100), xt, yt)
  assert batch > 0.85, batch
  assert running >= batch - GAP, (running, batch)
  # Keras' defaults, the other reading of the paper: the running statistics have not caught
  # up, and the inference-mode model is far worse (0.20 vs 0.92 when measured).
  keras = _train('dsfl_cnn', x, y, steps=50, lr=0.1, batch=100, init='keras', bn_momentum=0.99,
                 bn_epsilon=1e-3)
  k_running, k_batch = _accuracies(keras, xt, yt)
  assert k_batch > 0.85 and k_running < k_batch - 0.3, (k_running, k_batch)


def _digits(side):
  d = sources.load_source('digits')
  f = side // 8
  up = lambda a: np.kron(a, np.ones((1, f, f, 1), np.float32))
  return up(d.x_train), d.y_train, up(d.x_test), d.y_test


# (model, image side): every BatchNorm module of the registry, at a small width; the image side
# is at least what the model needs (dsfl_cnn: 16). resnet32 and resnet_s/m/l are the modules of
# resnet20 and resnet_t with more blocks per stage (SAME_MODULE); they pass too (resnet32
# 0.919/0.919, resnet_m 0.911/0.911, resnet_l 0.931/0.931 running/batch when measured) but
# are left out to keep the suite's time.
BN_MODELS = [('dsfl_cnn@0.5', 16), ('dsfl_fmnist_cnn@0.25', 16), ('resnet20@0.5', 16),
             ('resnet_t@0.5', 16), ('googlenet@0.125', 16), ('vgg16@0.125', 16),
             ('resnet34@0.125', 16), ('resnet50@0.125', 16),
             ('text_dnn@0.125', 8)]   # DS-FL's Reuters perceptron flattens any input
SAME_MODULE = {'resnet32': 'resnet20', 'resnet_s': 'resnet_t', 'resnet_m': 'resnet_t',
               'resnet_l': 'resnet_t'}


def test_bn_models_cover_registry():
  tested = {s.split('@')[0] for s, _ in BN_MODELS}
  entries = [registry.entry(n) for n in registry.available()]
  assert tested | set(SAME_MODULE) == {e.name for e in entries if e.builtin and e.batch_norm}
  assert set(SAME_MODULE.values()) <= tested


@pytest.mark.parametrize('spec,side', BN_MODELS)
@pytest.mark.slow
def test_bn_model_inference_mode_on_digits(spec, side):
  x, y, xt, yt = _digits(side)
  # XLA's convolution: the same function as the CPU default (im2col), compiled faster; the
  # BatchNorm behaviour under test does not depend on the lowering.
  running, batch = _accuracies(
      _train(spec, x, y, steps=300, lr=0.05, batch=32, decay=True, lowering='xla'), xt, yt)
  assert batch > 0.5, batch
  assert running >= batch - GAP, (running, batch)
