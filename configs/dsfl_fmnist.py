"""DS-FL's Fashion-MNIST setting: K=100, 2 shards, the 2.76M-parameter CNN.

Needs Fashion-MNIST: --config.data.source=npz:/path/fashion_mnist.npz (Keras layout; made
with `python -m fedjax_kd.data.convert tfds:fashion_mnist --out=fashion_mnist.npz` where
TensorFlow is installed), or tfds:fashion_mnist prepared in array_record format.

  python -m fedjax_kd.main --config=configs/dsfl_fmnist.py --workdir=runs/dsfl_fmnist
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.dsfl_paper('tfds:fashion_mnist', 'dsfl_fmnist_cnn')
  return c
