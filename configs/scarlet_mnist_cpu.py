"""SCARLET on MNIST, CPU-sized: 10 clients x 200 private, |P|=3000, |P^t|=300, D=20.

The public set is carved from MNIST's training split (SCARLET's paper uses a
different data set; at this size the point is the cache dynamics and cost).
Client Dirichlet alpha=0.05, beta=2, 30 rounds, small CNN. Data: tfds:mnist, or
--config.data.source=npz:/path/mnist.npz.

  python -m fedjax_kd.main --config=configs/scarlet_mnist_cpu.py --workdir=runs/scarlet_mnist
"""

from fedjax_kd.config import presets


def get_config():
  return presets.scarlet_cpu('tfds:mnist')
