"""FedEntOpt, the paper's CIFAR-10 setting (Table I): LeNet-5, 100 clients, 500 rounds.

The optional argument is ``SETTING[,ALGORITHM[,SELECTION]]``:
  SETTING    dir0.1 (default) | dir0.2 | c2 | c3   (#C=3 runs at 4 % participation)
  ALGORITHM  fedavg (default) | fedprox | scaffold | fednova  (or any FD algorithm)
  SELECTION  fedentopt (default) | fedentopt_dp (epsilon 0.5) | uniform | power_of_choice

Needs CIFAR-10 (tfds, or --config.data.source=npz:/path/cifar10.npz); an accelerator
makes the 500 rounds quick. VGG-11 (Table IV): --config.clients.models="('vgg11',)"
--config.server.model=vgg11 --config.train.weight_decay=1e-3.

  python -m fedjax_kd.main --config=configs/fedentopt_cifar10.py:c2,fedavg,uniform \
      --workdir=runs/fe_c10_c2_random
Dropout (Table III): --config.selection.dropout=0.3; stragglers: --config.selection.stragglers=0.5
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'dir0.1'):
  parts = [p.strip() for p in (arg or 'dir0.1').split(',')]
  setting = parts[0] or 'dir0.1'
  algorithm = parts[1] if len(parts) > 1 else 'fedavg'
  selection = parts[2] if len(parts) > 2 else 'fedentopt'
  return presets.fedentopt_paper(setting, 'tfds:cifar10', algorithm, selection)
