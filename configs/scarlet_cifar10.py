"""SCARLET on CIFAR-10 (private) with CIFAR-100 (public), ResNet-20, K=100.

The paper's main setting (its Tables II, III and V): client Dirichlet alpha, |P|=10k,
|P^t|=1k, D=50, 5+5 epochs, SGD 0.1, batch 100, flip/crop augmentation. The
argument after ':' is alpha: 0.05 (default; beta=2.0, 2000 rounds) or 0.3
(beta=1.0, 3000 rounds). An accelerator run; data through tensorflow-datasets in
array_record format (prepared where TensorFlow is installed: `tfds build cifar10 cifar100
--file_format=array_record`), or npz files from `python -m fedjax_kd.data.convert`.

  python -m fedjax_kd.main --config=configs/scarlet_cifar10.py --workdir=runs/scarlet_c10
  python -m fedjax_kd.main --config=configs/scarlet_cifar10.py:0.3 --workdir=runs/scarlet_c10_a03

The baselines on the same data (Table V settings are in the preset):
  --config.algorithm=dsfl | cfd | comet | selective_fd | individual | centralized
and with the cache added (Fig. 9): --config.cache.mode=on --config.cache.duration=25.
"""

from fedjax_kd.config import presets


def get_config(alpha: str = '0.05'):
  return presets.scarlet_paper('cifar10', float(alpha))
