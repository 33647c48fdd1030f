"""FedEntOpt at CPU size on the embedded digits: 100 clients, 10 selected a round.

Argument ``SETTING[,ALGORITHM[,SELECTION]]`` as in fedentopt_cifar10.py (default
c2,fedavg,fedentopt). About a minute on 2 cores.

  python -m fedjax_kd.main --config=configs/fedentopt_digits.py --workdir=runs/fe_digits
  python -m fedjax_kd.main --config=configs/fedentopt_digits.py:c2,fedavg,uniform \
      --workdir=runs/fe_digits_random

FedEntOpt beside its baselines of Tables I and II (the label-skew methods with random
selection, FedRS and FedLC also with FedEntOpt's, and the KL selector) in one sweep:

  python -m fedjax_kd.sweep --config=configs/fedentopt_digits.py:c2,fedavg,uniform \
      --algorithms=fedavg,fedprox,scaffold,fednova,fedrs,fedlc,fedconcat \
      --variant 'FedEntOpt=fedavg;selection.method="fedentopt"' \
      --variant 'FedRS + FedEntOpt=fedrs;selection.method="fedentopt"' \
      --variant 'FedLC + FedEntOpt=fedlc;selection.method="fedentopt"' \
      --variant 'KL=fedavg;selection.method="kl"' --seeds=0,1,2 --out=runs/fe_baselines --jobs=2
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'c2'):
  parts = [p.strip() for p in (arg or 'c2').split(',')]
  return presets.fedentopt_cpu(parts[0] or 'c2', 'digits',
                               parts[1] if len(parts) > 1 else 'fedavg',
                               parts[2] if len(parts) > 2 else 'fedentopt')
