"""ACE-pFL: its ablations on digits and MNIST (and MNIST where collaboration matters), the
PyTorch reference beside them, and the checks of its claims (:func:`section`).
"""

from __future__ import annotations

from benchmarks.reproduction.checks import (Check, bytes_ratio, exceeds, lower, not_worse,
                                            pair_checks)
from benchmarks.reproduction.defs import (SEEDS10, TORCH_INIT, UA_HEADERS, Section, SweepDef,
                                          torch_label, torch_variants)
from fedjax_kd.config import presets

ACEPFL_VARIANTS = (
    ('ACE-pFL', 'acepfl', {}),
    ('w/o clustering', 'acepfl', {'acepfl.clustering': False}),
    ('fixed T = T0', 'acepfl', {'acepfl.dynamic_temperature': False}),
    ('double (no L_GD)', 'acepfl', {'acepfl.distillation': 'double'}),
    ('single (L_CE + L_KD)', 'acepfl', {'acepfl.distillation': 'single'}),
    ('Single client', 'single', {}),
)
# The plain-PyTorch ACE-pFL (benchmarks/references/pytorch/acepfl.py): ACE-pFL, single-client
# training and two ablations, for the first rounds, beside fedjax_kd with PyTorch's initialisation.
TORCH_ACEPFL = ('acepfl', ('acepfl', 'single'))
TORCH_ACEPFL_ROUNDS = 10
ACEPFL_TORCHINIT_VARIANTS = tuple(   # in TORCH_ACEPFL's order: paired one to one
    (f'{label}, PyTorch init', algo, {**fields, **dict(TORCH_INIT)})
    for want in ('ACE-pFL', 'Single client')
    for label, algo, fields in ACEPFL_VARIANTS if label == want)
# The paper's ablations (Tables XI, XII, XIV): each removes a component, so its UA should be
# lower than ACE-pFL's.
# Our own baseline: one mean of every client's public logits as everybody's target (FedMD's
# consensus), no clustering, fixed temperature; run on digits.
ACEPFL_FEDMD = ('FedMD-style mean', 'fedmd', {})
ACEPFL_ABLATIONS = ('w/o clustering', 'fixed T = T0', 'double (no L_GD)',
                    'single (L_CE + L_KD)')
# RQ3's design choices (Tables V, VII, IX, X, XIII), each against the default (vector
# similarity, |V| = 3, Top-K 5, weights 0.4/0.3/0.2/0.1, curve f1), and the paper's
# parameter-exchange baselines (homogeneous models: the largest CNN for all, as the paper runs
# them on its largest model). SCAFFOLD runs at lr 0.02: at the preset's 0.05 its control
# variates grow until a run overflows (as in the FedEntOpt section).
ACEPFL_RQ3 = (
    ('matrix similarity', 'acepfl', {'acepfl.cluster_method': 'matrix'}),
    ('|V| = 2', 'acepfl', {'acepfl.clusters': 2}),
    ('|V| = 5', 'acepfl', {'acepfl.clusters': 5}),
    ('Top-K = 10', 'acepfl', {'acepfl.top_k': 10}),
    ('equal loss weights', 'acepfl', {'acepfl.weights': (0.25, 0.25, 0.25, 0.25)}),
) + tuple((f'curve {f}', 'acepfl', {'acepfl.curve': f}) for f in ('f2', 'f3', 'f4', 'f5')) + (
    # Eq. 3 read as one teacher for everybody weights each cluster by its data share, which
    # is the plain mean when clients hold equal data: a teacher per cluster is the reading
    # under which clustering can matter (docs/papers.md).
    ('one teacher per cluster', 'acepfl', {'acepfl.aggregation': 'per_cluster'}),
)
_HOMOGENEOUS = {'clients.models': ('cnn@1.0',), 'server.model': 'cnn@1.0'}
ACEPFL_FL_BASELINES = (
    ('FedAvg', 'fedavg', dict(_HOMOGENEOUS)),
    ('FedProx', 'fedprox', dict(_HOMOGENEOUS)),
    ('SCAFFOLD', 'scaffold', {**_HOMOGENEOUS, 'train.learning_rate': 0.02}),
)
# Its personalised baselines (Table I): Per-FedAvg, pFedMe and FedALA exchange parameters and
# need one architecture (the largest CNN, as the three above); FedDF, KT-pFL and FedKD take
# ACE-pFL's own heterogeneous models. Per-FedAvg's meta step and pFedMe's two step sizes are
# set to the setting's learning rate: their papers' MNIST values barely move these CNNs in 21
# rounds (Per-FedAvg's 0.001) or overflow them (pFedMe's personal 0.09 with lambda 15).
# FedKD runs at every beta as the others (the slowest: a mentor and a mentee trained step by
# step, an SVD per matrix).
ACEPFL_PFL_BASELINES = (
    ('Per-FedAvg', 'perfedavg', {**_HOMOGENEOUS, 'perfedavg.beta': 0.05}),
    ('pFedMe', 'pfedme', {**_HOMOGENEOUS, 'pfedme.personal_lr': 0.05, 'pfedme.lr': 0.05}),
    ('FedALA', 'fedala', dict(_HOMOGENEOUS)),
    ('FedDF', 'feddf', {}),
    ('KT-pFL', 'kt_pfl', {}),
    ('FedKD', 'fedkd', {}),
)
ACEPFL_SCARCE_DIGITS_VARIANTS = (ACEPFL_VARIANTS + ACEPFL_RQ3 + (ACEPFL_FEDMD,)
                                 + ACEPFL_FL_BASELINES + ACEPFL_PFL_BASELINES)
# The clustering and similarity ablations where clients differ in size. In the scarce digits
# every client holds exactly ten digits (the Dirichlet split's minimum of ten over a hundred),
# so Eq. 3's one teacher is the plain mean for any clustering and those ablations run the
# same rounds to the bit. A minimum of four lets the sizes differ (6 to 12 training digits a
# client on seed 0), so the clusters' data shares weight the teacher.
ACEPFL_SIZES_MIN = 4
ACEPFL_SIZES_VARIANTS = tuple(
    v for v in ACEPFL_VARIANTS + ACEPFL_RQ3
    if v[0] in ('ACE-pFL', 'w/o clustering', 'matrix similarity', '|V| = 2', '|V| = 5',
                'one teacher per cluster', 'Single client'))
ACEPFL_BETA_VARIANTS = (ACEPFL_VARIANTS[:1] + ACEPFL_FL_BASELINES + ACEPFL_VARIANTS[-1:]
                        + ACEPFL_PFL_BASELINES)
# Tables I and III (CIFAR-10): ACE-pFL against the three baselines at beta = 0.1, 1.0, 10.
ACEPFL_TABLE3 = {0.1: (81.25, {'FedAvg': 24.32, 'FedProx': 38.22, 'SCAFFOLD': 49.93}),
                 1.0: (83.96, {'FedAvg': 40.97, 'FedProx': 43.58, 'SCAFFOLD': 55.37}),
                 10.0: (88.36, {'FedAvg': 70.93, 'FedProx': 81.56, 'SCAFFOLD': 79.36})}
# Tables I and III (CIFAR-10): the personalised baselines at beta = 0.1, 1.0 and 10.
ACEPFL_TABLE3_PFL = {
    0.1: {'Per-FedAvg': 50.59, 'pFedMe': 64.98, 'FedALA': 75.64, 'FedDF': 70.29,
          'KT-pFL': 69.98, 'FedKD': 68.91},
    1.0: {'Per-FedAvg': 57.39, 'pFedMe': 68.92, 'FedALA': 75.32, 'FedDF': 73.69,
          'KT-pFL': 74.98, 'FedKD': 73.29},
    10.0: {'Per-FedAvg': 83.32, 'pFedMe': 84.79, 'FedALA': 86.92, 'FedDF': 84.36,
           'KT-pFL': 83.39, 'FedKD': 85.94}}
# Tables II and IV (CIFAR-10): communication overhead (GB) of ACE-pFL and each baseline.
ACEPFL_TABLE4_GB = {
    0.1: (1.89, {'FedAvg': 115.23, 'FedProx': 102.43, 'SCAFFOLD': 89.63, 'Per-FedAvg': 96.36,
                 'pFedMe': 87.36, 'FedALA': 64.16, 'FedDF': 2.81, 'KT-pFL': 2.70,
                 'FedKD': 0.08}),
    1.0: (1.51, {'FedAvg': 96.79, 'FedProx': 86.42, 'SCAFFOLD': 75.28, 'Per-FedAvg': 79.98,
                 'pFedMe': 72.58, 'FedALA': 53.28, 'FedDF': 2.33, 'KT-pFL': 2.41,
                 'FedKD': 0.08}),
    10.0: (1.14, {'FedAvg': 85.48, 'FedProx': 75.79, 'SCAFFOLD': 66.32, 'Per-FedAvg': 71.63,
                  'pFedMe': 54.46, 'FedALA': 47.84, 'FedDF': 2.09, 'KT-pFL': 1.98,
                  'FedKD': 0.08})}
ACEPFL_BETA_SWEEPS = {0.1: 'acepfl_scarce_b01_digits', 1.0: 'acepfl_scarce_digits',
                      10.0: 'acepfl_scarce_b10_digits'}
# The paper's effect of each ablation (CIFAR-10, beta = 0.1: 81.25 with every component).
ACEPFL_ABLATION_EFFECTS = {
    'w/o clustering': (0.0606, 'Table XI: 81.25 vs 75.19 (+6.06 points)'),
    'fixed T = T0': (0.0557, 'Table XII: 81.25 vs 75.68 (+5.57 points)'),
    'double (no L_GD)': (0.0657, 'Table XIV: 81.25 vs 74.68 (+6.57 points)'),
    'single (L_CE + L_KD)': (0.1109, 'Table XIV: 81.25 vs 70.16 (+11.09 points)'),
}


def _scarce(alpha: float | None = None, min_size: int | None = None):
  def make(source):
    c = presets.acepfl_scarce_cpu(source, 'acepfl')
    if alpha is not None:
      c.data.alpha = alpha
    if min_size is not None:
      c.data.min_size = min_size
    return c
  return make


def _sizes_checks() -> list[Check]:
  """The clustering and similarity checks again, where clients differ in size."""
  s = 'acepfl_sizes_digits'
  return [
      Check('Removing a component lowers UA: w/o clustering (clients of unequal size)', s,
            exceeds('ACE-pFL', 'w/o clustering'), claim_id='ace_components',
            effect=ACEPFL_ABLATION_EFFECTS['w/o clustering'][0],
            effect_text=ACEPFL_ABLATION_EFFECTS['w/o clustering'][1]),
      Check('Removing a component lowers UA: w/o clustering, against one teacher per '
            'cluster (clients of unequal size)', s,
            exceeds('one teacher per cluster', 'w/o clustering'), claim_id='ace_components',
            effect=ACEPFL_ABLATION_EFFECTS['w/o clustering'][0],
            effect_text=ACEPFL_ABLATION_EFFECTS['w/o clustering'][1]),
      Check('Vector similarity is within 2 points of the matrix similarity (or above; '
            'clients of unequal size)', s,
            not_worse('ACE-pFL', 'matrix similarity', tol=0.02), claim_id='ace_similarity',
            effect_text='Table V, CIFAR-10 beta = 0.1: 81.25 vs 82.69; "the accuracy loss is '
            'only about 2%"; margin 2 points'),
  ] + [
      Check(f'|V| = 3 gives a higher UA than |V| = {v} (clients of unequal size)', s,
            exceeds('ACE-pFL', f'|V| = {v}'), claim_id='ace_clusters',
            effect=(81.25 - acc) / 100,
            effect_text=f'Table VII, CIFAR-10 beta = 0.1: 81.25 vs {acc} '
            f'({81.25 - acc:+.2f} points)')
      for v, acc in ((2, 77.52), (5, 78.93))
  ] + [Check('ACE-pFL beats single-client training (clients of unequal size)', s,
             exceeds('ACE-pFL', 'Single client'), claim_id='ace_vs_single')]


def _rq3_checks() -> list[Check]:
  """RQ3's design choices and the parameter-exchange baselines, where collaboration
  matters."""
  s = 'acepfl_scarce_digits'
  out = [
      Check('Removing a component lowers UA: w/o clustering, against one teacher per '
            'cluster', s, exceeds('one teacher per cluster', 'w/o clustering'),
            claim_id='ace_components', effect=ACEPFL_ABLATION_EFFECTS['w/o clustering'][0],
            effect_text=ACEPFL_ABLATION_EFFECTS['w/o clustering'][1]),
      Check('Vector similarity is within 2 points of the matrix similarity (or above)', s,
            not_worse('ACE-pFL', 'matrix similarity', tol=0.02), claim_id='ace_similarity',
            effect_text='Table V, CIFAR-10 beta = 0.1: 81.25 vs 82.69; "the accuracy loss is '
            'only about 2%"; margin 2 points'),
  ] + [
      Check(f'|V| = 3 gives a higher UA than |V| = {v}', s, exceeds('ACE-pFL', f'|V| = {v}'),
            claim_id='ace_clusters', effect=(81.25 - acc) / 100,
            effect_text=f'Table VII, CIFAR-10 beta = 0.1: 81.25 vs {acc} '
            f'({81.25 - acc:+.2f} points)')
      for v, acc in ((2, 77.52), (5, 78.93))
  ] + [
      Check('Top-K = 5 is within 2 points of Top-K = 10 (or above)', s,
            not_worse('ACE-pFL', 'Top-K = 10', tol=0.02), claim_id='ace_topk',
            effect_text='Table IX, CIFAR-10 beta = 0.1: 81.25 vs 83.01; "only decreases by an '
            'average of 1.78%"; margin 2 points'),
      Check('Top-K = 5 sends fewer bytes than Top-K = 10', s,
            bytes_ratio('ACE-pFL', 'Top-K = 10', key='total_bytes'), claim_id='ace_topk',
            accounting=True, effect=1 - 1.89 / 3.89,
            effect_text='Table IX, CIFAR-10 beta = 0.1: 1.89 vs 3.89 GB'),
      Check('The unequal loss weights (0.4, 0.3, 0.2, 0.1) give a higher UA than equal ones', s,
            exceeds('ACE-pFL', 'equal loss weights'), claim_id='ace_weights', effect=0.0837,
            effect_text='Table X, CIFAR-10 beta = 0.1: 81.25 vs 72.88 (+8.37 points)'),
  ]
  table13 = {'f2': 78.36, 'f3': 76.45, 'f4': 77.14, 'f5': 74.91}
  out += [Check(f'The temperature curve f1 gives a higher UA than {f}', s,
                exceeds('ACE-pFL', f'curve {f}'), claim_id='ace_temperature_curve',
                effect=(81.25 - v) / 100,
                effect_text=f'Table XIII, CIFAR-10 beta = 0.1: 81.25 vs {v} '
                f'({81.25 - v:+.2f} points)')
          for f, v in table13.items()]
  for beta, sweep_name in ACEPFL_BETA_SWEEPS.items():
    ace, base = ACEPFL_TABLE3[beta]
    table = 'I' if beta == 0.1 else 'III'
    claim = 'ace_acc_gain' if beta == 0.1 else 'ace_noniid'
    for label, _, _ in ACEPFL_FL_BASELINES:
      out.append(Check(
          f"ACE-pFL's UA exceeds {label}'s global model on the same client test splits "
          f'(beta = {beta:g})', sweep_name,
          exceeds('ACE-pFL', label, key_b='final:server_ua'), claim_id=claim,
          effect=(ace - base[label]) / 100,
          effect_text=f'Table {table}, CIFAR-10 beta = {beta:g}: '
          f'{ace} vs {base[label]} ({ace - base[label]:+.2f} points)'))
    pfl = ACEPFL_PFL_BASELINES
    for label, _, _ in pfl:
      acc = ACEPFL_TABLE3_PFL[beta][label]
      out.append(Check(
          f"ACE-pFL's UA exceeds {label}'s (beta = {beta:g})", sweep_name,
          exceeds('ACE-pFL', label), claim_id=claim, effect=(ace - acc) / 100,
          effect_text=f'Table {table}, CIFAR-10 beta = {beta:g}: {ace} vs {acc} '
          f'({ace - acc:+.2f} points)'))
    ace_gb, gb = ACEPFL_TABLE4_GB[beta]
    for label, _, _ in ACEPFL_FL_BASELINES + pfl:
      if label == 'FedKD':
        # FedKD's bytes follow its training (the SVD keeps the rank that holds the energy
        # share of each update), so they are tested, on the ratio, in the direction of the
        # paper's own table: FedKD sends fewer bytes than ACE-pFL there.
        out.append(Check(
            f'FedKD sends fewer bytes than ACE-pFL (beta = {beta:g})', sweep_name,
            lower('FedKD', 'ACE-pFL', key='total_bytes'), claim_id='ace_comm',
            effect=1 - gb[label] / ace_gb,
            effect_text=f'Table {"II" if beta == 0.1 else "IV"}, CIFAR-10 beta = {beta:g}: '
            f'FedKD {gb[label]} vs ACE-pFL {ace_gb} GB (the one baseline the paper has below '
            'ACE-pFL)'))
        continue
      out.append(Check(
          f'ACE-pFL sends fewer bytes than {label} (beta = {beta:g})', sweep_name,
          bytes_ratio('ACE-pFL', label, key='total_bytes'), claim_id='ace_comm',
          accounting=True, effect=1 - ace_gb / gb[label],
          effect_text=f'Table {"II" if beta == 0.1 else "IV"}, CIFAR-10 beta = {beta:g}: '
          f'{ace_gb} vs {gb[label]} GB (59.12x less on average over the baselines)'))
  return out


def section() -> Section:
  """ACE-pFL's section: its sweeps, checks and notes."""
  ace_checks = tuple(
      Check(f'Removing a component lowers UA: {ab}', s, exceeds('ACE-pFL', ab),
            claim_id='ace_components', effect=ACEPFL_ABLATION_EFFECTS[ab][0],
            effect_text=ACEPFL_ABLATION_EFFECTS[ab][1])
      for s in ('acepfl_digits', 'acepfl_mnist', 'acepfl_mnist_scarce', 'acepfl_scarce_digits')
      for ab in ACEPFL_ABLATIONS) + tuple(
      Check('ACE-pFL beats single-client training', s, exceeds('ACE-pFL', 'Single client'),
            claim_id='ace_vs_single')
      for s in ('acepfl_digits', 'acepfl_mnist', 'acepfl_mnist_scarce',
                'acepfl_scarce_digits')) + (
      Check('ACE-pFL beats a FedMD-style mean of the public logits', 'acepfl_scarce_digits',
            exceeds('ACE-pFL', ACEPFL_FEDMD[0]), claim_id='ace_vs_fedmd'),
      ) + tuple(_rq3_checks()) + tuple(_sizes_checks()) + (
      Check('ACE-pFL beats a FedMD-style mean of the public logits', 'acepfl_digits',
            exceeds('ACE-pFL', ACEPFL_FEDMD[0]), claim_id='ace_vs_fedmd'),
      ) + (
      Check('ACE-pFL beats single-client training in the PyTorch reference too',
            'acepfl_mnist_scarce_torch',
            exceeds(torch_label('acepfl', 'acepfl'), torch_label('acepfl', 'single')),
            claim_id='ace_vs_single', arbiter=True),)
  acepfl = Section(
      key='acepfl', paper='ACE-pFL',
      title='ACE-pFL: clustering, adaptive temperature and triple distillation',
      claim=('Each component matters: on CIFAR-10 (beta = 0.1) clustering, the dynamic '
             'temperature and the triple distillation (L_SD and L_GD) each add 5-11 points of '
             'UA (Tables XI, XII, XIV: 81.25 with all of them; 75.19 without clustering, '
             '75.68 with a fixed temperature, 74.68 double, 70.16 single). ACE-pFL beats every '
             'baseline by 2.97-56.93 points (Table I); the floor any personalised method must '
             'clear is training each client alone, which the checks compare it with.'),
      sweeps=(
          SweepDef('acepfl_digits', 'Digits (embedded), `presets.acepfl_cpu`',
                   ACEPFL_VARIANTS + (ACEPFL_FEDMD,),
                   preset=lambda src: presets.acepfl_cpu(src, 'acepfl'),
                   preset_text='presets.acepfl_cpu(source)',
                   columns=('acc', 'delta', 'best', 'bytes', 'wall'), headers=UA_HEADERS,
                   reference='ACE-pFL', floor='Single client',
                   tiny_variants=('ACE-pFL', 'w/o clustering', 'fixed T = T0')),
          SweepDef('acepfl_scarce_digits',
                   'Digits where collaboration matters: 10 clients of about 10 digits, '
                   'Dirichlet beta = 1.0, `presets.acepfl_scarce_cpu`',
                   ACEPFL_SCARCE_DIGITS_VARIANTS, preset=_scarce(),
                   preset_text='presets.acepfl_scarce_cpu(source)', metrics=('server_ua',),
                   columns=('acc', 'delta', 'best', 'bytes', 'metric:server_ua', 'wall'),
                   headers=UA_HEADERS, reference='ACE-pFL', seeds=SEEDS10,
                   tiny_variants=('ACE-pFL', 'Single client'), floor='Single client',
                   curve_rounds=(1, 3, 7, 14, 21)),
          SweepDef('acepfl_sizes_digits',
                   'The same digits with clients of unequal size (`data.min_size = '
                   f'{ACEPFL_SIZES_MIN}`: 6 to 12 training digits a client on seed 0), for the '
                   'clustering and similarity ablations',
                   ACEPFL_SIZES_VARIANTS, preset=_scarce(min_size=ACEPFL_SIZES_MIN),
                   preset_text='presets.acepfl_scarce_cpu(source), data.min_size = '
                   f'{ACEPFL_SIZES_MIN}', metrics=('server_ua',),
                   columns=('acc', 'delta', 'best', 'bytes', 'wall'),
                   headers=UA_HEADERS, reference='ACE-pFL', seeds=SEEDS10,
                   tiny_variants=('ACE-pFL',), floor='Single client'),
      ) + tuple(
          SweepDef(ACEPFL_BETA_SWEEPS[beta], f'The same clients at beta = {beta:g} (Table {table})',
                   ACEPFL_BETA_VARIANTS, preset=_scarce(beta),
                   preset_text=f'presets.acepfl_scarce_cpu(source), data.alpha = {beta:g}',
                   metrics=('server_ua',),
                   columns=('acc', 'delta', 'best', 'bytes', 'metric:server_ua', 'wall'),
                   headers=UA_HEADERS, reference='ACE-pFL', seeds=SEEDS10,
                   tiny_variants=('ACE-pFL',), floor='Single client')
          for beta, table in ((0.1, 'I'), (10.0, 'III'))) + (
          SweepDef('acepfl_mnist', 'MNIST, `presets.acepfl_cpu`', ACEPFL_VARIANTS,
                   preset=lambda src: presets.acepfl_cpu(src, 'acepfl'),
                   preset_text='presets.acepfl_cpu(source)', data='mnist',
                   columns=('acc', 'delta', 'best', 'bytes', 'wall'), headers=UA_HEADERS,
                   reference='ACE-pFL', floor='Single client'),
          SweepDef('acepfl_mnist_scarce',
                   'MNIST where collaboration matters: 20 clients of 50 images, Dirichlet '
                   'beta = 1.0, `presets.acepfl_scarce_cpu`', ACEPFL_VARIANTS,
                   preset=lambda src: presets.acepfl_scarce_cpu(src, 'acepfl'),
                   preset_text='presets.acepfl_scarce_cpu(source)', data='mnist',
                   columns=('acc', 'delta', 'best', 'bytes', 'wall'), headers=UA_HEADERS,
                   reference='ACE-pFL', curve_rounds=(1, 3, 7, 14, 21),
                   floor='Single client'),
          SweepDef('acepfl_mnist_scarce_torch',
                   'The same setting in the independent implementation: PyTorch ACE-pFL and '
                   'single-client training from PyTorch\'s default initialisation '
                   '(`benchmarks/references/pytorch/acepfl.py`)', torch_variants(*TORCH_ACEPFL),
                   preset=lambda src: presets.acepfl_scarce_cpu(src, 'acepfl'),
                   preset_text='presets.acepfl_scarce_cpu(source)', data='mnist',
                   engine='torch', torch_module='acepfl', metrics=('temperature',),
                   columns=('acc', 'delta', 'best'), headers=UA_HEADERS,
                   reference=torch_label('acepfl', 'acepfl'), curve_rounds=(1, 3, 7, 14, 21),
                   beside=(('acepfl_mnist_scarce', ('ACE-pFL', 'Single client')),)),
          SweepDef('acepfl_mnist_torchinit',
                   'MNIST with PyTorch\'s default initialisation (`model.init=torch`), first '
                   '15 rounds', ACEPFL_TORCHINIT_VARIANTS,
                   preset=lambda src: presets.acepfl_cpu(src, 'acepfl'),
                   preset_text='presets.acepfl_cpu(source)', data='mnist',
                   columns=('acc', 'delta', 'best'), headers=UA_HEADERS,
                   reference='ACE-pFL, PyTorch init',
                   overrides=(('rounds', 15),)),
          SweepDef('acepfl_mnist_torch',
                   'fedjax_kd against an independent implementation: PyTorch ACE-pFL '
                   '(`benchmarks/references/pytorch/acepfl.py`)', torch_variants(*TORCH_ACEPFL),
                   preset=lambda src: presets.acepfl_cpu(src, 'acepfl'),
                   preset_text='presets.acepfl_cpu(source)', data='mnist', engine='torch',
                   torch_module='acepfl', metrics=('temperature', 'teacher_acc'),
                   columns=('acc', 'delta', 'best', 'metric:teacher_acc'), headers=UA_HEADERS,
                   reference=torch_label('acepfl', 'acepfl'),
                   curve_rounds=(1, 2, 3, 5, TORCH_ACEPFL_ROUNDS, 15),
                   beside=(('acepfl_mnist_torchinit',
                            tuple(label for label, _, _ in ACEPFL_TORCHINIT_VARIANTS)),
                           ('acepfl_mnist', ('ACE-pFL', 'Single client'))),
                   pairs=tuple(zip((label for label, _, _ in ACEPFL_TORCHINIT_VARIANTS),
                                   (label for label, _, _ in torch_variants(*TORCH_ACEPFL))))
                   + (('ACE-pFL', torch_label('acepfl', 'acepfl')),),
                   paired_rounds=(1, 2, 3, 5, TORCH_ACEPFL_ROUNDS),
                   overrides=(('rounds', TORCH_ACEPFL_ROUNDS),)),
      ),
      checks=ace_checks + tuple(
          c for (ours, _, _), (ref, _, _) in zip(ACEPFL_TORCHINIT_VARIANTS,
                                                 torch_variants(*TORCH_ACEPFL))
          for c in pair_checks('acepfl_mnist_torch', ours, ref, (3, 5, TORCH_ACEPFL_ROUNDS))
      ) + (Check('ACE-pFL beats single-client training in the PyTorch reference',
                 'acepfl_mnist_torch',
                 exceeds(torch_label('acepfl', 'acepfl'), torch_label('acepfl', 'single')),
                 claim_id='ace_vs_single', arbiter=True),
           Check('ACE-pFL beats single-client training in fedjax_kd with the same '
                 'initialisation', 'acepfl_mnist_torch',
                 exceeds('ACE-pFL, PyTorch init', 'Single client, PyTorch init'),
                 claim_id='ace_vs_single', arbiter=True)),
      notes=('† UA = mean personalised test accuracy (per-client test splits). Δ is each '
             'variant\'s final UA minus ACE-pFL\'s on the same seed, then mean ± std over '
             'seeds; "removing a component lowers UA" holds when ACE-pFL minus the ablation '
             'is positive by a one-sided paired t-test at p < 0.05 over at least five seeds. '
             'Bytes follow the `acepfl` rules for every method; FedAvg, FedProx and SCAFFOLD '
             '(one architecture, the largest CNN; SCAFFOLD at lr 0.02) are scored by their '
             'global model on every client\'s own test split (`server_ua`), the splits '
             'ACE-pFL\'s UA uses. Its personalised baselines (Table I) are scored by their '
             'own UA: Per-FedAvg, pFedMe and FedALA on the largest CNN for every client '
             '(they exchange parameters; Per-FedAvg\'s meta step and pFedMe\'s step sizes at '
             'the setting\'s 0.05, where their papers\' MNIST values barely move these CNNs '
             'or overflow them), FedDF, KT-pFL and FedKD on ACE-pFL\'s own models, at every '
             'beta; FedKD\'s bytes follow its training (the rank its SVD keeps), so they are '
             'tested, not counted. CD2-pFed and FedAD are not implemented '
             '(their papers\' texts are not available here). The PyTorch ACE-pFL '
             '(`benchmarks/references/pytorch/acepfl.py`: exact 1-D k-means on the label-histogram '
             'distances to a reference client it draws itself, Eq. 2\'s temperature, Eq. 3\'s '
             'cluster weights, Eq. 4\'s four losses in its own loop) runs ACE-pFL and '
             'single-client training for 10 rounds from PyTorch\'s default initialisation, '
             'beside fedjax_kd with `model.init=torch`. '
             '**Why a second MNIST setting.** In `presets.acepfl_cpu` a client holds a '
             'median 272 images with Dirichlet beta = 0.1: on average 4.2 classes, 72% of them '
             'in one class (seeds 0-4), so each client learns its own test split alone, '
             'single-client training reaches ~0.96 UA and there is nothing left for ACE-pFL '
             '(or any of its components) to add. The paper\'s regime is the opposite: on '
             'CIFAR-10 a client cannot learn its classes from its own 2,500 images (its '
             'table\'s pFL baselines sit at 50-80%). `presets.acepfl_scarce_cpu` keeps the '
             'models, D0 and loss and makes the local data too small to learn alone: 20 '
             'clients of a median 52 images (17-81), the paper\'s Dirichlet beta = 1.0 '
             '(Table III), so a client sees 8.2 classes on average with 33% in its largest; '
             '5 local epochs a round (the paper trains "several"), so single-client training '
             'is converged well before round 21 (it gains 0.006 after round 10), and '
             'r0 = 7 so the temperature passes the paper\'s three stages in 21 rounds. The '
             'gain includes what D0\'s labels teach through L_CE, which is part of ACE-pFL '
             'as the paper defines it (Eq. 4); the ablations keep L_CE and measure each '
             'component on top of it. The PyTorch ACE-pFL runs the same setting from '
             'PyTorch\'s default initialisation. On the embedded digits the scarce setting '
             'gives 10 clients about ten digits each; there the report runs the ablations, '
             'RQ3\'s design choices (Tables V, VII, IX, X, XIII) and the parameter-exchange '
             'baselines at beta = 0.1, 1.0 and 10 (Tables I and III).'))
  return acepfl
