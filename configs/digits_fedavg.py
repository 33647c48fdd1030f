"""FedAvg (parameter exchange) on digits: DS-FL Benchmark 1.

One architecture (cnn@1.0) for every client: averaging needs it.

  python -m fedjax_kd.main --config=configs/digits_fedavg.py --workdir=runs/digits_fedavg
"""

from fedjax_kd.config import presets


def get_config():
  c = presets.digits('fedavg')
  return c
