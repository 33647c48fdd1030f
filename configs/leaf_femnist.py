"""FEMNIST from LEAF's JSON files: one client per writer, LEAF's CNN, DS-FL by default.

Make the files with LEAF (https://github.com/TalwalkarLab/leaf, in data/femnist:
`./preprocess.sh -s niid --sf 0.05 -k 0 -t sample`, a 5% sample of the writers), then
give the folder that holds train/ and test/ and the number of writers (a wrong count is
refused with the right one):

  fedjax-kd --config=leaf_femnist --workdir=runs/femnist \
      --config.data.source=femnist:/path/to/leaf/data/femnist/data \
      --config.clients.num_clients=N [--config.algorithm=fedavg]
"""

from fedjax_kd import presets


def get_config():
  return presets.leaf('femnist', 'leaf/data/femnist/data', num_clients=180)
