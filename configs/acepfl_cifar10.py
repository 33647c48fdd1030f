"""ACE-pFL, the paper's CIFAR-10 setting: 20 clients, 300 rounds, four architectures.

GoogLeNet / VGG-16 / ResNet-34 / ResNet-50 (5 clients each), labelled public set of
6,000 images, top-K 5, |V| = 3, dynamic temperature T0 = 30, triple distillation.
Needs an accelerator (about 0.1 G parameters in all) and CIFAR-10 (tfds downloads it;
or --config.data.source=npz:/path/cifar10.npz). The optional argument picks the
non-IID setting of Tables I-IV: dir0.1 (default), dir1.0, dir10, pat2, pat5, pat7.

  python -m fedjax_kd.main --config=configs/acepfl_cifar10.py:pat2 --workdir=runs/ace_c10_pat2

Ablations (Tables XI, XII, XIV): --config.acepfl.clustering=False,
--config.acepfl.dynamic_temperature=False, --config.acepfl.distillation=single|double.
Baselines on the same seed: --config.algorithm=fedmd | dsfl | single.
"""

from fedjax_kd.config import presets


def get_config(setting: str = 'dir0.1'):
  return presets.acepfl_paper(setting or 'dir0.1')
