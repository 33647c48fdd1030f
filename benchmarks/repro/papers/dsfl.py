"""DS-FL (Itahara et al., IEEE TMC 2023): its variants on digits and MNIST, the PyTorch
reference beside them and its ablation, and the checks of its claims (:func:`section`).
"""

from __future__ import annotations

from benchmarks.repro.checks import (Check, exceeds, fewer_bytes_to_threshold, lower, matches,
                                     no_steady_gap, not_worse, pair_checks, within_draw_noise)
from benchmarks.repro.defs import Section, SweepDef, torch_label, torch_variants

# (label, algorithm, config fields of the variant)
DSFL_VARIANTS = (             # digits: clients of two widths (configs/default.py)
    ('DS-FL ERA', 'dsfl', {'dsfl.aggregation': 'era'}),
    ('DS-FL SA', 'dsfl', {'dsfl.aggregation': 'sa'}),
    ('FedAvg', 'fedavg', {'clients.models': ('cnn@1.0',)}),   # averaging needs one architecture
    ('FD', 'fd', {}),
    ('Single client', 'single', {}),
)
# MNIST: one architecture for all (configs/dsfl_mnist_cpu.py). FD and single clients are scored
# by their 20 client models, ~10 s of every round on 2 cores: every 5th round is enough for
# methods that stay near 0.2.
DSFL_MNIST_VARIANTS = (
    ('DS-FL ERA', 'dsfl', {'dsfl.aggregation': 'era'}),
    ('DS-FL SA', 'dsfl', {'dsfl.aggregation': 'sa'}),
    ('FedAvg', 'fedavg', {}),
    ('FD', 'fd', {'eval.every': 5}),
    ('Single client', 'single', {'eval.every': 5}),
)
# The independent PyTorch implementations (benchmarks/torch_ref) on the fedjax_kd sweeps' exact
# data, partitions and draws: the references fedjax_kd's curves are read against, seed by seed.
# (module, variant keys of its VARIANTS)
TORCH_DSFL = ('dsfl', ('era', 'sa'))
TORCH_DSFL_ABLATION = ('dsfl', ('lockstep', 'lockstep_bn', 'lockstep_init', 'lockstep_batches',
                                'era_draws'))
TORCH_DSFL_ABLATION_ROUNDS = 3      # the lag the ablation looks for is at round 3
_DSFL_COLUMNS = ('acc', 'best', 'client', 'bytes', 'bytes_round', 'rounds_to', 'bytes_to',
                 'metric:label_acc', 'metric:upload_acc', 'wall')
# Diagnostics (the open set's true labels, never used for training): how often the round's
# distillation labels and the clients' uploads name the true class.
_DSFL_METRICS = ('label_acc', 'upload_acc', 'entropy')


def section() -> Section:
  """DS-FL's section: its sweeps, checks and notes."""
  dsfl = Section(
      key='dsfl', paper='DS-FL',
      title='DS-FL: distillation-based semi-supervised FL (Itahara et al., IEEE TMC 2023)',
      claim=('With non-IID private data and an unlabelled open data set, DS-FL shares '
             'soft labels on the open set instead of model parameters: its server model '
             'reaches an accuracy comparable to FedAvg at a fraction of the communication '
             '(Table 1 compares the per-round cost), it is far more accurate than FD '
             '(whose accuracy stays near a single client\'s, §4.2), and entropy-reduction '
             'aggregation (ERA) beats simple averaging (SA) (Table 3, Fig. 3).'),
      sweeps=(
          SweepDef('dsfl_digits', 'Digits (embedded), `configs/default.py`', DSFL_VARIANTS,
                   config='configs/default.py', columns=_DSFL_COLUMNS, metrics=_DSFL_METRICS,
                   curve_rounds=(1, 5, 10, 20, 30)),
          SweepDef('dsfl_mnist', 'MNIST, `configs/dsfl_mnist_cpu.py`', DSFL_MNIST_VARIANTS,
                   config='configs/dsfl_mnist_cpu.py', data='mnist', columns=_DSFL_COLUMNS,
                   metrics=_DSFL_METRICS,
                   curve_rounds=(1, 2, 3, 5, 10, 15), seed_curves=('DS-FL ERA', 'DS-FL SA'),
                   metric_curves=('DS-FL ERA', _DSFL_METRICS),
                   # the 20 client models' test passes are a third of a round on 2 cores;
                   # the checks read the server model (FD and single score their clients)
                   overrides=(('eval.clients', False),)),
          SweepDef('dsfl_mnist_torch',
                   'fedjax_kd against an independent implementation: PyTorch DS-FL on MNIST '
                   '(`benchmarks/torch_ref/dsfl.py`)', torch_variants(*TORCH_DSFL),
                   config='configs/dsfl_mnist_cpu.py', data='mnist', engine='torch',
                   torch_module='dsfl',
                   pairs=(('DS-FL ERA', 'PyTorch DS-FL ERA'), ('DS-FL SA', 'PyTorch DS-FL SA')),
                   # no wall column: these runs shared the cores with other work, and a
                   # speed comparison belongs in one benchmark run (benchmarks/speed.py)
                   columns=('acc', 'best', 'rounds_to', 'metric:label_acc',
                            'metric:upload_acc'),
                   metrics=_DSFL_METRICS, curve_rounds=(1, 2, 3, 5, 10, 15),
                   seed_curves=('DS-FL ERA', 'PyTorch DS-FL ERA', 'DS-FL SA',
                                'PyTorch DS-FL SA'),
                   metric_curves=('PyTorch DS-FL ERA', _DSFL_METRICS),
                   beside=(('dsfl_mnist', ('DS-FL ERA', 'DS-FL SA')),),
                   overrides=(('eval.clients', False),)),
          SweepDef('dsfl_mnist_torch_ablation',
                   'Where the two DS-FL implementations differ: one difference at a time '
                   f'(MNIST, first {TORCH_DSFL_ABLATION_ROUNDS} rounds)',
                   torch_variants(*TORCH_DSFL_ABLATION),
                   config='configs/dsfl_mnist_cpu.py', data='mnist', engine='torch',
                   torch_module='dsfl', columns=('acc', 'metric:label_acc'),
                   metrics=_DSFL_METRICS,
                   curve_rounds=tuple(range(1, TORCH_DSFL_ABLATION_ROUNDS + 1)),
                   beside=(('dsfl_mnist', ('DS-FL ERA',)),
                           ('dsfl_mnist_torch', ('PyTorch DS-FL ERA',))),
                   pairs=(('DS-FL ERA', torch_label('dsfl', 'lockstep')),
                          ('DS-FL ERA', 'PyTorch DS-FL ERA')),
                   paired_rounds=tuple(range(1, TORCH_DSFL_ABLATION_ROUNDS + 1)),
                   overrides=(('eval.clients', False),
                              ('rounds', TORCH_DSFL_ABLATION_ROUNDS))),
      ),
      checks=tuple(c for s in ('dsfl_digits', 'dsfl_mnist') for c in (
          Check("ERA's best server accuracy is within 2 points of SA's (or above)", s,
                not_worse('DS-FL ERA', 'DS-FL SA', tol=0.02, key='best_acc'),
                claim_id='dsfl_acc_vs_fl_sa',
                effect_text='MNIST: ERA 98.1 vs SA 98.6 (-0.5 points); margin 2 points'),
          Check("DS-FL's best server accuracy is within 2 points of FedAvg's (or above)", s,
                not_worse('DS-FL ERA', 'FedAvg', tol=0.02, key='best_acc'),
                claim_id='dsfl_acc_vs_fl_sa',
                effect_text='MNIST: ERA 96.9-98.5 vs FL 98.7 (-0.2 to -1.8 points); margin 2 '
                'points'),
          Check('ERA reaches the accuracy threshold with fewer bytes than SA', s,
                fewer_bytes_to_threshold('DS-FL ERA', 'DS-FL SA', after_setup=True),
                claim_id='dsfl_era_vs_sa_comm', effect=0.75, effect_text='up to 75% less'),
          Check('DS-FL (ERA) sends fewer bytes a round than FedAvg', s,
                lower('DS-FL ERA', 'FedAvg', key='bytes_per_round'),
                claim_id='dsfl_comm_vs_fl', effect=0.99,
                effect_text='up to 99% less (Table 1: 98.3% a round on MNIST)'),
          Check('DS-FL (ERA) sends fewer bytes in total than FedAvg, the open-data broadcast '
                'included', s, lower('DS-FL ERA', 'FedAvg'), claim_id='dsfl_comm_vs_fl',
                effect=0.99, effect_text='up to 99% less (the paper leaves the broadcast out)'),
          Check("DS-FL's best server accuracy exceeds a single client's mean accuracy", s,
                exceeds('DS-FL ERA', 'Single client', key='best_acc'),
                claim_id='dsfl_acc_vs_single', effect=0.775,
                effect_text='MNIST: +77.5 to +79.1 points'),
          Check("DS-FL's best server accuracy exceeds FD's", s,
                exceeds('DS-FL ERA', 'FD', key='best_acc'), claim_id='dsfl_acc_vs_fd',
                effect=0.773, effect_text='MNIST: +77.3 to +78.9 points'),
      )) + tuple(
          c for agg in ('ERA', 'SA')
          for c in pair_checks('dsfl_mnist_torch', f'DS-FL {agg}', f'PyTorch DS-FL {agg}',
                                (3, 8, None), steady=False)) + (
          Check("ERA's best server accuracy is within 2 points of SA's (or above) in the "
                'PyTorch reference too', 'dsfl_mnist_torch',
                not_worse('PyTorch DS-FL ERA', 'PyTorch DS-FL SA', tol=0.02, key='best_acc'),
                claim_id='dsfl_acc_vs_fl_sa', arbiter=True),) + tuple(
          Check(f'fedjax_kd\'s DS-FL {agg} does not trail the reference steadily: the '
                'per-seed mean gap over rounds 2-15 is equivalent within 1 point',
                'dsfl_mnist_torch',
                no_steady_gap(f'DS-FL {agg}', f'PyTorch DS-FL {agg}'))
          for agg in ('ERA', 'SA')) + (
          Check('In lock-step (same initial weights, batches and BatchNorm rule) the PyTorch '
                "DS-FL's round-3 accuracy is fedjax_kd's (paired by seed, equivalent within 1 "
                'point)',
                'dsfl_mnist_torch_ablation',
                matches(torch_label('dsfl', 'lockstep'), 'DS-FL ERA', at_round=3, tol=0.01)),
          Check("PyTorch's unbiased BatchNorm running variance moves the lock-step round-3 "
                'accuracy by less than 1 point', 'dsfl_mnist_torch_ablation',
                matches(torch_label('dsfl', 'lockstep_bn'), torch_label('dsfl', 'lockstep'),
                        at_round=3, tol=0.01)),
          Check("fedjax_kd's round-3 gap to the PyTorch DS-FL is no larger than the gap "
                "between two PyTorch runs that differ only in their random draws",
                'dsfl_mnist_torch_ablation',
                within_draw_noise('DS-FL ERA', 'PyTorch DS-FL ERA',
                                  torch_label('dsfl', 'era_draws'), 'PyTorch DS-FL ERA',
                                  at_round=3)),),
      notes=('acc is each method\'s headline accuracy: the server (global) model for DS-FL '
             'and FedAvg, the mean over client models for FD and single. On digits the '
             'clients mix two CNN widths and FedAvg, which averages parameters, runs one '
             '(`cnn@1.0`); on MNIST every method uses the same model. Bytes follow DS-FL\'s '
             'rules (float32, multicast counted once) and include the one-time open-data '
             'broadcast, which dominates short runs. The digits setting gives each client 3 '
             'label shards and 2 local epochs (why: `fedjax_kd.presets.digits`); on MNIST '
             'the clients hold the paper\'s 2 shards of 100 images and run its 5 + 5 '
             'epochs in batches of 100 with the paper\'s CNN (`dsfl_cnn`) and 1,000 of '
             '20,000 open images a round, with 20 clients instead of 100 (client models are '
             'not scored there: FD and single score theirs). "mean label_acc" is how often '
             'the argmax of a round\'s distillation labels is the true class, "mean '
             'upload_acc" the same for the clients\' uploads, averaged over rounds '
             '(diagnostics: the open set\'s labels never reach training). On MNIST the '
             'uploads name little but each client\'s own two classes for about nine rounds, '
             'then the clients start keeping what they distil and the labels sharpen; when '
             'that turn comes differs between seeds, which is the spread at round 15 '
             '([DS-FL on MNIST](dsfl_mnist.md) explains the diagnostics). The PyTorch '
             'reference (`benchmarks/torch_ref/dsfl.py`) runs each seed on the same data, '
             'partition and open-set draws with its own initialisation, shuffles and '
             'BatchNorm; its rows are read next to fedjax_kd\'s seed by seed, so a seed '
             'that is slow in both is slow because of its setting. The ablation sweep '
             'switches the reference\'s known differences to fedjax_kd\'s one at a time: '
             'lock-step (fedjax_kd\'s initial weights, minibatch order and biased BatchNorm '
             'running variance) and then each of them back to PyTorch\'s; "other random '
             'draws" is the PyTorch reference with another RNG seed on the same data, the '
             'gap that chance alone makes between two correct implementations. Both run in '
             'the paper\'s phase order (train, predict, aggregate, distil, score), so the '
             'order is not a switch. "Does not trail steadily" averages each seed\'s gap '
             'over rounds 2-15: a real lag shows in every seed\'s average, an accident of '
             'the draws in single rounds of single seeds.'))
  return dsfl
