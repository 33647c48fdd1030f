"""Embedded default: DS-FL with ERA on scikit-learn digits (no download).

10 non-IID clients (2 label-sorted shards each, so mostly 2 classes per
client) with two model widths (cnn@0.5 and cnn@1.0, round-robin), 400 digits
as the unlabelled open set, the remaining ~1,040 as private data, and the
fixed 360-image digits test split; T = 0.1, 30 rounds.

  python -m fedjax_kd.main --config=configs/default.py --workdir=runs/default
"""

from fedjax_kd import presets


def get_config():
  c = presets.digits('dsfl')
  return c
