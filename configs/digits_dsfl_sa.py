"""DS-FL with simple averaging (SA) on digits: the ERA ablation.

  python -m fedjax_kd.main --config=configs/digits_dsfl_sa.py --workdir=runs/digits_dsfl_sa
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.digits('dsfl')
  c.dsfl.aggregation = 'sa'
  return c
