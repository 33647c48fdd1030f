"""FedDF (Lin et al., NeurIPS 2020) beside its authors' code: epfml's ``codes/FedDF-code``.

"Ensemble Distillation for Robust Model Fusion in Federated Learning". Their framework is a
``torch.distributed`` master with one process per worker; the lock-step runs its pieces in one
process, each unchanged, in the order ``pcode/master.py``'s ``Master.run`` calls them:

* local training: ``pcode/worker.py``'s ``Worker._train`` (their loop: ``define_optimizer``
  of ``pcode/create_optimizer.py``, the ``Scheduler`` and its ``MultiStepLR`` of
  ``pcode/create_scheduler.py``, ``load_data_batch``, the CE criterion, the stopping test
  ``_is_finished_one_comm_round``) on a ``Worker`` made without its ``__init__`` (which joins
  the process group and loads a dataset), given what ``_listen_to_master`` /
  ``_recv_model_from_master`` would have set: the model holding the global weights, the
  metrics, a timer;
* the upload: ``pcode/utils/tensor_buffer.py``'s ``TensorBuffer`` of the trained state dict
  (what ``_send_model_to_master`` sends);
* the averaging: ``pcode/aggregation/fedavg.py``'s ``fedavg`` (``Master._avg_over_archs``:
  the uniform mean of the received models);
* the fusion: ``pcode/aggregation/noise_knowledge_transfer.py``'s ``aggregate`` with the
  keyword arguments ``Aggregator._s7_noise_knowledge_transfer`` passes: it rebuilds the local
  models (``aggregation/utils.py``'s ``recover_models``) and runs ``NoiseKTSolver.distillation``
  (the teachers in eval mode, the student from the averaged model, Adam at 1e-3, the
  ``avg_logits`` KL, their ``clip_grad_norm_(., 5)``, their cosine schedule switch, the
  validation every ``eval_batches_freq`` steps with ``BaseKTSolver.check_early_stopping``
  and the best model on validation returned);
* the evaluation: ``pcode/master_utils.py``'s ``validate`` of the fused model on the test set
  (what ``do_validation`` reports).

Around them the driver supplies:

* the data: ``create_dataset.define_data_loader`` (their data-loading path, the one function
  replaced at run time) returns a loader of fedjax_kd's minibatches of the client and round,
  one epoch per ``iter()``, and sets ``conf.num_batches_per_device_per_epoch`` as theirs
  does; the distillation loader yields ``(x,)`` batches of the round's public draw
  (``Setting.draws``, fedjax_kd's ``sample_public``) in fedjax_kd's order of the phase
  ``'distill'`` (the key ``fold_in(server_key(t, 'distill'), group)`` of ``FedDF._distill``),
  one epoch per ``iter()`` (their loop re-opens the loader on ``StopIteration``); the
  validation loader their early stopping needs is the public set with its labels (held by
  the server, disjoint from the test set);
* the model: fedjax_kd's MLP as a ``torch.nn.Sequential`` holding fedjax_kd's weights, with
  the ``activations`` attribute their student loss reads (unused: ``AT_beta = 0``);
* ``conf``: a namespace with their flags' values (``lr``, ``batch_size``, ``local_n_epochs``,
  ``optimizer='sgd'``, no momentum, weight decay, warm-up, mixup, prox or self-distillation,
  ``on_cuda=False``) and a quiet logger; ``conf.fl_aggregate`` as their README's FedDF runs
  (``scheme=noise_knowledge_transfer, update_student_scheme=avg_logits``) with
  ``total_n_server_pseudo_batches`` = fedjax_kd's distillation steps, ``eval_batches_freq`` =
  the same (one validation, at the last step, so their early stopping keeps the last model)
  and ``use_server_model_scheduler=False`` (fedjax_kd has no schedule);
* stubs for what is imported but never called: ``torchvision``, ``torchvision.utils`` (their
  GAN code's ``make_grid``) and their ``pcode/datasets/prepare_data.py`` (the torchvision
  dataset loaders).

Beside ``define_data_loader`` no line of theirs is patched; ``torch.nn.utils.clip_grad_norm_``
is wrapped for the run to record the norms it sees (it still clips): at 5 it never clipped
here (largest norm 0.23).

fedjax_kd runs its defaults and the digits preset, except ``distill.optimizer='adam'`` and
``distill.learning_rate=1e-3`` (their ``student_learning_rate``, the paper's Adam),
``distill.batch_size = train.batch_size`` (their distillation loader uses ``conf.batch_size``,
the local one; ``fl_aggregate.batch_size`` only counts samples) and
``distill.public_per_round = data.num_public`` (their distillation set is one fixed set,
reshuffled each epoch; so is fedjax_kd's whole public set drawn every round).

The lock-step (seed 0, 3 rounds, 9 local SGD steps and 25 Adam steps a round) holds at
3.4e-7, 3.6e-7, 3.9e-7. Differences kept, each measured by a function here: their cosine
schedule of the distillation learning rate, on by default (:func:`schedule_effect`: 1e-2 to
3e-2); their 1e4-step budget with validation every 100 steps, patience 1e3 and the best model
on validation, where fedjax_kd runs a fixed number of steps and keeps the last model
(:func:`budget_effect`); their uniform mean of the local models, where fedjax_kd and the paper
weight by ``n_k`` (no difference at equal sizes, as here: 165 rows each;
:func:`averaging_effect` on a Dirichlet split: 8e-3 after round 1); their loss is ``KL``
without fedjax_kd's ``T^2`` factor (no difference at ``T = 1``; :func:`temperature_effect`
at ``T = 4``: 1.5e-3 through Adam's epsilon, 5e-7 with their loss scaled by ``T^2``).
"""

from __future__ import annotations

import copy

import numpy as np

from benchmarks.references.authors import common

SUBDIR = 'codes/FedDF-code'


def config(rounds: int = 3, seed: int = 0, **overrides):
  """The tiny FedDF setting; ``overrides``: more dotted config fields."""
  return common.tiny('feddf', rounds, seed=seed, **{
      'distill.optimizer': 'adam', 'distill.learning_rate': 1e-3,
      'distill.batch_size': 20, 'distill.public_per_round': 100, **overrides})


class _Logger:
  """Their ``conf.logger``, quiet."""

  def log(self, *args, **kwargs):
    del args, kwargs

  def log_metric(self, *args, **kwargs):
    del args, kwargs

  def save_json(self):
    pass

  def meet_cache_limit(self):
    return False


class _Epochs:
  """A loader of fedjax_kd's minibatches: ``iter()`` opens the next epoch, ``len()`` is the
  steps of one. Yields ``(x NCHW, y)``, or ``(x,)`` without labels."""

  def __init__(self, x: np.ndarray, y: np.ndarray | None = None):
    import torch  # pylint: disable=g-import-not-at-top
    self.x = common.nchw(x)
    self.y = None if y is None else torch.from_numpy(np.asarray(y, np.int64))
    self.epochs: list[list[np.ndarray]] = []
    self.opened = 0

  def set(self, epochs: list[list[np.ndarray]]):
    self.epochs, self.opened = epochs, 0

  def __len__(self):
    return len(self.epochs[0])

  def __iter__(self):
    import torch  # pylint: disable=g-import-not-at-top
    steps = self.epochs[self.opened % len(self.epochs)]
    self.opened += 1
    for p in steps:
      j = torch.from_numpy(p)
      yield (self.x[j],) if self.y is None else (self.x[j], self.y[j])


class _Whole:
  """A validation / test loader: the set in batches of 500."""

  def __init__(self, x, y):
    import torch  # pylint: disable=g-import-not-at-top
    self.x, self.y = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))

  def __iter__(self):
    return iter([(self.x[i:i + 500], self.y[i:i + 500]) for i in range(0, len(self.y), 500)])


def _per_epoch(steps: list[np.ndarray], n: int, batch_size: int) -> list[list[np.ndarray]]:
  per = -(-n // batch_size)
  return [steps[i:i + per] for i in range(0, len(steps), per)]


def _distill_epochs(run: common.Ours, t: int, g: int, m: int, epochs: int,
                    batch_size: int) -> list[list[np.ndarray]]:
  """fedjax_kd's distillation minibatches of group ``g`` in round ``t`` (``FedDF._distill``:
  the key ``fold_in(server_key(t, 'distill'), g)``, ``m`` shared rows), epoch by epoch."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import rng  # pylint: disable=g-import-not-at-top
  key = jax.random.fold_in(rng.server_key(run.exp.ctx.root, t, 'distill'), g)
  pos, _ = jax.jit(program.epoch_positions, static_argnums=(1, 3, 4))(
      key, m, jax.numpy.int32(m), epochs, batch_size)
  pos = np.asarray(pos)
  steps = [p[p < m].astype(np.int64) for p in pos if (p < m).any()]
  return _per_epoch(steps, m, batch_size)


def _group_model(run: common.Ours, t: int, g: int = 0) -> tuple[dict, dict]:
  """fedjax_kd's global model of group ``g`` after round ``t`` (``state.extra.models``)."""
  import jax  # pylint: disable=g-import-not-at-top
  st = run.states[t].extra.models[g]
  take = lambda tree: jax.tree.map(lambda x: np.asarray(x[0]), tree)
  return take(st.params), take(st.batch_stats or {})


def lockstep(path: str, seed: int = 0, rounds: int = 3, *, scheduler: bool = False,
             server_batches: int | None = None, eval_freq: int | None = None,
             patience: int = 2000, ours_run: common.Ours | None = None,
             overrides: dict | None = None) -> common.Result:
  """Runs ``rounds`` rounds of fedjax_kd's FedDF and of their code, from the same start.

  Args:
    path: the checkout of epfml/federated-learning-public-code.
    seed: the experiment seed.
    rounds: rounds to run.
    scheduler: their ``use_server_model_scheduler`` (their default: True).
    server_batches: their ``total_n_server_pseudo_batches`` (None: fedjax_kd's steps).
    eval_freq: their ``eval_batches_freq`` (None: ``server_batches``, one validation).
    patience: their ``early_stopping_server_batches``.
    ours_run: fedjax_kd's run of :func:`config`, if already made.
    overrides: more fedjax_kd config fields (e.g. ``{'data.partition': 'dirichlet'}``).

  Returns:
    Per round, the largest difference over every local model and the fused model, and the
    fused model's test accuracy on both sides.
  """
  torch = common.need_torch()
  nn = torch.nn
  run = ours_run or common.ours(config(rounds, seed, **(overrides or {})))
  s = run.setting
  spec = s.spec
  epochs, batch_size, lr = s.train
  d_epochs, d_batch, _ = s.distill
  if len(set(s.client_models)) != 1:
    raise ValueError('the lock-step runs one architecture (one FedDF group)')
  k_clients = len(s.client_rows)
  m = s.draws.shape[1]
  d_steps = d_epochs * -(-m // d_batch)
  server_batches = server_batches or d_steps
  eval_freq = eval_freq or server_batches
  data = [run.client_data(k) for k in range(k_clients)]
  loaders = [_Epochs(x, y) for x, y in data]
  distill_loader = _Epochs(s.x_public[s.draws[0]])
  val_loader = _Whole(s.x_public, s.y_public)
  test_loader = _Whole(s.x_test, s.y_test)

  def twin(variables):
    model = common.torch_model(run, variables)
    model.activations = None   # read by their student loss (attention transfer, AT_beta=0)
    return model

  norms: list[float] = []
  clip = torch.nn.utils.clip_grad_norm_

  def recording_clip(parameters, max_norm, *args, **kwargs):
    total = clip(parameters, max_norm, *args, **kwargs)
    norms.append(float(total))
    return total

  stubs = {name: common.stub(name) for name in
           ('torchvision', 'torchvision.utils', 'pcode.datasets.prepare_data')}
  stubs['torchvision.utils'].make_grid = None
  stubs['pcode.datasets.prepare_data'].get_dataset = None
  diffs, local_diffs, theirs_acc = [], [], []
  with common.imported_from(f'{path}/{SUBDIR}', stubs):
    # pylint: disable=g-import-not-at-top
    import pcode.aggregation.fedavg as fedavg
    import pcode.aggregation.noise_knowledge_transfer as nkt
    import pcode.create_dataset as create_dataset
    import pcode.create_metrics as create_metrics
    import pcode.master_utils as master_utils
    import pcode.utils.cross_entropy as cross_entropy
    from pcode.utils.tensor_buffer import TensorBuffer
    from pcode.utils.timer import Timer
    from pcode.worker import Worker
    # pylint: enable=g-import-not-at-top

    def define_data_loader(conf, dataset, localdata_id=None, is_train=True, shuffle=True,
                           data_partitioner=None):
      del dataset, is_train, shuffle
      loader = loaders[localdata_id]
      conf.num_batches_per_device_per_epoch = len(loader)
      conf.num_whole_batches_per_worker = len(loader) * conf.local_n_epochs
      return loader, data_partitioner

    create_dataset.define_data_loader = define_data_loader
    logger = _Logger()
    arch = 'mlp'
    conf = common.namespace(
        graph=common.namespace(on_cuda=False, rank=1, worker_id=1, client_id=1, comm_round=0),
        logger=logger, optimizer='sgd', lr=lr, batch_size=batch_size, base_batch_size=None,
        momentum_factor=spec.train.momentum, use_nesterov=False,
        weight_decay=spec.train.weight_decay, lr_scaleup=False, lr_scaleup_init_lr=None,
        lr_scaleup_factor=None, lr_warmup=False, lr_warmup_epochs=5,
        lr_warmup_epochs_upper_bound=150, lr_scheduler='MultiStepLR', lr_milestones=None,
        lr_milestone_ratios=None, lr_decay=0.1, local_n_epochs=epochs, min_local_epochs=None,
        use_mixup=False, self_distillation=0, local_prox_term=0, local_model_compression=None,
        track_time=False, train_fast=False, display_tracked_time=False, summary_freq=100,
        num_workers=0, pin_memory=False, data='synthetic', n_clients=k_clients,
        clientid2arch={k + 1: arch for k in range(k_clients)},
        fl_aggregate={'scheme': 'noise_knowledge_transfer',
                      'update_student_scheme': 'avg_logits',
                      'temperature': float(spec.options.temperature),
                      'total_n_server_pseudo_batches': server_batches,
                      'eval_batches_freq': eval_freq,
                      'early_stopping_server_batches': patience,
                      'use_server_model_scheduler': scheduler})
    client_models = {arch: twin(_group_model(run, 0))}
    metrics = create_metrics.Metrics(client_models[arch], task='classification')
    criterion = cross_entropy.CrossEntropyLoss(reduction='mean')
    torch.nn.utils.clip_grad_norm_ = recording_clip
    try:
      for t in range(1, len(run.rows) + 1):
        conf.graph.comm_round = t
        flat, trained = {}, {}
        for k in range(k_clients):   # Worker: _recv_model_from_master, _train, _send_model
          w = Worker.__new__(Worker)
          w.conf, w.rank = conf, 1
          conf.graph.client_id = k + 1
          w.dataset, w.data_partitioner = {'train': None}, None
          w.criterion = nn.CrossEntropyLoss(reduction='mean')
          w.timer = Timer(verbosity_level=0, log_fn=logger.log_metric)
          w.model = copy.deepcopy(client_models[arch])
          w.metrics = create_metrics.Metrics(w.model, task='classification')
          w.init_model = w._turn_off_grad(copy.deepcopy(w.model))  # pylint: disable=protected-access
          loaders[k].set(_per_epoch(run.order(t, k, 'train', len(data[k][1]), epochs,
                                              batch_size), len(data[k][1]), batch_size))
          w._train()  # pylint: disable=protected-access
          trained[k] = w.model
          flat[k + 1] = TensorBuffer(list(w.model.state_dict().values()))
        # Master._avg_over_archs, then Aggregator._s7_noise_knowledge_transfer.
        fedavg_model = fedavg.fedavg(
            conf=conf, clientid2arch=conf.clientid2arch, n_selected_clients=len(flat),
            flatten_local_models=flat, client_models=client_models, criterion=criterion,
            metrics=metrics, val_data_loader=val_loader)
        distill_loader.x = common.nchw(s.x_public[s.draws[t - 1]])
        n_epochs = max(d_epochs, -(-server_batches // -(-m // d_batch)))
        distill_loader.set(_distill_epochs(run, t, 0, m, n_epochs, d_batch))
        fused = nkt.aggregate(
            conf=conf, fedavg_models={arch: fedavg_model}, client_models=client_models,
            criterion=criterion, metrics=metrics, flatten_local_models=flat,
            fa_val_perf=None, distillation_sampler=None,
            distillation_data_loader=distill_loader, val_data_loader=val_loader,
            test_data_loader=test_loader)
        client_models[arch].load_state_dict(fused[arch].state_dict())
        d = [common.max_diff(trained[k], run.client(t, k)) for k in range(k_clients)]
        local_diffs.append(max(d))
        diffs.append(max(d + [common.max_diff(client_models[arch], _group_model(run, t))]))
        perf = master_utils.validate(conf, None, client_models[arch], criterion, metrics,
                                     test_loader, label=None, display=False)
        theirs_acc.append(perf['top1'] / 100.0)
    finally:
      torch.nn.utils.clip_grad_norm_ = clip
  notes = (f'fl_aggregate: total_n_server_pseudo_batches={server_batches}, '
           f'eval_batches_freq={eval_freq}, early_stopping_server_batches={patience}, '
           f'use_server_model_scheduler={scheduler}',
           f'largest gradient norm their clip_grad_norm_(., 5) saw: {max(norms):.4g} '
           f'({sum(n > 5 for n in norms)} of {len(norms)} steps clipped)',
           f'client rows {[len(y) for _, y in data]} (their mean is uniform, ours n_k)',
           'largest difference of the local models alone, per round: '
           + ', '.join(f'{x:.2g}' for x in local_diffs))
  return common.Result(
      baseline='feddf', repo=common.REPOS['feddf'], rounds=len(run.rows), param_diff=diffs,
      acc_ours=[r['global_acc'] for r in run.rows], acc_theirs=theirs_acc,
      what='every local model and the fused (distilled) global model after each round; '
           'the global model\'s test accuracy', notes=notes)


def schedule_effect(path: str, seed: int = 0, rounds: int = 3) -> common.Result:
  """Their default ``use_server_model_scheduler=True``: the distillation learning rate
  anneals to 0 over ``total_n_server_pseudo_batches`` (here fedjax_kd's steps)."""
  return lockstep(path, seed, rounds, scheduler=True)


def budget_effect(path: str, seed: int = 0, rounds: int = 3) -> common.Result:
  """Their README's distillation (1e4 steps, validation every 100, patience 1e3, cosine
  schedule, the best model on validation) against fedjax_kd's fixed steps."""
  return lockstep(path, seed, rounds, scheduler=True, server_batches=10_000, eval_freq=100,
                  patience=1000)


def averaging_effect(path: str, seed: int = 0, rounds: int = 3) -> common.Result:
  """Unequal clients (``data.partition='dirichlet'``): their uniform mean of the local
  models against fedjax_kd's (and the paper's) ``n_k``-weighted one."""
  return lockstep(path, seed, rounds, overrides={'data.partition': 'dirichlet'})


def temperature_effect(path: str, seed: int = 0, rounds: int = 3,
                       temperature: float = 4.0) -> common.Result:
  """``feddf.temperature`` and their ``fl_aggregate.temperature`` at ``temperature``: their
  loss lacks fedjax_kd's (and Hinton's) ``T^2`` factor, which Adam all but ignores."""
  return lockstep(path, seed, rounds, overrides={'feddf.temperature': temperature})


def main():
  import json  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  path = sys.argv[1] if len(sys.argv) > 1 else common.checkout('feddf')
  for fn in (lockstep, schedule_effect, averaging_effect, temperature_effect,
             budget_effect):
    r = fn(path)
    out = r.to_json()
    print(fn.__name__, json.dumps({k: out[k] for k in ('param_diff', 'acc_ours', 'acc_theirs',
                                                       'holds', 'notes')}), flush=True)


if __name__ == '__main__':
  main()
