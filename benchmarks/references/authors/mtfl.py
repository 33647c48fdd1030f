"""MTFL (Mills, Hu and Min, IEEE TPDS 2022) beside its authors' code: ``fl_algs.py``'s FedAdam.

MTFL(FedAdam) is their ``main.py -alg fedadam``: ``fl_algs.run_fedavg_google`` with
``optimisers.ClientSGD`` on the clients and ``optimisers.ServerAdam`` on the server. Both run
unchanged, the whole loop included (client sampling ``np.random.choice``, the download
``set_params`` + ``set_bn_vals`` of the private BatchNorm values, the K local SGD steps, the
pseudo-gradient ``sum_k p_k (w - w_k)``, the storing of the private values ``get_bn_vals``, the
Adam step, and the loop's own UA test of each round's clients at download). Their
``models.FLModel`` runs unchanged too (``get_params`` / ``set_params`` / ``get_bn_vals`` /
``set_bn_vals`` / ``train_step`` / ``test``); the driver supplies around them:

* the model: an ``FLModel`` subclass holding the PyTorch twin of fedjax_kd's ``dsfl_cnn``
  (:func:`torch_dsfl_cnn`, ``torch_ref``'s ``dsfl_cnn`` with a width multiplier, 1 here:
  Conv-BN-ReLU-Pool x2, Dense(512)-BN-ReLU, Dense(C); three BatchNorm layers in
  ``bn_layers``), with their ``MNISTModel``'s loss (mean cross-entropy) and
  ``calc_acc``. fedjax_kd's ``mlp`` has no BatchNorm (MTFL would be plain FedAdam), and
  ``dsfl_cnn`` is the one model with BatchNorm that fedjax_kd and the PyTorch twins
  (``benchmarks/references/pytorch/common.py`` ``MODELS``) both have; it needs 28x28 inputs, so the
  tiny setting's ``synthetic:600`` images are upsampled 3x (8x8 -> 24x24, zero-padded to 28x28)
  and registered as the source ``mtfl_synthetic28`` (the same task, rows, labels and seed).
  Its BatchNorm layers average the biased batch variance into the running variance (Flax's
  rule, ``bn_running_var='biased'``); PyTorch's unbiased rule is measured beside it;
* the data: each client's ``data_utils.PyTorchDataFeeder`` (their class, constructed as
  ``main.py`` does) with ``next_batch`` replaced by one that yields fedjax_kd's minibatches
  of the client and round (phase ``'train'``; the partial last batch kept);
  ``K = epochs * ceil(n_k / B)``, the same for the three clients here;
* the sampling: their ``np.random.choice(W, M)`` draws, seeded with ``np.random.seed(seed)``,
  are drawn once beforehand and handed to fedjax_kd as each round's active clients (with
  ``participation=1`` every round has every client; with less, the unsampled clients' private
  values are exercised on both sides);
* ``progressbar`` (``fl_algs`` imports ``progressbar.progressbar``; not installed) as a module
  whose ``progressbar`` returns its iterable: the one run-time patch.

``main.py``'s ``model.set_optim(client_optim)`` also runs ``empty_step`` (one SGD step on two
all-zero inputs labelled 0) before the initial model is read; it is not part of MTFL, the
lock-step skips it (``set_optim(..., init_optim=False)``) and ``empty_step=True`` measures it.

The comparison, after every round: every round client's local model after training (every
parameter and BatchNorm statistic) against fedjax_kd's client row, and the new global model's
federated parameters against fedjax_kd's server model. The global model's private BatchNorm
leaves are left out of ``param_diff``: the clients never read them; their code Adam-steps them
on the clients' private values, fedjax_kd holds the clients' ``n_k``-weighted mean
(docs/papers.md, MTFL "Choices"), and the driver reports that difference and its effect on the
global model's accuracy apart. Accuracy: UA, every client's personalised model (the global
federated parameters with its own private values) on its own test split
(``data.per_client_test``), the unweighted mean over clients, their ``FLModel.test`` against
fedjax_kd's ``test_acc``; their loop's own test (the round's clients at download in the next
round) is checked against it.

Two modes. ``restart=True`` (the default): after each round their loop goes on from
fedjax_kd's state (global model, Adam moments, each client's private values, handed back
through the ``apply_gradients`` / ``get_bn_vals`` return values), so each round's difference is
that round's own; seed 0, 3 rounds: 1.7e-6, 1.7e-6, 2.2e-6, UA equal to 2e-8. ``restart=False``
runs the two free: 1.7e-6, 3.4e-5, 3.6e-4 (seed 0; seeds 1, 2: 1.2e-5, 1.4e-5 after round 3;
seeds 3, 4: 8.9e-4, 0.14), UA still equal to 1e-7 every round. The growth is float32 rounding
made large, not a difference of the method: FedAdam with ``epsilon=1e-4`` steps
``lr m / (sqrt(v) + eps)``, about ``lr (1 - beta1) / eps = 10`` times a small pseudo-gradient's
rounding, and SGD on this max-pooled BN CNN amplifies a 1e-7 perturbation to 1e-4..1e-3 within
one client's nine steps now and then (two JAX loops of the same SGD, and PyTorch float32
against float64, part by as much).

Measured beside it (seed 0, free-running, 2 rounds): ``empty_step=True`` moves the initial
model by 0.089 (UA 0.836 / 0.821 against 0.850 / 0.855); PyTorch's unbiased running variance
0.076 on the private variances (UA unchanged); the global model's private leaves (their Adam
step) part from fedjax_kd's mean by up to 4.7, and the global model scores 0.31 with theirs
against 0.89 with the mean (theirs with the mean: 0.887, fedjax_kd's exactly). ``bn_private``
'yb' and 'none' (running statistics federated, Adam-stepped on both sides) and
``participation=0.67`` (unsampled clients keep their private values) hold too.

fedjax_kd options: ``mtfl.*`` defaults (``server_lr=0.01``, ``beta1=0.9``, ``beta2=0.999``,
``epsilon=1e-4``, ``bn_private='usyb'``: their README's MTFL(FedAdam) command); the tiny
setting's client SGD at 0.1, batch 20, one epoch; ``data.per_client_test=True`` (their code
tests each client on its own test split; fedjax_kd's default False tests on the pooled set).
"""

from __future__ import annotations

import types

import numpy as np

from benchmarks.references.authors import common

SOURCE = 'mtfl_synthetic28'
WIDTH = 1.0
# their -bn_private strings -> the int settings of FLModel.get_bn_vals / set_bn_vals
BN_SETTING = {'usyb': 0, 'yb': 1, 'us': 2, 'none': 3}


def _upsample(x: np.ndarray) -> np.ndarray:
  """8x8 images -> 28x28: each pixel a 3x3 block (24x24), then 2 zero pixels each side."""
  x = np.kron(np.asarray(x, np.float32), np.ones((1, 3, 3, 1), np.float32))
  return np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))


def register_source(seed: int = 0) -> None:
  """Registers ``mtfl_synthetic28``: the tiny setting's ``synthetic:600`` rows at 28x28."""
  from fedjax_kd.data import sources  # pylint: disable=g-import-not-at-top
  ds = sources.load_source('synthetic:600', seed=seed)
  sources.register_source(SOURCE, sources.ArraySource(
      _upsample(ds.x_train), ds.y_train, _upsample(ds.x_test), ds.y_test, name=SOURCE))


def model_spec(width: float = WIDTH) -> str:
  return f'dsfl_cnn@{width:g}'


def torch_dsfl_cnn(num_classes: int, width: float, in_channels: int = 1):
  """``torch_ref``'s ``dsfl_cnn`` at a width multiplier (fedjax_kd's ``dsfl_cnn@width``:
  hidden sizes ``round(n * width)`` of 32, 64, 512), with the biased-variance BatchNorm."""
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  from benchmarks.references.pytorch import common as ref  # pylint: disable=g-import-not-at-top
  bn1d, bn2d = ref._batchnorm_classes()  # pylint: disable=protected-access
  c1, c2, h = (ref._scaled(n, width) for n in (32, 64, 512))  # pylint: disable=protected-access
  return nn.Sequential(*ref._mark_bn(  # pylint: disable=protected-access
      [nn.Conv2d(in_channels, c1, 5), bn2d(c1), nn.ReLU(), nn.MaxPool2d(2),
       nn.Conv2d(c1, c2, 5), bn2d(c2), nn.ReLU(), nn.MaxPool2d(2),
       nn.Flatten(), nn.Linear(4 * 4 * c2, h), bn1d(h), nn.ReLU(),
       nn.Linear(h, num_classes)], True))


def config(rounds: int = 3, seed: int = 0, participation: float = 1.0, width: float = WIDTH,
           **overrides):
  register_source(seed)
  return common.tiny('mtfl', rounds, seed=seed,
                     **{'data.source': SOURCE, 'clients.models': [model_spec(width)],
                        'server.model': model_spec(width), 'data.per_client_test': True,
                        'clients.participation': participation, **overrides})


def draws(seed: int, rounds: int, num_clients: int, participation: float) -> list[np.ndarray]:
  """Their loop's client draws, ``np.random.choice(W, M, replace=False)`` once a round after
  ``np.random.seed(seed)`` (nothing else in their loop draws from numpy), ``M = int(W C)``."""
  m = int(num_clients * participation)
  state = np.random.RandomState(seed)
  return [state.choice(num_clients, m, replace=False) for _ in range(rounds)]


def _private_keys(net, bn_private: str) -> set[str]:
  """The state-dict keys of ``net``'s private BatchNorm values."""
  import torch  # pylint: disable=g-import-not-at-top
  suffix = {'usyb': ('weight', 'bias', 'running_mean', 'running_var'),
            'yb': ('weight', 'bias'), 'us': ('running_mean', 'running_var'), 'none': ()}
  out = set()
  for name, m in net.named_modules():
    if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):  # pylint: disable=protected-access
      out.update(f'{name}.{s}' for s in suffix[bn_private])
  return out


def _diff(net, variables, keep=lambda key: True) -> float:
  """Largest absolute difference over the state-dict keys of ``net`` that ``keep`` accepts."""
  from benchmarks.references.pytorch import common as ref  # pylint: disable=g-import-not-at-top
  want = ref.from_flax(net, *variables)
  got = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}
  d = [float(np.max(np.abs(got[k] - np.asarray(v)))) for k, v in want.items() if keep(k)]
  return max(d, default=0.0)


def lockstep(path: str, seed: int = 0, rounds: int = 3, participation: float = 1.0,
             bn_running_var: str = 'biased', empty_step: bool = False,
             restart: bool = True, ours_run: common.Ours | None = None,
             width: float = WIDTH, overrides: dict | None = None) -> common.Result:
  """Runs ``rounds`` rounds of fedjax_kd's MTFL and of their ``run_fedavg_google``.

  Args:
    path: the checkout of JedMills/MTFL-For-Personalised-DNNs.
    seed: the experiment seed (and their ``np.random.seed``).
    rounds: rounds compared (their loop runs one more, for its test at download).
    participation: their ``C`` (``M = int(W C)`` clients a round, their draws on both sides).
    bn_running_var: 'biased' (Flax's running variance, the lock-step) or 'unbiased'
      (PyTorch's ``BatchNorm``, as their ``MNISTModel``) on their side.
    empty_step: run ``main.py``'s ``set_optim`` initialising step (two zero images) first.
    restart: every round of theirs starts from fedjax_kd's state after the
      previous one (global model, Adam moments, each client's private values), so that each
      round's difference is that round's alone (not the rounds before, grown).
    ours_run: fedjax_kd's run, if already made with the same draws.
    width: ``dsfl_cnn``'s width multiplier.
    overrides: more config fields (e.g. ``{'mtfl.epsilon': 1e-2}``); both sides read them.

  Returns:
    The :class:`common.Result`; ``extra`` attributes on it: ``server_private_diff`` (per
    round, the global model's private BN leaves), ``global_acc_ours/theirs``,
    ``own_test_diff`` (their loop's UA against the driver's, rounds 1..rounds-1 at C=1).
  """
  torch = common.need_torch()
  k_clients = 3
  picks = draws(seed, rounds + 1, k_clients, participation)
  if ours_run is None:
    actives = [np.isin(np.arange(k_clients), p) for p in picks[:rounds]]
    ours_run = common.ours(config(rounds, seed, participation, width, **(overrides or {})),
                           actives=actives)
  run = ours_run
  s = run.setting
  assert len(s.client_rows) == k_clients
  epochs, batch_size, lr = s.train
  o = run.exp.algorithm.options
  bn_setting = BN_SETTING[o.bn_private]
  data = [run.client_data(k) for k in range(k_clients)]
  steps = {epochs * -(-len(y) // batch_size) for _, y in data}
  if len(steps) != 1:
    raise ValueError(f'their loop runs one K for every client; the clients need {steps}')
  (k_steps,) = steps
  tests = [(s.x_test[r], s.y_test[r]) for r in s.client_test_rows]
  cpu = torch.device('cpu')
  bar = common.stub('progressbar')
  bar.progressbar = lambda it, **kw: it

  out = types.SimpleNamespace(diffs=[], server_private=[], acc=[], glob=[], glob_mean=[],
                              client=[])
  with common.imported_from(path, stubs={'progressbar': bar}):
    import data_utils  # pylint: disable=g-import-not-at-top
    import fl_algs  # pylint: disable=g-import-not-at-top
    import models  # pylint: disable=g-import-not-at-top
    import optimisers  # pylint: disable=g-import-not-at-top

    class Twin(models.FLModel):
      """fedjax_kd's dsfl_cnn as their FLModel; records each client's model as it stores
      its private BN values (``get_bn_vals`` right after the upload)."""

      def __init__(self, variables):
        super().__init__(cpu)
        self.net = torch_dsfl_cnn(s.num_classes, width, s.x_private.shape[-1])
        common.load(self.net, variables)
        for m in self.net.modules():
          if hasattr(m, 'biased'):
            m.biased = bn_running_var == 'biased'
        self.loss_fn = torch.nn.CrossEntropyLoss(reduction='mean')
        self.bn_layers = [m for m in self.net.modules()
                          if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]  # pylint: disable=protected-access
        self.current = None   # the client whose batches were last fed
        self.on_client = None

      def forward(self, x):
        return self.net(x)

      calc_acc = models.MNISTModel.calc_acc

      def empty_step(self):
        """``MNISTModel.empty_step`` at this model's input shape."""
        self.train_step(torch.zeros((2,) + tuple(nchw_shape), dtype=torch.float32),
                        torch.zeros((2,), dtype=torch.int32).long())

      def get_bn_vals(self, setting=0):
        vals = super().get_bn_vals(setting)
        if self.current is not None and self.on_client is not None:
          vals = self.on_client(self.current, vals)
        self.current = None
        return vals

    nchw_shape = common.nchw(s.x_private[:1]).shape[1:]
    model = Twin(run.server(0))
    probe = Twin(run.server(0))
    private = _private_keys(model.net, o.bn_private)
    n_k = np.array([len(y) for _, y in data], np.float64)

    class Feeder(data_utils.PyTorchDataFeeder):
      """Their feeder (built as main.py builds it); ``next_batch`` gives our minibatches."""

      def __init__(self, k, x, y):
        super().__init__(common.nchw(x).numpy(), torch.float32, y, 'long', cpu)
        self.k, self.x0 = k, common.nchw(x)
        self.y0 = torch.from_numpy(np.asarray(y, np.int64))
        self.round, self.queue = None, []

      def next_batch(self, B):
        t = server.t + 1
        if self.round != t:
          self.round = t
          self.queue = list(run.order(t, self.k, 'train', self.n_samples, epochs, B))
        j = torch.from_numpy(self.queue.pop(0))
        model.current = self.k
        return self.x0[j], self.y0[j]

    class Server(optimisers.ServerAdam):
      """Their ServerAdam; the new global model is compared after each step."""
      t = 0

      def apply_gradients(self, m, grads):
        new = super().apply_gradients(m, grads)
        self.t += 1
        if self.t <= len(run.rows):
          on_round(self.t, new)
          if restart:   # the next round starts from fedjax_kd's global model and moments
            new = layout(run.server(self.t))
            extra = run.states[self.t].extra
            self.m = layout((common._numpy(extra.m['params'], 0),  # pylint: disable=protected-access
                             common._numpy(extra.m['batch_stats'], 0)))  # pylint: disable=protected-access
            self.v = layout((common._numpy(extra.v['params'], 0),  # pylint: disable=protected-access
                             common._numpy(extra.v['batch_stats'], 0)))  # pylint: disable=protected-access
        return new

    def layout(variables):
      """fedjax_kd's ``(params, batch_stats)`` as their ``NumpyModel`` (``get_params``)."""
      common.load(probe.net, variables)
      return probe.get_params()

    priv = {}

    def on_client(k, vals):
      t = server.t + 1
      if t <= len(run.rows):
        out.client.append((t, k, _diff(model.net, run.client(t, k))))
        if restart:   # the client keeps fedjax_kd's private values of the round
          common.load(probe.net, run.client(t, k))
          vals = probe.get_bn_vals(bn_setting)
      priv[k] = [np.copy(v) for v in vals]
      return vals

    def on_round(t, new):
      probe.set_params(new)
      fed = _diff(probe.net, run.server(t), lambda key: key not in private)
      out.server_private.append(_diff(probe.net, run.server(t), lambda key: key in private))
      out.glob.append(common.accuracy(probe.net, s.x_test, s.y_test))
      d = [c for (tt, _, c) in out.client if tt == t]
      trained = sorted(k for (tt, k, _) in out.client if tt == t)
      assert trained == sorted(int(k) for k in picks[t - 1]), (t, trained, picks[t - 1])
      out.diffs.append(max(d + [fed]))
      accs = []
      for k in range(k_clients):
        probe.set_params(new)
        probe.set_bn_vals(priv[k], bn_setting)
        _, acc = probe.test(common.nchw(tests[k][0]),
                            torch.from_numpy(np.asarray(tests[k][1], np.int64)), 128)
        accs.append(float(acc))
      out.acc.append(float(np.mean(accs)))
      # the global model with the mean of the round's private values (fedjax_kd's choice)
      probe.set_params(new)
      ids = picks[t - 1]
      w = n_k[ids] / n_k[ids].sum()
      probe.set_bn_vals([sum(wi * priv[int(k)][i] for wi, k in zip(w, ids))
                         for i in range(len(priv[int(ids[0])]))], bn_setting)
      out.glob_mean.append(common.accuracy(probe.net, s.x_test, s.y_test))

    feeders = [Feeder(k, *data[k]) for k in range(k_clients)]
    client_optim = optimisers.ClientSGD(model.parameters(), lr=lr)
    model.set_optim(client_optim, init_optim=empty_step)
    init_vals = model.get_bn_vals(bn_setting)
    priv.update({k: [np.copy(v) for v in init_vals] for k in range(k_clients)})
    server = Server(model.get_params(), o.server_lr, o.beta1, o.beta2, o.epsilon)
    model.on_client = on_client
    test_data = ([common.nchw(x) for x, _ in tests],
                 [torch.from_numpy(np.asarray(y, np.int64)) for _, y in tests])
    np.random.seed(seed)
    _, _, _, own_accs = fl_algs.run_fedavg_google(
        feeders, test_data, model, server, len(run.rows) + 1, int(k_clients * participation),
        k_steps, batch_size, bn_setting=bn_setting)
  own = [float(a) for a in own_accs[1:]]
  mode = "each round from fedjax_kd's state" if restart else 'free-running'
  full = int(k_clients * participation) == k_clients
  res = common.Result(
      baseline='mtfl', repo=common.REPOS['mtfl'], rounds=len(run.rows), param_diff=out.diffs,
      acc_ours=[r['test_acc'] for r in run.rows], acc_theirs=out.acc,
      what=('every round client after training (all parameters and BN statistics) and the '
            "global model's federated parameters after each round, "
            + ("each of their rounds started from fedjax_kd's state after the one before "
               '(free-running the two part by float32 rounding grown large: 3.6e-4 by round 3)'
               if restart else 'free-running')
            + '; UA (personalised models on their own test splits, mean over all clients)'),
      notes=(f'model {model_spec(width)} on synthetic:600 upsampled to 28x28; '
             f'{mode}; '
             f'bn_running_var {bn_running_var}; empty_step {empty_step}; '
             f'participation {participation}',
             'global model private BN leaves (not compared): their Adam step vs our '
             f'weighted mean, max diff {max(out.server_private):.3g}'))
  res.server_private_diff = out.server_private
  res.global_acc_ours = [r['global_acc'] for r in run.rows]
  res.global_acc_theirs = out.glob
  res.global_acc_theirs_mean_bn = out.glob_mean
  res.own_test_diff = (float(np.max(np.abs(np.subtract(own[:len(out.acc)], out.acc))))
                       if full else None)
  res.client_diffs = out.client
  return res


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top
  r = lockstep(sys.argv[1] if len(sys.argv) > 1 else common.checkout('mtfl'))
  print(r.to_json())
