"""Each baseline's authors' repository, at the commit its lock-step ran against, and why the
rest have none (a leaf: ``fetch.sh`` reads it with a bare Python)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Repo:
  """A baseline's authors' repository at the commit the lock-step ran against.

  Attributes:
    slug: ``owner/name`` on GitHub.
    commit: the commit every driver is checked against (a checkout at another one is refused).
    files: the files of theirs the driver imports and runs.
  """
  slug: str
  commit: str
  files: tuple[str, ...]

  @property
  def folder(self) -> str:
    return self.slug.replace('/', '+')

  @property
  def url(self) -> str:
    return f'https://github.com/{self.slug}'


REPOS: dict[str, Repo] = {
    'fedrs': Repo('lxcnju/FedRepo', '617ee015046409d95dbd76ba39eebb92d313ab94',
                  ('algorithms/fedrs.py',)),
    'fedala': Repo('TsingZ0/FedALA', 'a7a9b21342859005f22fc0bffbdb1846975de53b',
                   ('system/utils/ALA.py', 'system/flcore/clients/clientALA.py',
                    'system/flcore/servers/serverALA.py')),
    'pfedme': Repo('CharlieDinh/pFedMe', 'caf24b1f954d4381bd9b4d104ee7eff389e1489b',
                   ('FLAlgorithms/optimizers/fedoptimizer.py',
                    'FLAlgorithms/users/userpFedMe.py', 'FLAlgorithms/servers/serverpFedMe.py')),
    'perfedavg': Repo('CharlieDinh/pFedMe', 'caf24b1f954d4381bd9b4d104ee7eff389e1489b',
                       ('FLAlgorithms/optimizers/fedoptimizer.py',
                        'FLAlgorithms/users/userperavg.py')),
    'kt_pfl': Repo('cugzj/KT-pFL', 'a08a01f34bc8ae97a8063439a0a9d89ed8441b60',
                   ('src/engine_kt_pfl.py',)),
    'scdpfl': Repo('jimmyc96/spectral-dis-FL', '9f6363b10dbc6c2a75013579baae9555488d880e',
                   ('util/update.py', 'util/fedavg.py', 'main.py')),
    'mtfl': Repo('JedMills/MTFL-For-Personalised-DNNs', 'b46682201b34a07502e1bc0b7817f69e29f9b280',
                 ('fl_algs.py', 'optimisers.py')),
    'knn_per': Repo('omarfoq/knn-per', 'ee1752027798e8ab8f57f77c6ee74f946c0f4cd7',
                    ('client.py', 'datastore.py', 'aggregator.py', 'learners/learner.py',
                     'eval_knnper.py', 'utils/optim.py')),
    'feddf': Repo('epfml/federated-learning-public-code',
                  '44dd5551071969eb354ee2ed091a9ba36c1d5b08',
                  ('codes/FedDF-code/pcode/aggregation/noise_knowledge_transfer.py',)),
    'fedcache': Repo('wuzhiyuan2000/FedCache', '598c63f73a4f6c862fe26eb3d310167b079b3c45',
                     ('FedCache.py',)),
    'fedconcat': Repo('sjtudyq/FedConcat', '6123be7aaa2e39578bd1ed63c54dfb098fa2a8e4',
                      ('experiments.py',)),
}


# The baselines without a lock-step, and why.
NOT_LOCKSTEPPED: dict[str, str] = {
    'fedkd': (
        "the authors' code (wuch15/FedKD at 9b9e63f) cannot run here: run.py imports tnlrv3 "
        '(Turing NLR v3, in neither the repository nor PyPI) and trains BERT mentors on MIND '
        'news logs; its update compression is inline in train(), not a function to call. '
        "PFLlib's FedKD (clientkd.py) is another method: it compresses the mentee's "
        'parameters, not their update, learns a projection W_h for the hidden loss and clips '
        "gradients at 10, so a lock-step against it would test PFLlib's choices. FedKD's "
        'formulas are checked against a transcription of run.py by hand '
        '(tests/test_baselines_fedkd.py); the two ways the code departs from the paper '
        '(KLDivLoss averaging over classes, the hidden loss added twice) are named in '
        'docs/papers.md'),
    'fedlc': (
        'its authors published no code. PFLlib\'s FedLC (serverlc.py) calibrates every client '
        "with the label counts summed over all clients, not the client's own n_{k,c} of the "
        "paper's Eq. 8, so it is not the paper's method; fedjax_kd's loss is checked by hand "
        '(tests/test_baselines_labelskew.py) and matches the client-local formula of FL-bench '
        'and fluke'),
    'kl_selection': (
        "Seol and Kim's selection (Sensors 2023, Algorithm 2), which FedEntOpt runs as its KL "
        'baseline, has no public code; it is checked by hand on label counts '
        '(tests/test_baselines_labelskew.py)'),
}
