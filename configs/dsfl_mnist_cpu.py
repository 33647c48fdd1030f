"""DS-FL on MNIST at CPU size, on the paper's CNN: 20 clients x 200 private, 15 rounds.

The paper's structure (2 label-sorted shards per client, ERA T=0.1, SGD 0.1, 5+5 epochs) and
model (`dsfl_cnn`, 583k parameters, for clients and server), with 500 of 2,000 open images a
round in batches of 50. Data: tfds:mnist, or --config.data.source=npz:/path/mnist.npz.
The server reaches about 0.77 by round 2 and then stays near 0.80, short of the ~0.95 an
independent PyTorch DS-FL reaches by round 16: docs/dsfl_mnist.md has what we measured.

  python -m fedjax_kd.main --config=configs/dsfl_mnist_cpu.py --workdir=runs/dsfl_mnist_cpu \
      --config.data.source=npz:/path/to/mnist.npz
"""

from fedjax_kd import presets


def get_config():
  return presets.dsfl_paper_cpu('tfds:mnist')
