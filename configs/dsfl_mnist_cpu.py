"""DS-FL on MNIST at CPU size, on the paper's CNN: 20 clients x 200 private, 15 rounds.

The paper's setting (2 label-sorted shards per client, ERA T=0.1, SGD 0.1, 5+5 epochs in
batches of 100, 1,000 of 20,000 open images a round, `dsfl_cnn` with 583k parameters for
clients and server) with 20 clients instead of 100. The server's curve over three seeds, round
by round, is in docs/reproduction.md (section 1, MNIST); docs/dsfl_mnist.md explains its
shape. Data: tfds:mnist, or --config.data.source=npz:/path/mnist.npz.

  python -m fedjax_kd.main --config=configs/dsfl_mnist_cpu.py --workdir=runs/dsfl_mnist_cpu \
      --config.data.source=npz:/path/to/mnist.npz
"""

from fedjax_kd.config import presets


def get_config():
  return presets.dsfl_paper_cpu('tfds:mnist')
