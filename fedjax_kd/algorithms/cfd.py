"""CFD: compressed federated distillation with hard-label uploads.

F. Sattler, A. Marban, R. Rischke, W. Samek, "CFD: Communication-Efficient
Federated Distillation via Soft-Label Quantization and Delta Coding",
IEEE TNSE 2022; as the baseline of SCARLET (Azuma et al., 2025) with
``b_up = 1`` (hard labels), ``b_down = 32``, no delta coding.

Round (shared engine, :mod:`fedjax_kd.algorithms.protocol`): clients upload the
hard label ``argmax_c p_k(x)`` of each requested sample; the server averages the
votes (no ERA) and distils ``w_g`` on the vote frequencies; the downlink is the
server model's own soft labels ``softmax(f_{w_g}(x))`` as float32, on which the
clients distil. The authors' code takes those from the forward passes of the
last server distillation epoch (train mode, augmented, before each step); we
use ``w_g``'s inference-mode outputs after distillation, the quantity the CFD
paper describes, without the dependence on batch order and augmentation.
With the cache on (SCARLET's Fig. 9) the server cache holds the vote labels and
the clients' caches hold the server-model labels, as in the authors' code.
Hard labels cost 8 bytes each under the ``scarlet`` rules (the code's int64)
and ``ceil(log2 C)`` bits under ``minimal``.
"""

from __future__ import annotations

import dataclasses

from fedjax_kd import options
from fedjax_kd.algorithms import protocol
from fedjax_kd.ops import aggregate


@dataclasses.dataclass(frozen=True)
class CFDOptions:
  """CFD has no options of its own: the family's ``cache.*``."""
  cache: protocol.CacheOptions = options.nested(protocol.CacheOptions)


class CFD(protocol.Protocol):
  name = 'cfd'
  paper_rules = 'scarlet'
  downlink_is_server_labels = False
  upload_kind = 'label'
  options_class = CFDOptions

  def aggregate(self, probs, mask):
    votes, count = aggregate.vote(probs, mask)
    return votes, count > 0, {}

  def downlink(self, state, r, x, labels, probs, mask):
    del r, labels, probs, mask
    return state, self.server_model.predict(state.server, x, chunk=self.spec.eval.chunk)
