"""Settings shared by several config files (so configs stay a few lines each)."""

from __future__ import annotations

import ml_collections

from fedjax_kd.config import default_config


def digits(algorithm: str = 'dsfl') -> ml_collections.ConfigDict:
  """The embedded default: sklearn digits, 10 non-IID clients, two widths."""
  c = default_config()
  c.algorithm = algorithm
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
  if algorithm == 'fedavg':
    c.clients.models = ['cnn@1.0']   # parameter averaging needs one architecture
  return c


def dsfl_paper(source: str, model: str) -> ml_collections.ConfigDict:
  """DS-FL's image setting (spec dsfl.md §3-4): K=100, 2 shards, I^p=20k, I^o=20k."""
  c = default_config()
  c.algorithm = 'dsfl'
  c.rounds = 300                      # A17: SA needs ~200 rounds to reach 97%
  c.data.source = source
  c.data.num_public = 20_000
  c.data.num_private = 20_000
  c.data.partition = 'shards'
  c.data.shards_per_client = 2
  c.clients.num_clients = 100
  c.clients.models = [model]
  c.server.model = model
  c.train.optimizer = 'sgd'
  c.train.learning_rate = 0.1
  c.train.batch_size = 100
  c.train.epochs = 5
  c.distill.batch_size = 100
  c.distill.epochs = 5
  c.distill.public_per_round = 1000
  c.dsfl.aggregation = 'era'
  c.dsfl.temperature = 0.1
  c.comm.thresholds = [0.65, 0.75, 0.95, 0.97]
  c.eval.clients = False              # w_g is the evaluated model; skip 100 client evals
  c.checkpoint.every = 10
  return c


def dsfl_paper_cpu(source: str) -> ml_collections.ConfigDict:
  """A CPU-sized DS-FL run with the paper's structure (minutes on 2 cores)."""
  c = dsfl_paper(source, 'cnn@1.0')
  c.rounds = 15
  c.data.num_public = 2_000
  c.data.num_private = 4_000
  c.clients.num_clients = 20          # 200 private samples per client, as in the paper
  c.clients.models = ['cnn@0.5', 'cnn@1.0']
  c.distill.public_per_round = 500
  c.distill.batch_size = 50
  c.train.batch_size = 50
  c.comm.thresholds = [0.65, 0.75, 0.9]
  c.eval.clients = True
  c.checkpoint.every = 5
  return c
