"""FedCache 2.0 on the embedded digits: 10 clients, Dirichlet alpha 0.5, two CNN widths.

``:scarce`` is the setting where collaboration matters (``presets.fedcache2_scarce_cpu``):
10 clients x ~20 digits, Dirichlet 2.0, three CNN widths (ResNet-S/M/L's stand-ins).

``:baselines`` is the scarce setting on one architecture (the largest CNN for every client), so
FedCache 2.0 and its five baselines (Table IV) run in one sweep at the same rounds and epochs:

  python -m fedjax_kd.sweep --config=configs/fedcache2_digits.py:baselines \
      --algorithms=fedcache2,mtfl,knn_per,scdpfl,fedkd,fedcache --seeds=0,1,2 \
      --out=runs/fc2_baselines --jobs=2

Runs in about a minute on a 2-core CPU, no download (docs/configs.md has the sweep's cost).

  python -m fedjax_kd.main --config=configs/fedcache2_digits.py --workdir=runs/fc2_digits
  python -m fedjax_kd.main --config=configs/fedcache2_digits.py:scarce --workdir=runs/fc2_scarce
"""

from fedjax_kd.config import presets


def get_config(setting: str = ''):
  if setting in ('scarce', 'baselines'):
    c = presets.fedcache2_scarce_cpu('digits')
    if setting == 'baselines':   # parameter exchange (MTFL, kNN-Per, SCDPFL): one model spec
      c.clients.models = [presets.FEDCACHE2_SCARCE_MODELS[-1]]
      c.server.model = presets.FEDCACHE2_SCARCE_MODELS[-1]
      c.data.val_fraction = 0.1   # kNN-Per tunes its lambda on held-out rows; all hold them out
    return c
  if setting:
    raise ValueError(f"configs/fedcache2_digits.py:{setting}: expected no argument, ':scarce' "
                     "or ':baselines'")
  return presets.fedcache2_cpu('digits')
