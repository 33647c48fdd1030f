"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020) beside pFedMe's authors' code.

The Per-FedAvg paper has no code of its own; the reference implementation is the one in
CharlieDinh/pFedMe that pFedMe's paper compares with. Their server
``FLAlgorithms/servers/serverperavg.py:PerAvg`` runs unchanged, its own ``train()`` loop
included (``send_parameters``, ``evaluate_one_step``, ``select_users``, every selected
user's ``UserPerAvg.train``, ``aggregate_parameters``: the ``n_k``-weighted mean), with
their users (``FLAlgorithms/users/userperavg.py``: per local step, a ``MySGD`` step of size
``learning_rate`` = alpha on one batch ``D``, the gradient at that point on the next batch
``D'``, the parameters restored, a step of size ``beta``: first-order Per-FedAvg) and their
``MySGD`` (``FLAlgorithms/optimizers/fedoptimizer.py``). Around them the driver supplies:

* the data: ``read_data`` / ``read_user_data`` (their server module's names for their JSON
  readers) give each user fedjax_kd's training rows of that client and the shared test set.
  fedjax_kd takes one minibatch of ``B`` a meta step and splits it into interleaved halves
  (batch positions ``i % 2 == 0`` are ``D``, odd ones ``D'``; a half with no real sample
  uses the whole batch, ``fedjax_kd/core/program.py:part_grad_fns``). Each round the
  user's ``trainloader`` is a :class:`common.Batches` yielding ``D_1, D'_1, D_2, D'_2, ...``
  of fedjax_kd's minibatches of that client and round (phase ``'train'``), in the order
  their two ``get_next_train_batch`` calls a step take them; its ``iter_trainloader`` is
  restarted and its ``local_epochs`` (their local steps) set to fedjax_kd's count,
  ``epochs * ceil(n_k / B)``;
* the model: fedjax_kd's MLP as a ``torch.nn.Sequential`` of logits, passed as
  ``(model, 'Mclr_CrossEntropy')`` so their users take ``nn.CrossEntropyLoss``;
* the args: alpha (their ``learning_rate``) and beta from fedjax_kd's ``perfedavg.*``;
  ``numusers`` = every user;
* observation only: a subclass of their server compares every local model and the global
  model after ``aggregate_parameters``; its ``save_results`` / ``save_model`` (h5 and
  ``torch.save`` files) are skipped;
* the accuracy: fedjax_kd's ``test_acc`` personalises the global model by ``eval_steps`` = 1
  SGD step of size alpha on a minibatch of the client's *training* rows drawn from
  fedjax_kd's own key (the engine's ``order='random'`` batches, ``program.random_batch``,
  phase ``'custom'``, round 0); the driver
  draws that same batch and takes the step with their ``MySGD`` on their global model.
  Their own ``evaluate_one_step`` (``serverbase.py``/``UserPerAvg.train_one_step``) instead
  adapts on two *test* batches with an alpha step then a beta step, before each round; its
  logged accuracy (``rs_glob_acc_per``) is reported beside, not compared (a documented
  choice of fedjax_kd, docs/papers.md "### Per-FedAvg");
* ``h5py``, ``torchvision`` (imported by their ``serverbase.py`` / ``utils/model_utils.py``,
  never called here) as empty modules.

No patch of their code. fedjax_kd runs ``perfedavg.weighted=True`` (their ``n_k`` weights;
here every client holds 165 rows, so it equals the paper's plain mean), ``variant='fo'``
(their code's only variant, fedjax_kd's default) and its defaults alpha 0.01, beta 0.001;
``beta`` is a parameter so that a larger meta step (0.05) makes any difference of the meta
step show sooner.
"""

from __future__ import annotations

import copy

import numpy as np

from benchmarks.references.authors import common
from benchmarks.references.authors import pfedme

PARTS = 2   # D, D' per meta step (first order)


def config(rounds: int = 3, seed: int = 0, beta: float = 0.001):
  return common.tiny('perfedavg', rounds, seed=seed,
                     **{'perfedavg.weighted': True, 'perfedavg.variant': 'fo',
                        'perfedavg.beta': beta})


def halves(run: common.Ours, t: int, k: int, n: int, epochs: int,
           batch_size: int) -> list[np.ndarray]:
  """Client ``k``'s batches of round ``t``, ``D_1, D'_1, D_2, D'_2, ...``: each of
  fedjax_kd's minibatches split as its ``program.part_grad_fns`` splits it."""
  pos = run.lockstep.order(t, k, 'train', n, n, epochs, batch_size)
  part_of = np.arange(batch_size) % PARTS
  out = []
  for p in pos:
    valid = p < n
    if not valid.any():
      continue
    for j in range(PARTS):
      m = valid & (part_of == j)
      out.append(p[m if m.any() else valid].astype(np.int64))
  return out


def adapt_batches(run: common.Ours, batch_size: int) -> list[np.ndarray]:
  """Per client, the positions (into its training rows) of the one minibatch fedjax_kd's
  evaluation adapts on (``PerFedAvg.personalized``, the ``Adapt`` program's step 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import rng  # pylint: disable=g-import-not-at-top
  d = run.exp.ctx.data
  k_clients = len(run.setting.client_rows)
  keys = rng.client_keys(run.exp.ctx.root, 0, np.arange(k_clients), 'custom')
  n_max = int(d.client_idx.shape[1])
  out = []
  for k in range(k_clients):
    n = len(run.setting.client_rows[k])
    k_pos = jax.random.split(jax.random.fold_in(keys[k], 0), 3)[0]
    p = np.asarray(program.random_batch(k_pos, n_max, jax.numpy.int32(n), batch_size))
    out.append(p[p < n].astype(np.int64))
  return out


def lockstep(path: str, seed: int = 0, rounds: int = 3, beta: float = 0.001,
             ours_run: common.Ours | None = None) -> common.Result:
  """Runs their Per-FedAvg server beside fedjax_kd's ``config(rounds, seed, beta)``.

  Returns:
    per round, the largest difference over every local model and the global model; the
    mean test accuracy of the personalised models (fedjax_kd's ``test_acc``) on both sides.
  """
  torch = common.need_torch()
  run = ours_run or common.ours(config(rounds, seed, beta))
  s = run.setting
  o = s.experiment.algorithm.options
  assert int(o.eval_steps) == 1, 'the driver reproduces one adaptation step'
  epochs, batch_size, _ = s.train
  k_clients = len(s.client_rows)
  data, read_data, read_user_data = pfedme.their_readers(run)
  adapt = adapt_batches(run, batch_size)

  diffs, acc_p, acc_glob = [], [], []
  clock = {'t': 0}
  with common.imported_from(path, {name: common.stub(name) for name in pfedme.STUBS}):
    import FLAlgorithms.servers.serverperavg as mod  # pylint: disable=g-import-not-at-top
    from FLAlgorithms.optimizers.fedoptimizer import MySGD  # pylint: disable=g-import-not-at-top
    mod.read_data, mod.read_user_data = read_data, read_user_data

    def personalised_acc(model, k) -> float:
      """fedjax_kd's evaluation rule on ``model``: one alpha step with their MySGD."""
      m = copy.deepcopy(model)
      opt = MySGD(m.parameters(), lr=float(o.alpha))
      x, y = data[k]
      j = adapt[k]
      m.train()
      opt.zero_grad()
      torch.nn.functional.cross_entropy(m(common.nchw(x[j])),
                                        torch.from_numpy(np.asarray(y[j], np.int64))).backward()
      opt.step()
      return common.accuracy(m, s.x_test, s.y_test)

    class User(mod.UserPerAvg):
      """Their Per-FedAvg user, fed fedjax_kd's minibatch halves."""

      def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.k = int(self.id)
        n = len(data[self.k][1])
        self.trainloader = common.Batches(*data[self.k], PARTS * -(-n // batch_size))

      def train(self, epochs):
        steps = halves(run, clock['t'], self.k, len(data[self.k][1]), epochs, batch_size)
        self.trainloader.steps = steps
        self.iter_trainloader = iter(self.trainloader)
        self.local_epochs = len(steps) // PARTS
        return super().train(epochs)

    mod.UserPerAvg = User

    class Server(pfedme.quiet_server(clock), mod.PerAvg):
      """Their Per-FedAvg server; every model compared after each round's aggregation."""

      def aggregate_parameters(self):
        super().aggregate_parameters()
        t = clock['t']
        d = [common.max_diff(u.model, run.client(t, u.k)) for u in self.users]
        diffs.append(max(d + [common.max_diff(self.model, run.server(t))]))
        acc_p.append(float(np.mean([personalised_acc(self.model, k)
                                    for k in range(k_clients)])))
        acc_glob.append(common.accuracy(self.model, s.x_test, s.y_test))

    model = common.torch_model(run, run.server(0))
    server = Server(torch.device('cpu'), 'lockstep', 'PerAvg', (model, 'Mclr_CrossEntropy'),
                    batch_size, float(o.alpha), float(beta), 0.0, len(run.rows), epochs,
                    'SGD', k_clients, 0)
    np.random.seed(seed)
    server.train()
    logged = [float(a) for a in server.rs_glob_acc_per]
  return common.Result(
      baseline='perfedavg', repo=common.REPOS['perfedavg'], rounds=len(run.rows),
      param_diff=diffs, acc_ours=[r['test_acc'] for r in run.rows], acc_theirs=acc_p,
      what='every local model and the global model after each round; test_acc: the global '
           'model after one alpha step on a training minibatch (fedjax_kd rule), mean over '
           'clients',
      notes=(f'perfedavg.weighted=True, variant=fo, alpha={o.alpha}, beta={beta}',
             'global model test accuracy ours '
             f'{[round(r["global_acc"], 4) for r in run.rows]} theirs '
             f'{[round(a, 4) for a in acc_glob]}',
             'their own logged evaluate_one_step accuracy (alpha then beta step on test '
             f'batches, before rounds 1..{len(run.rows)}) {[round(a, 4) for a in logged]}'))
