"""Single client (no collaboration) on digits: the lower reference.

  python -m fedjax_kd.main --config=configs/digits_single.py --workdir=runs/digits_single
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.digits('single')
  return c
