"""Shakespeare from LEAF's JSON files: one client per speaking role, next-character LSTM.

Make the files with LEAF (https://github.com/TalwalkarLab/leaf, in data/shakespeare:
`./preprocess.sh -s niid --sf 0.2 -k 0 -t sample -tf 0.8`), then give the folder that holds
train/ and test/ after the ':' (the clients are counted from its training files), optionally
followed by ',ALGORITHM' (e.g. ',fedavg', LEAF's own baseline):

  fedjax-kd --config=leaf_shakespeare:/path/to/leaf/data/shakespeare/data --workdir=runs/shakespeare
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'leaf/data/shakespeare/data'):
  root, _, algorithm = arg.partition(',')
  return presets.leaf('shakespeare', root, algorithm=algorithm or 'dsfl')
