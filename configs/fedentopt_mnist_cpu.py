"""FedEntOpt at CPU size on MNIST: LeNet-5, 100 clients x 200 images, 10 % a round.

Argument ``SETTING[,ALGORITHM[,SELECTION]]`` as in fedentopt_cifar10.py (default
dir0.1,fedavg,fedentopt). Needs MNIST: tfds, or an npz in Keras layout, e.g.

  python -m fedjax_kd.main --config=configs/fedentopt_mnist_cpu.py:c2 \
      --config.data.source=npz:/path/mnist.npz --workdir=runs/fe_mnist_c2
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'dir0.1'):
  parts = [p.strip() for p in (arg or 'dir0.1').split(',')]
  return presets.fedentopt_cpu(parts[0] or 'dir0.1', 'tfds:mnist',
                               parts[1] if len(parts) > 1 else 'fedavg',
                               parts[2] if len(parts) > 2 else 'fedentopt')
