"""ACE-pFL on MNIST, CPU-sized: 20 clients x ~270 images, Dirichlet 0.1, D0 = 600.

Data: tfds:mnist, or --config.data.source=npz:/path/mnist.npz (Keras layout).

  python -m fedjax_kd.main --config=configs/acepfl_mnist_cpu.py --workdir=runs/ace_mnist
"""

from fedjax_kd import presets


def get_config():
  return presets.acepfl_cpu('tfds:mnist')
