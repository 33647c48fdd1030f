"""FedCache 2.0 on CIFAR-10: K=100, FedML Dirichlet alpha, ResNet-L (or S/M/L), 15 rounds.

The paper's main image setting (its Tables IV and V). The
argument after ':' is alpha (0.5 default, or 2.0), optionally followed by
',hetero' for the ResNet-S/M/L mix. An accelerator run; data through
tensorflow-datasets in array_record format, or an npz from
`python -m fedjax_kd.data.convert tfds:cifar10 --out=cifar10.npz` run where TensorFlow is
installed (preparing a tfds data set needs TensorFlow; reading it does not).

  python -m fedjax_kd.main --config=configs/fedcache2_cifar10.py --workdir=runs/fc2_c10
  python -m fedjax_kd.main --config=configs/fedcache2_cifar10.py:2.0,hetero --workdir=runs/fc2_c10_a2h

Ablations: --config.fedcache2.tau=0.3 (Table XII), --config.fedcache2.sampling=repo
(the authors' normalisation), --config.fedcache2.encoding=png (the code's byte count).
"""

from fedjax_kd.config import presets


def get_config(arg: str = '0.5'):
  alpha, _, kind = arg.partition(',')
  if kind not in ('', 'homo', 'hetero'):
    raise ValueError(f"configs/fedcache2_cifar10.py:{arg}: expected 'ALPHA' or "
                     "'ALPHA,hetero' (e.g. 0.5 or 2.0,hetero)")
  return presets.fedcache2_paper(float(alpha), hetero=(kind == 'hetero'))
