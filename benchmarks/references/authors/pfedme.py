"""pFedMe (Dinh, Tran and Nguyen, NeurIPS 2020) beside its authors' code: CharlieDinh/pFedMe.

Their server ``FLAlgorithms/servers/serverpFedMe.py:pFedMe`` runs unchanged, its own
``train()`` loop included (``send_parameters``, every user's ``UserpFedMe.train``,
``select_users``, ``persionalized_aggregate_parameters``: the ``n_k``-weighted mean mixed
with the previous global model by ``beta``), with their users
(``FLAlgorithms/users/userpFedMe.py``) and their ``pFedMeOptimizer``
(``FLAlgorithms/optimizers/fedoptimizer.py``: the K inner steps on one minibatch, warm
started, then ``w_k -= lr lam (w_k - theta)``). Around them the driver supplies:

* the data: ``read_data`` / ``read_user_data`` (their server module's names for their JSON
  readers) give each user fedjax_kd's training rows of that client and the shared test set;
  each round the user's ``trainloader`` is a :class:`common.Batches` of fedjax_kd's
  minibatches of that client and round (phase ``'train'``), its ``iter_trainloader`` is
  restarted, and its ``local_epochs`` (their R, the minibatches one round takes through
  ``get_next_train_batch``) is set to their count, ``epochs * ceil(n_k / B)``;
* the model: fedjax_kd's MLP as a ``torch.nn.Sequential`` of logits, passed as
  ``(model, 'Mclr_CrossEntropy')`` so their users take ``nn.CrossEntropyLoss`` (the same
  loss as their ``log_softmax`` models with ``NLLLoss``);
* the args: lam, K, personal lr, lr (their ``learning_rate``, eta), beta from fedjax_kd's
  ``pfedme.*``; ``numusers`` = every user (their ``select_users`` then returns all);
* observation only: a subclass of ``UserpFedMe`` records ``theta_k`` (the model's
  parameters when ``train`` calls ``update_parameters(self.local_model)``, i.e. after the
  last inner solve) and a subclass of their server compares every ``theta_k`` and the
  global model after ``persionalized_aggregate_parameters``; its ``save_results`` /
  ``save_model`` (h5 and ``torch.save`` files) are skipped;
* ``h5py``, ``torchvision`` (imported by their ``serverbase.py`` / ``utils/model_utils.py``,
  never called here) as empty modules.

Run-time setting of theirs (not a code change): their users build ``pFedMeOptimizer`` with
its default ``mu = 0.001``, an extra L2 term ``mu * theta`` in the inner step that is not in
the paper; fedjax_kd leaves it out (``fedjax_kd/algorithms/pfedme.py`` module doc), so the
lock-step sets the optimizer's ``mu`` to 0; ``mu_effect`` measures their default.

fedjax_kd runs ``pfedme.weighted=True`` (their ``n_k`` weights; here all clients hold 165
rows, so it equals the paper's plain mean) and its defaults otherwise (lam 15, K 5,
personal lr 0.09, lr 0.005, beta 1); ``beta`` other than 1 (the fine-tuned runs' 2) tests
the server mix.

Found beside the lock-step: ``persionalized_model_bar`` (what their
``evaluate_personalized_model`` scores) is ``optimizer.step``'s ``group['params']``, the very
``nn.Parameter`` objects of the user's model, which ``train`` then overwrites with the local
model ``w_k``; their "personal" accuracy is therefore ``w_k``'s, not ``theta_k``'s (fedjax_kd's
``test_acc`` is ``theta_k``'s, as in the paper). ``lockstep`` reports both.
"""

from __future__ import annotations

import copy

import numpy as np

from benchmarks.references.authors import common


# What the repository's modules import but the lock-steps never call.
STUBS = ('h5py', 'torchvision', 'torchvision.transforms')


def their_readers(run: common.Ours):
  """``(data, read_data, read_user_data)``: each client's training rows, and the
  repository's two data readers (``utils/model_utils.py``) returning fedjax_kd's rows, the
  server's test set as every user's test data."""
  import torch  # pylint: disable=g-import-not-at-top
  s = run.setting
  k_clients = len(s.client_rows)
  data = [run.client_data(k) for k in range(k_clients)]
  test = list(zip(common.nchw(s.x_test), torch.from_numpy(np.asarray(s.y_test, np.int64))))

  def read_data(dataset):
    del dataset
    return [str(k) for k in range(k_clients)], [], {}, {}

  def read_user_data(i, data_, dataset):
    del data_, dataset
    x, y = common.nchw(data[i][0]), torch.from_numpy(np.asarray(data[i][1], np.int64))
    return str(i), list(zip(x, y)), test

  return data, read_data, read_user_data


def quiet_server(clock: dict):
  """A mixin for their servers: ``clock['t']`` counts the rounds (a round starts with
  ``send_parameters``), and nothing is written to disk."""

  class Quiet:
    def send_parameters(self):
      clock['t'] += 1
      super().send_parameters()

    def save_results(self):
      pass

    def save_model(self):
      pass

  return Quiet


def config(rounds: int = 3, seed: int = 0, beta: float = 1.0):
  return common.tiny('pfedme', rounds, seed=seed,
                     **{'pfedme.weighted': True, 'pfedme.beta': beta})


def lockstep(path: str, seed: int = 0, rounds: int = 3, beta: float = 1.0, mu: float = 0.0,
             ours_run: common.Ours | None = None) -> common.Result:
  """Runs their pFedMe server beside fedjax_kd's ``config(rounds, seed, beta)``.

  Args:
    path: the checkout of CharlieDinh/pFedMe.
    seed: the experiment's seed.
    rounds: whole rounds.
    beta: pFedMe's server mix (both sides).
    mu: their optimizer's extra L2 weight (0: aligned with the paper and fedjax_kd; their
      default is 0.001).
    ours_run: fedjax_kd's run of ``config(rounds, seed, beta)``, if already played.

  Returns:
    per round, the largest difference over every ``theta_k`` and the global model; the mean
    accuracy of the ``theta_k`` on the test set (fedjax_kd's ``test_acc``) on both sides.
  """
  torch = common.need_torch()
  run = ours_run or common.ours(config(rounds, seed, beta))
  s = run.setting
  o = s.experiment.algorithm.options
  epochs, batch_size, _ = s.train
  k_clients = len(s.client_rows)
  data, read_data, read_user_data = their_readers(run)

  def with_params(model, params):
    m = copy.deepcopy(model)
    with torch.no_grad():
      for p, q in zip(m.parameters(), params):
        p.copy_(q)
    return m

  diffs, acc_theta, acc_glob, acc_w = [], [], [], []
  clock = {'t': 0}
  with common.imported_from(path, {name: common.stub(name) for name in STUBS}):
    import FLAlgorithms.servers.serverpFedMe as mod  # pylint: disable=g-import-not-at-top
    mod.read_data, mod.read_user_data = read_data, read_user_data

    class User(mod.UserpFedMe):
      """Their pFedMe user, fed fedjax_kd's minibatches; records ``theta_k``."""

      def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.k = int(self.id)
        self.optimizer.param_groups[0]['mu'] = mu
        n = len(data[self.k][1])
        self.trainloader = common.Batches(*data[self.k], -(-n // batch_size))
        self.theta, self._record = None, False

      def train(self, epochs):
        steps = run.order(clock['t'], self.k, 'train', len(data[self.k][1]), epochs,
                          batch_size)
        self.trainloader.steps = steps
        self.iter_trainloader = iter(self.trainloader)
        self.local_epochs = len(steps)
        self._record = True
        try:
          return super().train(epochs)
        finally:
          self._record = False

      def update_parameters(self, new_params):
        if self._record:   # train's last call: the model holds theta_k
          self.theta = [p.detach().clone() for p in self.model.parameters()]
        super().update_parameters(new_params)

    mod.UserpFedMe = User

    class Server(quiet_server(clock), mod.pFedMe):
      """Their pFedMe server; every model compared after each round's aggregation."""

      def persionalized_aggregate_parameters(self):
        super().persionalized_aggregate_parameters()
        t = clock['t']
        thetas = [with_params(self.model, u.theta) for u in self.users]
        d = [common.max_diff(m, run.client(t, u.k)) for m, u in zip(thetas, self.users)]
        diffs.append(max(d + [common.max_diff(self.model, run.server(t))]))
        acc_theta.append(float(np.mean([common.accuracy(m, s.x_test, s.y_test)
                                        for m in thetas])))
        acc_glob.append(common.accuracy(self.model, s.x_test, s.y_test))
        acc_w.append(float(self.rs_glob_acc_per[-1]))   # their own "personal" accuracy

    model = common.torch_model(run, run.server(0))
    server = Server(torch.device('cpu'), 'lockstep', 'pFedMe', (model, 'Mclr_CrossEntropy'),
                    batch_size, float(o.lr), float(beta), float(o.lam), len(run.rows), epochs,
                    'SGD', k_clients, int(o.inner_steps), float(o.personal_lr), 0)
    np.random.seed(seed)
    server.train()
  return common.Result(
      baseline='pfedme', repo=common.REPOS['pfedme'], rounds=len(run.rows), param_diff=diffs,
      acc_ours=[r['test_acc'] for r in run.rows], acc_theirs=acc_theta,
      what='every personalised theta_k and the global model after each round; test_acc: '
           'mean test accuracy of the theta_k',
      notes=(f'pfedme.weighted=True, beta={beta}; their optimizer mu={mu}',
             'global model test accuracy ours '
             f'{[round(r["global_acc"], 4) for r in run.rows]} theirs '
             f'{[round(a, 4) for a in acc_glob]}',
             "their logged personal accuracy (rs_glob_acc_per, the w_k: persionalized_model_bar "
             f"aliases the model's parameters) {[round(a, 4) for a in acc_w]}"))


def mu_effect(path: str, seed: int = 0, rounds: int = 3) -> common.Result:
  """The lock-step with their optimizer's default ``mu = 0.001`` (not in the paper)."""
  return lockstep(path, seed, rounds, mu=0.001)
