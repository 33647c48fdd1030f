"""Embedded default: DS-FL with ERA on scikit-learn's digits (no download).

10 non-IID clients (2 label-sorted shards each, so mostly 2 classes per
client) with two model widths (cnn@0.5 and cnn@1.0, round-robin), 400 digits
as the unlabelled open set, the remaining ~1,040 as private data, and the
fixed 360-image digits test split. Finishes in about a minute on a 2-core CPU.

  python -m fedjax_kd.main --config=configs/default.py --workdir=runs/default
"""

from fedjax_kd.config import default_config


def get_config():
  c = default_config()
  c.algorithm = 'dsfl'
  c.rounds = 30
  c.data.source = 'digits'
  c.data.num_public = 400
  c.data.partition = 'shards'
  c.data.shards_per_client = 2
  c.clients.num_clients = 10
  c.clients.models = ['cnn@0.5', 'cnn@1.0']
  c.server.model = 'cnn@1.0'
  c.train.optimizer = 'sgd'
  c.train.learning_rate = 0.1
  c.train.batch_size = 20
  c.train.epochs = 5
  c.distill.batch_size = 50
  c.distill.epochs = 5
  c.distill.public_per_round = 300
  c.dsfl.aggregation = 'era'
  c.dsfl.temperature = 0.1
  c.comm.thresholds = [0.8, 0.9]
  return c
