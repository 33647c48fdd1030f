"""SCARLET on the embedded digits data: runs anywhere in about a minute.

10 clients, client Dirichlet alpha=0.05, |P|=500, |P^t|=100, D=10, beta=2,
the authors' byte accounting. Compare with DS-FL on the same seed:
  python benchmarks/compare_algorithms.py --preset=scarlet_digits

  python -m fedjax_kd.main --config=configs/scarlet_digits.py --workdir=runs/scarlet_digits
"""

from fedjax_kd import presets


def get_config():
  return presets.scarlet_cpu('digits')
