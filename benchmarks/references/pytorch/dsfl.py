"""DS-FL in PyTorch (S. Itahara, T. Nishio, Y. Koda, M. Morikura, K. Yamamoto,
"Distillation-Based Semi-Supervised Federated Learning for Communication-Efficient
Collaborative Training With Non-IID Private Data", IEEE TMC 2021, Algorithm 1).

One round, in the paper's order:
  1. every client trains its own persistent model on its private data (cross-entropy);
  2. every client predicts ``o_r`` in inference mode and uploads softmax probabilities;
  3. the server averages them (SA) and, for ERA, takes ``softmax(mean / T)``;
  4. every client and the server model distil on ``(o_r, labels)`` (soft-label
     cross-entropy, whose gradient equals that of ``KL(labels || student)``);
  5. the server model is scored on the test set in inference mode.

Rows carry ``test_acc`` and the diagnostics fedjax_kd logs for DS-FL: ``label_acc`` (the
labels' argmax is the true class), ``upload_acc`` (the same for the uploads) and ``entropy``.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from benchmarks.references.pytorch import common

ALGORITHMS = ('dsfl',)
CONFIG = 'configs/dsfl_mnist_cpu.py'
FIXED = (('eval.clients', False),)    # the server model is what DS-FL scores
METRICS = ('label_acc', 'upload_acc', 'entropy')
# variant key -> (label, fedjax_kd algorithm, fields). The last five are the ablation of the
# known differences between fedjax_kd and this reference (ERA), one at a time: from
# lock-step (fedjax_kd's initial weights and batches, its biased running variance) back
# towards PyTorch's own draws, and PyTorch against itself with other random draws (the
# seed-noise floor of a paired comparison).
VARIANTS = {
    'era': ('PyTorch DS-FL ERA', 'dsfl', {'dsfl.aggregation': 'era'}),
    'sa': ('PyTorch DS-FL SA', 'dsfl', {'dsfl.aggregation': 'sa'}),
    'lockstep': ('Lock-step (fedjax_kd init and batches, biased BN variance)', 'dsfl',
                 {'dsfl.aggregation': 'era', **common.LOCKSTEP}),
    'lockstep_bn': ('Lock-step with PyTorch BN variance (unbiased)', 'dsfl',
                    {'dsfl.aggregation': 'era', **common.LOCKSTEP,
                     'reference.bn_running_var': 'unbiased'}),
    'lockstep_init': ('Lock-step with PyTorch init', 'dsfl',
                      {'dsfl.aggregation': 'era', **common.LOCKSTEP, 'reference.init': 'torch'}),
    'lockstep_batches': ('Lock-step with PyTorch batches', 'dsfl',
                         {'dsfl.aggregation': 'era', **common.LOCKSTEP,
                          'reference.batches': 'torch'}),
    'era_draws': ('PyTorch DS-FL ERA, other random draws', 'dsfl',
                  {'dsfl.aggregation': 'era', 'reference.seed_offset': 1000}),
}
DEFAULT_VARIANTS = ('era', 'sa')
ABLATION = ('lockstep', 'era_draws', 'lockstep_bn', 'lockstep_init', 'lockstep_batches')


def rounds(ctx) -> Iterator[dict[str, Any]]:
  """Yields one metrics row per round."""
  torch = ctx.torch
  s = ctx.setting
  opts = s.spec.options
  clients = [ctx.model(k) for k in range(ctx.num_clients)]
  server = ctx.model(None)
  for t, draw in enumerate(s.draws, start=1):
    train_loss = np.mean([ctx.fit(m, x, y, s.train, soft=False, t=t, who=k, phase='train')
                          for k, (m, (x, y)) in enumerate(zip(clients, ctx.data))])
    j = torch.from_numpy(draw.astype(np.int64))
    x_or, y_or = ctx.x_pub[j], ctx.y_pub[j]
    probs = torch.stack([ctx.predict(m, x_or) for m in clients])        # [K, n, C]
    mean = probs.mean(0)
    labels = torch.softmax(mean / opts.temperature, 1) if opts.aggregation == 'era' else mean
    distill_loss = np.mean([ctx.fit(m, x_or, labels, s.distill, soft=True, t=t, who=k,
                                    phase='distill') for k, m in enumerate(clients)])
    server_loss = ctx.fit(server, x_or, labels, s.distill, soft=True, t=t, who=None,
                          phase='distill')
    yield {'round': t, 'test_acc': ctx.test_acc(server),
           'label_acc': float((labels.argmax(1) == y_or).float().mean()),
           'upload_acc': float((probs.argmax(2) == y_or[None]).float().mean()),
           'entropy': float(-(labels * torch.log(labels.clamp_min(1e-30))).sum(1).mean()),
           'train_loss': float(train_loss), 'distill_loss': float(distill_loss),
           'server_distill_loss': server_loss}
