"""Shakespeare from LEAF's JSON files: one client per speaking role, next-character LSTM.

Make the files with LEAF (https://github.com/TalwalkarLab/leaf, in data/shakespeare:
`./preprocess.sh -s niid --sf 0.2 -k 0 -t sample -tf 0.8`), then give the folder that
holds train/ and test/ and the number of speakers (a wrong count is refused with the right
one):

  fedjax-kd --config=leaf_shakespeare --workdir=runs/shakespeare \
      --config.data.source=shakespeare:/path/to/leaf/data/shakespeare/data \
      --config.clients.num_clients=N [--config.algorithm=fedavg]
"""

from fedjax_kd import presets


def get_config():
  return presets.leaf('shakespeare', 'leaf/data/shakespeare/data', num_clients=143)
