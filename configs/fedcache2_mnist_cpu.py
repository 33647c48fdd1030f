"""FedCache 2.0 on MNIST, CPU-sized: 20 clients x ~300 images, Dirichlet alpha 0.5.

Data: tfds:mnist, or --config.data.source=npz:/path/mnist.npz (Keras layout).

  python -m fedjax_kd.main --config=configs/fedcache2_mnist_cpu.py --workdir=runs/fc2_mnist
"""

from fedjax_kd.config import presets


def get_config():
  return presets.fedcache2_cpu('tfds:mnist')
