"""FedEntOpt on CIFAR-100 with its 20 superclasses (Table I): LeNet-5, 100 clients.

Argument as in fedentopt_cifar10.py: ``SETTING[,ALGORITHM[,SELECTION]]``; #C=3 runs
at 8 % participation here. The labels are tfds's 'coarse_label' feature.

  python -m fedjax_kd.main --config=configs/fedentopt_cifar100.py:dir0.1 --workdir=runs/fe_c100
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'dir0.1'):
  parts = [p.strip() for p in (arg or 'dir0.1').split(',')]
  setting = parts[0] or 'dir0.1'
  c = presets.fedentopt_paper(setting, 'tfds:cifar100',
                              parts[1] if len(parts) > 1 else 'fedavg',
                              parts[2] if len(parts) > 2 else 'fedentopt')
  c.data.label_key = 'coarse_label'
  if setting == 'c3':
    c.clients.participation = 0.08
  return c
