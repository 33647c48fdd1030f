"""DS-FL on MNIST, CPU-sized: 20 clients x 200 private, 2k open, 15 rounds.

Same structure as dsfl_mnist.py (2 shards per client, ERA T=0.1, SGD 0.1,
5+5 epochs) with the small CNN at two widths. Finishes in minutes on 2 cores.
Data: tfds:mnist, or --config.data.source=npz:/path/mnist.npz.

  python -m fedjax_kd.main --config=configs/dsfl_mnist_cpu.py --workdir=runs/dsfl_mnist_cpu
"""

from fedjax_kd import presets


def get_config():
  c = presets.dsfl_paper_cpu('tfds:mnist')
  return c
