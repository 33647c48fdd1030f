"""SCARLET on the embedded digits data: runs anywhere in about a minute.

10 clients, client Dirichlet alpha=0.05, |P|=500, |P^t|=100, D=10, beta=2,
the authors' byte accounting. Compare with DS-FL over three seeds:
  python -m fedjax_kd.sweep --config=configs/scarlet_digits.py --algorithms=scarlet,dsfl \
      --metrics=hit_ratio --out=runs/scarlet_vs_dsfl

  python -m fedjax_kd.main --config=configs/scarlet_digits.py --workdir=runs/scarlet_digits
"""

from fedjax_kd.config import presets


def get_config():
  return presets.scarlet_cpu('digits')
