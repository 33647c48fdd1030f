"""DS-FL (Itahara et al., IEEE TMC 2023): its variants on digits and MNIST, the PyTorch
reference beside them and its ablation, and the checks of its claims (:func:`section`).
"""

from __future__ import annotations

from benchmarks.reproduction.checks import (Check, bytes_ratio, exceeds, fewer_bytes_to_threshold,
                                            lower, matches, no_steady_gap, not_worse, pair_checks,
                                            smaller_drop, within_draw_noise)
from benchmarks.reproduction.defs import SEEDS10, Section, SweepDef, torch_label, torch_variants

# (label, algorithm, config fields of the variant)
DSFL_VARIANTS = (             # digits: clients of two widths (configs/default.py)
    ('DS-FL ERA', 'dsfl', {'dsfl.aggregation': 'era'}),
    ('DS-FL SA', 'dsfl', {'dsfl.aggregation': 'sa'}),
    ('FedAvg', 'fedavg', {'clients.models': ('cnn@1.0',)}),   # averaging needs one architecture
    ('FD', 'fd', {}),
    ('Single client', 'single', {}),
    # The same protocols on a CNN of twice the width (four times the parameters): DS-FL's bytes
    # a round depend on the open samples and classes alone, FedAvg's on the model (Tables 1-2).
    ('DS-FL ERA, 2x wider CNN', 'dsfl', {'dsfl.aggregation': 'era',
                                        'clients.models': ('cnn@2.0',)}),
    ('FedAvg, 2x wider CNN', 'fedavg', {'clients.models': ('cnn@2.0',),
                                       'server.model': 'cnn@2.0'}),
)
DSFL_HORIZON = {'dsfl_digits': 30, 'dsfl_mnist': 15}   # the sweeps' rounds
# configs/default.py run to convergence: DS-FL against FedAvg at the setting's 30 rounds and at
# 100, where every curve is flat (the paper does not state its rounds; its bytes to 97 % on
# MNIST imply some 200 rounds of DS-FL).
DSFL_LONG_ROUNDS = 100
DSFL_LONG_VARIANTS = DSFL_VARIANTS[:3] + DSFL_VARIANTS[4:5]
# DS-FL's attacks (Sec. 4, Figs. 7-8): every client relabels C of its classes (C = 5, the
# setting of Fig. 9b: half the rows mislabelled) on IID clients, as the paper's Fig. 7; and
# I^n = 2 I^o rows of another data set join the non-IID setting's open set (Fig. 9a: 40,000
# Fashion-MNIST images beside 20,000 MNIST ones). The stand-in for Fashion-MNIST beside the
# 8x8 digits is the synthetic source: 8x8 class prototypes of no digit, plus noise.
DSFL_NOISY_CLASSES = (0, 5)
DSFL_OPEN_NOISE = (0, 800)
DSFL_OPEN_NOISE_SOURCE = 'synthetic:2000'
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
# The independent PyTorch implementations (benchmarks/references/pytorch) on the fedjax_kd sweeps'
# exact data, partitions and draws: the references fedjax_kd's curves are read against, seed by
# seed. (module, variant keys of its VARIANTS)
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
                   curve_rounds=(1, 5, 10, 20, 30), floor='Single client'),
          SweepDef('dsfl_long_digits', f'Digits to convergence ({DSFL_LONG_ROUNDS} rounds), '
                   '`configs/default.py`', DSFL_LONG_VARIANTS, config='configs/default.py',
                   columns=('acc', 'best', 'client', 'bytes', 'rounds_to', 'wall'),
                   overrides=(('rounds', DSFL_LONG_ROUNDS),), seeds=SEEDS10,
                   curve_rounds=(1, 10, 20, 30, 50, 75, 100),
                   tiny_variants=('DS-FL ERA', 'FedAvg'), floor='Single client'),
          SweepDef('dsfl_noisy_labels_digits', 'Noisy labels (Fig. 7): every client relabels '
                   'C of its classes, IID clients, `configs/default.py`', DSFL_LONG_VARIANTS,
                   config='configs/default.py',
                   columns=('acc', 'best', 'client', 'metric:label_acc', 'wall'),
                   metrics=_DSFL_METRICS, grid=(('data.noisy_classes', DSFL_NOISY_CLASSES),),
                   overrides=(('data.partition', 'iid'),), seeds=SEEDS10,
                   tiny_variants=('DS-FL ERA', 'Single client'), floor='Single client'),
          SweepDef('dsfl_noisy_open_digits', 'Noisy open data (Fig. 8): I^n = 2 I^o rows of '
                   'another data set in the open set, `configs/default.py`',
                   DSFL_VARIANTS[:2], config='configs/default.py',
                   columns=('acc', 'best', 'client', 'metric:label_acc', 'metric:entropy',
                            'wall'),
                   metrics=_DSFL_METRICS, grid=(('data.num_public_noise', DSFL_OPEN_NOISE),),
                   overrides=(('data.public_noise_source', DSFL_OPEN_NOISE_SOURCE),),
                   seeds=SEEDS10,
                   tiny_variants=('DS-FL ERA',), floor=('dsfl_digits', 'Single client')),
          SweepDef('dsfl_mnist', 'MNIST, `configs/dsfl_mnist_cpu.py`', DSFL_MNIST_VARIANTS,
                   config='configs/dsfl_mnist_cpu.py', data='mnist', columns=_DSFL_COLUMNS,
                   metrics=_DSFL_METRICS,
                   curve_rounds=(1, 2, 3, 5, 10, 15), seed_curves=('DS-FL ERA', 'DS-FL SA'),
                   metric_curves=('DS-FL ERA', _DSFL_METRICS), floor='Single client',
                   # the 20 client models' test passes are a third of a round on 2 cores;
                   # the checks read the server model (FD and single score their clients)
                   overrides=(('eval.clients', False),)),
          SweepDef('dsfl_mnist_torch',
                   'fedjax_kd against an independent implementation: PyTorch DS-FL on MNIST '
                   '(`benchmarks/references/pytorch/dsfl.py`)', torch_variants(*TORCH_DSFL),
                   config='configs/dsfl_mnist_cpu.py', data='mnist', engine='torch',
                   torch_module='dsfl',
                   pairs=(('DS-FL ERA', 'PyTorch DS-FL ERA'), ('DS-FL SA', 'PyTorch DS-FL SA')),
                   # no wall column: these runs shared the cores with other work, and a
                   # speed comparison belongs in one benchmark run (benchmarks/performance/speed.py)
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
          Check(f"ERA's best server accuracy within the setting's {DSFL_HORIZON[s]} rounds is "
                "within 2 points of SA's (or above)", s,
                not_worse('DS-FL ERA', 'DS-FL SA', tol=0.02, key='best_acc'),
                claim_id='dsfl_acc_vs_fl_sa',
                effect_text='MNIST: ERA 98.1 vs SA 98.6 (-0.5 points); margin 2 points'),
          Check(f"DS-FL's best server accuracy within the setting's {DSFL_HORIZON[s]} rounds is "
                "within 2 points of FedAvg's (or above)", s,
                not_worse('DS-FL ERA', 'FedAvg', tol=0.02, key='best_acc'),
                claim_id='dsfl_acc_vs_fl_sa',
                effect_text='MNIST: ERA 96.9-98.5 vs FL 98.7 (-0.2 to -1.8 points); margin 2 '
                'points'),
          Check('ERA reaches the accuracy threshold with fewer bytes than SA', s,
                fewer_bytes_to_threshold('DS-FL ERA', 'DS-FL SA', after_setup=True),
                claim_id='dsfl_era_vs_sa_comm', effect=0.75, effect_text='up to 75% less'),
          Check('DS-FL (ERA) reaches the accuracy threshold with fewer bytes than FedAvg', s,
                fewer_bytes_to_threshold('DS-FL ERA', 'FedAvg', after_setup=True),
                claim_id='dsfl_comm_vs_fl', effect=0.99,
                effect_text='99.0-99.4% less to a target accuracy (Tables 2 and 3: '
                'Fashion-MNIST and Reuters; the cumulative cost leaves the open-data '
                'broadcast out)'),
          Check('DS-FL (ERA) sends fewer bytes a round than FedAvg', s,
                lower('DS-FL ERA', 'FedAvg', key='bytes_per_round'),
                claim_id='dsfl_comm_vs_fl', effect=0.99, accounting=True,
                effect_text='up to 99% less (Table 1: 98.3% a round on MNIST)'),
          Check('DS-FL (ERA) sends fewer bytes in total than FedAvg, the open-data broadcast '
                'included', s, lower('DS-FL ERA', 'FedAvg'), claim_id='dsfl_comm_vs_fl',
                effect=0.99, accounting=True,
                effect_text='up to 99% less (the paper leaves the broadcast out)'),
          Check("DS-FL's best server accuracy exceeds a single client's mean accuracy", s,
                exceeds('DS-FL ERA', 'Single client', key='best_acc'),
                claim_id='dsfl_acc_vs_single', effect=0.775,
                effect_text='MNIST: +77.5 to +79.1 points'),
          Check("DS-FL's best server accuracy exceeds FD's", s,
                exceeds('DS-FL ERA', 'FD', key='best_acc'), claim_id='dsfl_acc_vs_fd',
                effect=0.773, effect_text='MNIST: +77.3 to +78.9 points'),
      )) + (
          Check("DS-FL's bytes a round on a CNN of twice the width are its bytes on the narrower "
                'CNNs', 'dsfl_digits', bytes_ratio('DS-FL ERA, 2x wider CNN', 'DS-FL ERA'),
                claim_id='dsfl_comm_model_size', accounting=True, effect=0.0,
                effect_text='4.0 MB a round for a 2.3 MB and an 11.2 MB CNN alike (Tables 1-2)'),
          Check("FedAvg's bytes a round on a CNN of twice the width, against its bytes on the "
                'narrower CNN (the contrast)', 'dsfl_digits',
                bytes_ratio('FedAvg, 2x wider CNN', 'FedAvg'),
                claim_id='dsfl_comm_model_size', accounting=True,
                effect_text='FL: 236.1 MB a round on the 2.3 MB CNN (Table 1), the model '
                'size times the clients'),
      ) + tuple(
          Check(f"DS-FL's best server accuracy {when} is within 2 points of FedAvg's (or "
                'above)', 'dsfl_long_digits',
                not_worse('DS-FL ERA', 'FedAvg', tol=0.02, key=key),
                claim_id='dsfl_acc_vs_fl_sa',
                effect_text='MNIST: ERA 96.9-98.5 vs FL 98.7 (-0.2 to -1.8 points); margin 2 '
                'points')
          for when, key in (("by round 30 (the setting's horizon)", 'best_by:30'),
                            (f'by round {DSFL_LONG_ROUNDS} (converged)', 'best_acc'))) + (
          Check(f"ERA's best server accuracy by round {DSFL_LONG_ROUNDS} (converged) is within 2 "
                "points of SA's (or above)", 'dsfl_long_digits',
                not_worse('DS-FL ERA', 'DS-FL SA', tol=0.02, key='best_acc'),
                claim_id='dsfl_acc_vs_fl_sa',
                effect_text='MNIST: ERA 98.1 vs SA 98.6 (-0.5 points); margin 2 points'),
      ) + tuple(
          Check(f"With C = {DSFL_NOISY_CLASSES[-1]} noisy classes, ERA's best server accuracy "
                f"drops less than {other}'s", 'dsfl_noisy_labels_digits',
                smaller_drop(('DS-FL ERA', {'data.noisy_classes': DSFL_NOISY_CLASSES[-1]}),
                             ('DS-FL ERA', {'data.noisy_classes': 0}),
                             (other, {'data.noisy_classes': DSFL_NOISY_CLASSES[-1]}),
                             (other, {'data.noisy_classes': 0})),
                claim_id='dsfl_noisy_labels',
                effect_text='Fig. 7 (curves only): ERA keeps its Top-Accuracy as C grows, SA '
                'and FL lose it')
          for other in ('DS-FL SA', 'FedAvg')) + (
          Check(f"With C = {DSFL_NOISY_CLASSES[-1]} noisy classes ERA keeps its best server "
                'accuracy within 2 points (or above)', 'dsfl_noisy_labels_digits',
                not_worse(('DS-FL ERA', {'data.noisy_classes': DSFL_NOISY_CLASSES[-1]}),
                          ('DS-FL ERA', {'data.noisy_classes': 0}), tol=0.02, key='best_acc'),
                claim_id='dsfl_noisy_labels',
                effect_text='Fig. 7: "the DS-FL with ERA maintains the Top-Accuracy"; margin 2 '
                'points'),
          Check(f'With I^n = {DSFL_OPEN_NOISE[-1]} noise rows in the open set (2 I^o), ERA\'s '
                "best server accuracy drops less than SA's", 'dsfl_noisy_open_digits',
                smaller_drop(('DS-FL ERA', {'data.num_public_noise': DSFL_OPEN_NOISE[-1]}),
                             ('DS-FL ERA', {'data.num_public_noise': 0}),
                             ('DS-FL SA', {'data.num_public_noise': DSFL_OPEN_NOISE[-1]}),
                             ('DS-FL SA', {'data.num_public_noise': 0})),
                claim_id='dsfl_noisy_open',
                effect_text='Fig. 8 (curves only): "the decrease in Top-Accuracy of ERA is '
                'smaller than that of SA"'),
      ) + tuple(
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
             'label shards and 2 local epochs (why: `fedjax_kd.config.presets.digits`); on MNIST '
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
             'reference (`benchmarks/references/pytorch/dsfl.py`) runs each seed on the same data, '
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
             'the draws in single rounds of single seeds. The long digits sweep runs '
             'configs/default.py to 100 rounds, where every curve is flat, so DS-FL meets '
             'FedAvg both at the setting\'s 30 rounds and at convergence (the paper does not '
             'state its rounds). The attack sweeps follow Sec. 4: every client relabels all '
             'its digits of C = 5 source classes as 5 other classes (IID clients, as Fig. 7), '
             'and 800 rows of the synthetic source (8x8 prototypes that are no digit: the '
             'stand-in for Fashion-MNIST beside MNIST) join the 400-row open set (non-IID '
             'clients, as Fig. 8); the checks compare how far each method falls from its '
             'clean run of the same seed.'))
  return dsfl
