"""ACE-pFL on the embedded digits: 10 clients (two CNN widths and an MLP), Dirichlet 0.1.

``:scarce`` is the setting where collaboration matters (``presets.acepfl_scarce_cpu``):
10 clients x ~10 digits, Dirichlet 1.0, 5 local epochs, 21 rounds.

``:baselines`` is the scarce setting on one architecture (the largest CNN for every client), so
ACE-pFL and its baselines of Table I that fedjax_kd has run in one sweep:

  python -m fedjax_kd.sweep --config=configs/acepfl_digits.py:baselines \
      --algorithms=acepfl,fedavg,fedprox,scaffold,fedala,feddf,kt_pfl,fedkd \
      --variant 'pfedme=pfedme;pfedme.personal_lr=0.05;pfedme.lr=0.05' \
      --variant 'perfedavg=perfedavg;perfedavg.beta=0.05' \
      --seeds=0,1,2 --out=runs/ace_baselines --jobs=2

(pFedMe's and Per-FedAvg's step sizes at the setting's learning rate, as the report runs them:
their papers' MNIST defaults overflow or barely move these CNNs in 21 rounds.)

Runs in about a minute on a 2-core CPU, no download (docs/configs.md has the sweep's cost).

  python -m fedjax_kd.main --config=configs/acepfl_digits.py --workdir=runs/ace_digits
  python -m fedjax_kd.main --config=configs/acepfl_digits.py:scarce --workdir=runs/ace_scarce
"""

from fedjax_kd.config import presets


def get_config(setting: str = ''):
  if setting in ('scarce', 'baselines'):
    c = presets.acepfl_scarce_cpu('digits')
    if setting == 'baselines':   # parameter exchange (FedAvg ... FedALA): one model spec
      c.clients.models = ['cnn@1.0']
      c.server.model = 'cnn@1.0'
    return c
  if setting:
    raise ValueError(f"configs/acepfl_digits.py:{setting}: expected no argument, ':scarce' or "
                     "':baselines'")
  return presets.acepfl_cpu('digits')
