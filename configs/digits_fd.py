"""FD (Jeong et al., per-label average outputs) on digits: DS-FL Benchmark 2.

  python -m fedjax_kd.main --config=configs/digits_fd.py --workdir=runs/digits_fd
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.digits('fd')
  return c
