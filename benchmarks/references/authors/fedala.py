"""FedALA (Zhang et al., AAAI 2023) beside its authors' code: TsingZ0/FedALA's ``system/``.

Their classes run unchanged, their server's own ``train()`` loop included: ``FedALA``
(``flcore/servers/serverALA.py``: client sampling, ``send_models`` calling every client's
``local_initialization``, the per-round evaluation, the local training, the sample-weighted
average), ``clientALA`` (``flcore/clients/clientALA.py``: the local SGD steps) and ``ALA``
(``utils/ALA.py``: the adaptive local aggregation, its weight learning, the stop rule of the
first call and the switch-off while the received and local models coincide). Around them the
driver supplies:

* the data: ``read_client_data`` (their ``utils/data_utils.py``, which reads
  ``../dataset/<name>/{train,test}/<id>.npz``) is replaced by one that returns fedjax_kd's
  rows of client ``id`` (train) or fedjax_kd's test rows of that client (the server test set
  when the config makes no per-client split), as their ``[(x, y), ...]`` lists of tensors;
  their ALA samples its rows from that list, in that order;
* the minibatches: a subclass of ``clientALA`` whose ``load_train_data`` yields fedjax_kd's
  minibatches of the client and round (phase ``'train'``, one epoch per pass, the partial
  last batch kept) instead of their ``DataLoader(shuffle=False, drop_last=True)``; the run
  with their ``drop_last=True`` (fedjax_kd's order less its partial last batch) is measured
  beside (``drop_last=True``), see the report;
* ALA's sample: ``ALA.py`` draws its start with ``random.randint(0, n - rand_num)`` (Python's
  ``random``); the driver replaces the ``random`` module ALA.py sees by one whose ``randint``
  returns fedjax_kd's draw for that client and round (the ALA program's window,
  ``fedjax_kd/core/program.py`` ``window_sampler``:
  ``jax.random.randint(split(key)[0], (), 0, n - num + 1)`` with the client's
  key of phase ``'custom'``, ``rng.client_keys(root, t, [k], 'custom')``), after checking
  that both sides' sample sizes agree (``int(0.8 n)`` and ``n * 80 // 100``);
* the model: ``args.model`` is fedjax_kd's MLP as a ``torch.nn.Sequential`` holding the
  global model's initial weights (fedjax_kd's clients take the global model in round 1; their
  clients start from copies of ``args.model``, the server's too);
* the args: fedjax_kd's learning rate, batch size and local epochs (their ``local_steps``
  are epochs), ``eta = 1``, ``rand_percent = 80``, ``layer_idx = 2`` (their ``run_me.sh`` and
  ``main.py`` defaults: the head's weight and bias, fedjax_kd's ``fedala.layers = 1``),
  ``join_ratio = 1``, ``global_rounds = rounds - 1`` (their loop runs ``global_rounds + 1``).

Their server's ``set_clients`` is given the subclass above, and ``aggregate_parameters`` is
wrapped to compare, after each round, every local model (after its local training) and the
new global model with fedjax_kd's, and to score them on the same test rows. Their own
evaluation (after ALA, before training) runs as written; its output is captured.

fedjax_kd runs its defaults (``fedala.eta = 1``, ``percent = 80``, ``layers = 1``,
``threshold = 0.1``, ``window = 10``); ``max_start_epochs`` (100, ours: their first ALA call
has no bound) does not bind here (the first call stops after 11 epochs on both sides, checked
from their printed epoch count). Accuracies: ``test_acc``, the unweighted mean over clients of
each trained local model's accuracy, against the same mean of their local models after
training; the global model's accuracy (``global_test_acc``) is compared too, in ``notes``.
Needs ``rounds >= 2`` (their ``train()`` divides by ``rounds - 1`` at the end).
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings

import numpy as np

from benchmarks.references.authors import common


def config(rounds: int = 3, seed: int = 0):
  return common.tiny('fedala', rounds, seed=seed)


def _ala_start(run: common.Ours, t: int, k: int, n: int, percent: int) -> tuple[int, int]:
  """fedjax_kd's ALA sample of client ``k`` in round ``t``: ``(start, size)`` (the engine's
  window of the ALA program, ``program.window_sampler``: the same key, the same ``randint``)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import rng  # pylint: disable=g-import-not-at-top
  key = rng.client_keys(run.lockstep.root, t, np.array([k]), 'custom')[0]
  k_start, _ = jax.random.split(key)
  n32 = jnp.int32(n)
  num = jnp.maximum(n32 * percent // 100, 1)
  start = jax.random.randint(k_start, (), 0, jnp.maximum(n32 - num + 1, 1))
  return int(start), int(num)


def _epochs(run: common.Ours, t: int, k: int, n: int, epochs: int, batch_size: int,
            drop_last: bool) -> list[list[np.ndarray]]:
  """fedjax_kd's minibatches of client ``k`` in round ``t`` (phase ``'train'``), per epoch."""
  pos = run.lockstep.order(t, k, 'train', n, n, epochs, batch_size)
  out = []
  for ep in np.asarray(pos).reshape(epochs, -1, batch_size):
    steps = [p[p < n].astype(np.int64) for p in ep if (p < n).any()]
    if drop_last:
      steps = [p for p in steps if len(p) == batch_size]
    out.append(steps)
  return out


def lockstep(path: str, seed: int = 0, rounds: int = 3, drop_last: bool = False,
             ours_run: common.Ours | None = None) -> common.Result:
  """Runs ``rounds`` rounds of fedjax_kd's FedALA and of their code side by side.

  Args:
    path: the checkout of TsingZ0/FedALA.
    seed: the config's seed (their ``np.random`` is seeded with it too).
    rounds: rounds on both sides (at least 2).
    drop_last: their local loader's ``drop_last=True`` (the partial last minibatch of
      fedjax_kd's order dropped on their side): a measured difference, not the lock-step.
    ours_run: fedjax_kd's run of ``config(rounds, seed)``, if already made.
  """
  if rounds < 2:
    raise ValueError('their FedALA.train() needs global_rounds >= 1, i.e. rounds >= 2')
  torch = common.need_torch()
  run = ours_run or common.ours(config(rounds, seed))
  s = run.setting
  o = run.exp.algorithm.options
  epochs, batch_size, lr = s.train
  k_clients = len(s.client_rows)
  data = [run.client_data(k) for k in range(k_clients)]
  tests = [(s.x_test, s.y_test) if s.client_test_rows is None else
           (s.x_test[s.client_test_rows[k]], s.y_test[s.client_test_rows[k]])
           for k in range(k_clients)]

  def as_list(x, y):
    xt, yt = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))
    return [(a, b) for a, b in zip(xt, yt)]

  def read_client_data(dataset, idx, is_train=True):
    del dataset
    return as_list(*(data[idx] if is_train else tests[idx]))

  state = {'t': 0}           # fedjax_kd's round (their round i is t = i + 1)
  diffs, acc_theirs, gacc_theirs, draws = [], [], [], []

  class Shim:
    """The ``random`` ALA.py sees: ``randint`` gives fedjax_kd's start of the next call."""
    planned: list = []

    def randint(self, a, b):
      start, lo, hi = self.planned.pop(0)
      assert (a, b) == (lo, hi), ((a, b), (lo, hi))
      return start

  shim = Shim()
  out = io.StringIO()
  with common.imported_from(path + '/system'):
    import utils.data_utils as data_utils  # pylint: disable=g-import-not-at-top
    data_utils.read_client_data = read_client_data
    import utils.ALA as ala_mod  # pylint: disable=g-import-not-at-top
    ala_mod.random = shim
    import flcore.clients.clientALA as cmod  # pylint: disable=g-import-not-at-top
    import flcore.servers.serverALA as smod  # pylint: disable=g-import-not-at-top
    assert cmod.read_client_data is read_client_data and smod.read_client_data is read_client_data

    class Loader:
      """One round's minibatches: each pass (``for x, y in loader``) is the next epoch."""

      def __init__(self, x, y, per_epoch):
        self.x, self.y = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))
        self.per_epoch, self.e = per_epoch, 0

      def __len__(self):
        return len(self.per_epoch[0])

      def __iter__(self):
        steps = self.per_epoch[self.e % len(self.per_epoch)]
        self.e += 1
        for j in steps:
          j = torch.from_numpy(j)
          yield self.x[j], self.y[j]

    class Client(cmod.clientALA):
      """Their client; fedjax_kd's minibatches, fedjax_kd's ALA sample."""

      def load_train_data(self, batch_size=None):
        x, y = data[self.id]
        return Loader(x, y, _epochs(run, state['t'], self.id, len(y), epochs, batch_size or
                                    self.batch_size, drop_last))

      def local_initialization(self, received_global_model):
        n = len(self.ALA.train_data)
        start, num = _ala_start(run, state['t'], self.id, n, o.percent)
        assert num == int(self.rand_percent / 100 * n), (num, n)
        shim.planned.append((start, 0, n - num))
        draws.append((state['t'], self.id, start))
        super().local_initialization(received_global_model)

    class Server(smod.FedALA):
      """Their server; their clients' subclass above, every model compared after a round."""

      def set_clients(self, args, clientObj):
        del clientObj
        super().set_clients(args, Client)

      def select_clients(self):
        state['t'] += 1
        return super().select_clients()

      def aggregate_parameters(self):
        super().aggregate_parameters()
        t = state['t']
        d = [common.max_diff(c.model, run.client(t, c.id)) for c in self.clients]
        diffs.append(max(d + [common.max_diff(self.global_model, run.server(t))]))
        acc_theirs.append(float(np.mean([common.accuracy(c.model, *tests[c.id])
                                         for c in self.clients])))
        gacc_theirs.append(common.accuracy(self.global_model, s.x_test, s.y_test))

    args = common.namespace(
        device='cpu', dataset='fedjax_kd', global_rounds=len(run.rows) - 1,
        model=common.torch_model(run, run.server(0)), num_clients=k_clients, join_ratio=1.0,
        random_join_ratio=False, eval_gap=1, num_classes=s.num_classes, batch_size=batch_size,
        local_learning_rate=lr, local_steps=epochs, eta=o.eta, rand_percent=o.percent,
        layer_idx=2 * o.layers)
    np.random.seed(seed)
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
      warnings.simplefilter('ignore')   # their F.softmax(output) without dim
      algo = Server(args, 0)
      algo.train()
  ala_epochs = [int(m) for m in re.findall(r'ALA epochs: (\d+)', out.getvalue())]
  acc_ours = [r['test_acc'] for r in run.rows]
  gacc_ours = [r['global_test_acc'] for r in run.rows]
  gdiff = float(np.max(np.abs(np.subtract(gacc_ours, gacc_theirs))))
  return common.Result(
      baseline='fedala', repo=common.REPOS['fedala'], rounds=len(run.rows), param_diff=diffs,
      acc_ours=acc_ours, acc_theirs=acc_theirs,
      what=('every local model (after local training) and the global model after each round; '
            'test_acc: the mean over clients of the local models\' test accuracy'),
      notes=(f'fedjax_kd defaults (eta={o.eta}, percent={o.percent}, layers={o.layers})',
             f'global_test_acc ours {gacc_ours} theirs {gacc_theirs} (max diff {gdiff:.2g})',
             f'their first ALA call epochs {ala_epochs}; ours '
             f'{[r["ala_epochs"] for r in run.rows]} (mean over ALA clients per round)',
             f'their round-start evaluations (after ALA, before training) {algo.rs_test_acc}',
             f'their local loader drop_last={drop_last}'))
