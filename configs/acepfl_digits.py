"""ACE-pFL on the embedded digits: 10 clients (two CNN widths and an MLP), Dirichlet 0.1.

Runs in about a minute on a 2-core CPU, no download.

  python -m fedjax_kd.main --config=configs/acepfl_digits.py --workdir=runs/ace_digits
"""

from fedjax_kd import presets


def get_config():
  return presets.acepfl_cpu('digits')
