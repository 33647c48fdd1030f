"""Embedded default: DS-FL with ERA on scikit-learn digits (no download, about a minute).

10 non-IID clients (3 label-sorted shards each, so mostly 3 classes per client) with two
model widths (cnn@0.5 and cnn@1.0, round-robin), 400 digits as the unlabelled open set, the
remaining ~1,040 as private data, and the fixed 360-image digits test split; 2 local epochs,
T = 0.1, 30 rounds. Why 3 shards and 2 epochs: `fedjax_kd.config.presets.digits`.

  python -m fedjax_kd.main --config=configs/default.py --workdir=runs/default
"""

from fedjax_kd.config import presets


def get_config():
  return presets.digits('dsfl')
