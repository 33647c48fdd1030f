"""DS-FL's MNIST setting (paper §4): K=100, 2 shards, dsfl_cnn, T=0.1.

Needs MNIST through tensorflow-datasets (`tfds build mnist`, or point
--config.data.source=npz:/path/mnist.npz at a Keras-layout file).
An accelerator run; 300 rounds (A17).

  python -m fedjax_kd.main --config=configs/dsfl_mnist.py --workdir=runs/dsfl_mnist
"""

from fedjax_kd import presets


def get_config():
  c = presets.dsfl_paper('tfds:mnist', 'dsfl_cnn')
  return c
