"""ACE-pFL on MNIST, CPU-sized: 20 clients x ~270 images, Dirichlet 0.1, D0 = 600.

``:scarce`` is the setting where collaboration matters (``presets.acepfl_scarce_cpu``):
20 clients x ~50 images, Dirichlet 1.0, 5 local epochs, 21 rounds.

Data: tfds:mnist, or --config.data.source=npz:/path/mnist.npz (Keras layout).

  python -m fedjax_kd.main --config=configs/acepfl_mnist_cpu.py --workdir=runs/ace_mnist
  python -m fedjax_kd.main --config=configs/acepfl_mnist_cpu.py:scarce --workdir=runs/ace_scarce
"""

from fedjax_kd.config import presets


def get_config(setting: str = ''):
  if setting == 'scarce':
    return presets.acepfl_scarce_cpu('tfds:mnist')
  if setting:
    raise ValueError(f"configs/acepfl_mnist_cpu.py:{setting}: expected no argument or ':scarce'")
  return presets.acepfl_cpu('tfds:mnist')
