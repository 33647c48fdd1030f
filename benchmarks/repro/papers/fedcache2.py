"""FedCache 2.0 (arXiv 2405.13378): its variants on digits and MNIST, the PyTorch reference
beside them, and the checks of its claims (:func:`section`).
"""

from __future__ import annotations

from typing import Callable

import ml_collections

from benchmarks.repro.checks import Check, exceeds, pair_checks
from benchmarks.repro.defs import (PAIRED_SEEDS, UA_HEADERS, Section, SweepDef, torch_label,
                                   torch_variants)
from fedjax_kd import presets

FEDCACHE2_VARIANTS = (
    ('FedCache 2.0', 'fedcache2', {}),
    ('Single client', 'single', {}),
    ('DS-FL ERA', 'dsfl', {}),
)
# The plain-PyTorch FedCache 2.0 (benchmarks/torch_ref/fedcache2.py) for the first rounds,
# from fedjax_kd's initial weights of each seed (its rounds take ~40 s on one CPU thread, so
# the pair reuses fedjax_kd's MNIST runs instead of running them again with PyTorch's init).
TORCH_FEDCACHE2 = ('fedcache2', ('fedcache2_fedjax_init', 'single_fedjax_init'))
TORCH_FEDCACHE2_ROUNDS = 6
# Public set carved from the training data for every FedCache 2.0 run (only DS-FL uses it):
# (data.num_public, distill.public_per_round) per data set.
FEDCACHE2_PUBLIC = {'digits': (400, 300), 'mnist': (3000, 500)}


def _fc2_preset(data: str) -> Callable[[str], ml_collections.ConfigDict]:
  def make(source):
    c = presets.fedcache2_cpu(source)
    c.data.num_public, c.distill.public_per_round = FEDCACHE2_PUBLIC[data]
    return c
  return make


def section() -> Section:
  """FedCache 2.0's section: its sweeps, checks and notes."""
  fc2_checks = tuple(
      Check("FedCache 2.0's UA exceeds single-client training", s,
            exceeds('FedCache 2.0', 'Single client'), claim_id='fc2_vs_single')
      for s in ('fedcache2_digits', 'fedcache2_mnist'))
  fedcache2 = Section(
      key='fedcache2', paper='FedCache 2.0',
      title='FedCache 2.0: knowledge caching with distilled data (arXiv 2405.13378)',
      claim=('Clients upload a few distilled samples per class to a knowledge cache and '
             'download a personalised sample of it: average UA on CIFAR-10 of 51.1% at '
             'alpha = 0.5 and 36.5% at alpha = 2.0, above SCDPFL and FedCache, at a small '
             'fraction of their communication (Tables IV, V).'),
      sweeps=(
          SweepDef('fedcache2_digits', 'Digits (embedded), `presets.fedcache2_cpu`',
                   FEDCACHE2_VARIANTS, preset=_fc2_preset('digits'),
                   preset_text='presets.fedcache2_cpu(source), public set 400/300',
                   headers=UA_HEADERS, tiny_variants=('FedCache 2.0', 'Single client')),
          SweepDef('fedcache2_mnist', 'MNIST, `presets.fedcache2_cpu`', FEDCACHE2_VARIANTS,
                   preset=_fc2_preset('mnist'), data='mnist',
                   preset_text='presets.fedcache2_cpu(source), public set 3000/500',
                   headers=UA_HEADERS,
                   seeds=PAIRED_SEEDS),
          SweepDef('fedcache2_mnist_torch',
                   'fedjax_kd against an independent implementation: PyTorch FedCache 2.0 '
                   "from fedjax_kd's initial weights (`benchmarks/torch_ref/fedcache2.py`), "
                   f'first {TORCH_FEDCACHE2_ROUNDS} rounds', torch_variants(*TORCH_FEDCACHE2),
                   preset=_fc2_preset('mnist'), data='mnist', engine='torch',
                   torch_module='fedcache2',
                   preset_text='presets.fedcache2_cpu(source), public set 3000/500',
                   metrics=('cache_items', 'down_items'), columns=('acc', 'best'), headers=UA_HEADERS,
                   curve_rounds=(1, 2, 3, 4, 5, TORCH_FEDCACHE2_ROUNDS),
                   beside=(('fedcache2_mnist', ('FedCache 2.0', 'Single client')),),
                   pairs=(('FedCache 2.0', torch_label('fedcache2', 'fedcache2_fedjax_init')),
                          ('Single client', torch_label('fedcache2', 'single_fedjax_init'))),
                   paired_rounds=(1, 2, 3, 4, 5, TORCH_FEDCACHE2_ROUNDS),
                   overrides=(('rounds', TORCH_FEDCACHE2_ROUNDS),),
                   seeds=PAIRED_SEEDS),
      ),
      checks=fc2_checks + tuple(
          c for ours, key in (('FedCache 2.0', 'fedcache2_fedjax_init'),
                              ('Single client', 'single_fedjax_init'))
          for c in pair_checks('fedcache2_mnist_torch', ours, torch_label('fedcache2', key),
                                (2, 4, TORCH_FEDCACHE2_ROUNDS))) + (
          Check("FedCache 2.0's UA exceeds single-client training in the PyTorch reference "
                'too', 'fedcache2_mnist_torch',
                exceeds(torch_label('fedcache2', 'fedcache2_fedjax_init'),
                        torch_label('fedcache2', 'single_fedjax_init')),
                claim_id='fc2_vs_single', arbiter=True),),
      notes=('† UA = the mean over clients of their personalised test accuracy (per-client '
             'test splits with the clients\' label priors); for DS-FL the first column is '
             'its server model and "client acc" its client models\' UA. Every run carves the '
             'same public set from the training data; only DS-FL uses it. Bytes follow each '
             'method\'s own rules (FedCache 2.0: encoded distilled samples, 1 B per label '
             'and the label distribution once; DS-FL: float32 labels and the open-data '
             'broadcast). The paper\'s comparison is against parameter exchange, which this '
             'table does not run. The PyTorch FedCache 2.0 (`benchmarks/torch_ref/fedcache2.py`: '
             'kernel ridge regression on the penultimate features solved by Cholesky, the '
             'cache as a clients x slots tensor, a Python loop over clients) starts from '
             'fedjax_kd\'s initial weights of each seed (`reference.init=fedjax`) and draws '
             'its own batches, cache samples and distillation order; it runs 6 rounds (about '
             '40 s a round on one thread).'))
  return fedcache2
