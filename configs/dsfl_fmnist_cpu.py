"""DS-FL on Fashion-MNIST, CPU-sized: 20 clients x 200 private, 15 rounds.

Data: tfds:fashion_mnist, or --config.data.source=npz:/path/fmnist.npz.

  python -m fedjax_kd.main --config=configs/dsfl_fmnist_cpu.py --workdir=runs/dsfl_fmnist_cpu
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.dsfl_paper_cpu('tfds:fashion_mnist', 'dsfl_fmnist_cnn@1.0')
  return c
