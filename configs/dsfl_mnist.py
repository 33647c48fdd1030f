"""DS-FL's MNIST setting (paper §4.1): K=100, 2 shards, dsfl_cnn, T=0.1.

Needs MNIST: a Keras-layout file (--config.data.source=npz:/path/mnist.npz, e.g. Keras'
own mnist.npz), or tfds:mnist prepared in array_record format where TensorFlow is installed
(`tfds build mnist --file_format=array_record`).
An accelerator run; 300 rounds (the paper gives no count; SA needs about 200 to reach 97%).

  python -m fedjax_kd.main --config=configs/dsfl_mnist.py --workdir=runs/dsfl_mnist
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.dsfl_paper('tfds:mnist', 'dsfl_cnn')
  return c
