"""Single client: local training only, no collaboration.

The "Single Client" reference of DS-FL (Itahara et al., IEEE TMC 2021, Table 3
footnote) and SCARLET's "Individual" baseline: each client trains on
its own private data for the same number of rounds x epochs; the reported
accuracy is the mean over clients (there is no server model).
"""

from __future__ import annotations

from fedjax_kd.algorithms import base


class Single(base.Algorithm):
  name = 'single'
  uses_public = False

  def round(self, state, r):
    state, loss = self.train_clients(state, r)
    return state, base.RoundOutput({'train_loss': loss}, [])
