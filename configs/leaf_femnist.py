"""FEMNIST from LEAF's JSON files: one client per writer, LEAF's CNN, DS-FL by default.

Make the files with LEAF (https://github.com/TalwalkarLab/leaf, in data/femnist:
`./preprocess.sh -s niid --sf 0.05 -k 0 -t sample`, a 5% sample of the writers), then give
the folder that holds train/ and test/ after the ':' (the clients are counted from its
training files), optionally followed by ',ALGORITHM' (e.g. ',fedavg', LEAF's own baseline):

  fedjax-kd --config=leaf_femnist:/path/to/leaf/data/femnist/data --workdir=runs/femnist
  fedjax-kd --config=leaf_femnist:/path/to/leaf/data/femnist/data,fedavg --workdir=runs/femnist_fedavg
"""

from fedjax_kd.config import presets


def get_config(arg: str = 'leaf/data/femnist/data'):
  root, _, algorithm = arg.partition(',')
  return presets.leaf('femnist', root, algorithm=algorithm or 'dsfl')
