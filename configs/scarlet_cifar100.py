"""SCARLET on CIFAR-100 (private) with Tiny ImageNet (public), ResNet-32, K=100.

The paper's setting: alpha=0.05, beta=1.25, D=50, 3000 rounds; DS-FL's T=0.01.
CIFAR-100 comes from tensorflow-datasets. Tiny ImageNet is not in the TFDS
catalog: give its training images downscaled to 32x32 as a Keras-layout npz
(``x_train`` uint8 [100000, 32, 32, 3], ``y_train``; labels are never used)
at ./tiny_imagenet_32.npz or pass --config.data.public_source=npz:/path/file.npz
(or any other public set, e.g. tfds:imagenet_resized/32x32). An accelerator run.

  python -m fedjax_kd.main --config=configs/scarlet_cifar100.py --workdir=runs/scarlet_c100
"""

from fedjax_kd.config import presets


def get_config(alpha: str = '0.05'):
  return presets.scarlet_paper('cifar100', float(alpha))
