"""FedCache 2.0 on the embedded digits: 10 clients, Dirichlet alpha 0.5, two CNN widths.

Runs in about a minute on a 2-core CPU, no download.

  python -m fedjax_kd.main --config=configs/fedcache2_digits.py --workdir=runs/fc2_digits
"""

from fedjax_kd import presets


def get_config():
  return presets.fedcache2_cpu('digits')
