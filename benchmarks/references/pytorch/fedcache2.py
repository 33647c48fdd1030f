"""FedCache 2.0 in PyTorch (Q. Pan, S. Sun, Z. Wu, Y. Wang, M. Liu, B. Gao, J. Wang,
"FedCache 2.0: Federated Edge Learning with Knowledge Caching and Dataset Distillation",
arXiv 2405.13378, Algorithm 1 and eqs. 5-17), and the single-client baseline.

Personalised FL without parameter or logit exchange: every client keeps its own model
(``torch.nn`` defaults; per-client widths as the config assigns) and its own optimizer
(``torch.optim.Adam``/``SGD`` as ``train.*`` says, kept from round to round unless
``train.fresh_optimizer``). The server holds a knowledge cache ``KC[client, k]`` of every
client's latest distilled set (one synthetic input per class it has, ``fedcache2.ipc``),
viewable by class (``S_c``, eqs. 5-7). One round, synchronous, for every participating
client ``k`` (a Python loop over clients):

1. **Download** (eq. 17): for every class ``c`` the server draws a fraction
   ``q_c = tau + (1 - tau) p_c^k`` of the cached class-``c`` items, ``p^k`` the client's
   label frequencies (eq. 16); ``fedcache2.sampling``: ``'count'`` takes ``q_c |S_c|``
   items (stochastic rounding) uniformly without replacement, ``'bernoulli'`` keeps each
   item with probability ``q_c``, ``'repo'`` the authors' code (``floor(m q_c / max q)``,
   ``m`` the smallest non-empty ``|S_c|``). The cache is empty in round 1, so round 1 is
   local training only (eq. 15's gate).
2. **Train** (eq. 14): cross-entropy on the private data with the downloaded synthetic
   samples appended (hard labels), one data set shuffled with a fresh ``torch.randperm``
   every epoch, the partial last batch kept.
3. **Distil** (eqs. 8-12): the synthetic inputs (round 1: random real samples, one per
   class the client has, eq. 9; later: the client's own previous set, or with
   ``proto_init='sigma'`` another client's cached set, eq. 8) are optimised with
   ``torch.optim.Adam(dd_lr)`` to minimise kernel ridge regression's loss of predicting
   the client's real data from them, with a linear kernel on the (trained) model's
   penultimate features ``F_f`` (``model[:-1]``). The target features are computed once,
   ``model.eval()``, and detached; only the synthetic inputs learn, labels stay one-hot,
   the inputs are clipped to the data's range after every step.
4. **Upload** (eq. 13): the set, quantised to uint8 for images (``'jpeg'``: through
   PIL's JPEG codec), replaces the client's cache row.

``single``: the same local training on the private data alone, no cache.

Rows carry ``test_acc`` = UA (the mean over clients of each client model's accuracy on
its personalised test split, ``model.eval()``), ``train_loss``, ``dd_loss`` (mean KRR loss),
``dd_skipped_steps``, ``down_items`` (mean download per participant), ``up_items`` and
``cache_items``.
"""

from __future__ import annotations

import io
from typing import Any, Iterator

import numpy as np

ALGORITHMS = ('fedcache2', 'single')
CONFIG = 'configs/fedcache2_mnist_cpu.py'
FIXED = ()
METRICS = ('train_loss', 'dd_loss', 'down_items', 'cache_items')
VARIANTS = {
    'fedcache2': ('PyTorch FedCache 2.0', 'fedcache2', {}),
    'single': ('PyTorch single client', 'single', {}),
    'fedcache2_tau1': ('PyTorch FedCache 2.0, tau 1 (whole cache)', 'fedcache2',
                       {'fedcache2.tau': 1.0}),
    'fedcache2_draws': ('PyTorch FedCache 2.0, other random draws', 'fedcache2',
                        {'reference.seed_offset': 1000}),
    # fedjax_kd's initial weights (its round 1 differs from PyTorch's default init mostly
    # by the initialisation: on MNIST seed 0, round-1 UA 0.769 torch init, 0.871 fedjax init).
    'fedcache2_fedjax_init': ('PyTorch FedCache 2.0, fedjax_kd init', 'fedcache2',
                              {'reference.init': 'fedjax'}),
    'single_fedjax_init': ('PyTorch single client, fedjax_kd init', 'single',
                           {'reference.init': 'fedjax'}),
}
DEFAULT_VARIANTS = ('fedcache2', 'single')

SAMPLING = ('count', 'bernoulli', 'repo')


# ------------------------------------------------------------ kernel ridge regression
def krr_predict(phi_t, phi_b, y_b, reg: float):
  """Linear-kernel KRR: ``K_tb (K_bb + lam I)^-1 Y_b`` with ``lam = reg tr(K_bb) / n_b``.

  ``phi_t [n, d]`` target features, ``phi_b [n_b, d]`` support (synthetic) features,
  ``y_b [n_b, C]`` support labels. If ``K_bb + lam I`` is numerically indefinite in the
  dtype (Cholesky fails: e.g. two identical prototypes), the ridge grows to
  ``lam + 1e-3 tr / n_b`` (the authors' ``+1e-3 I`` retry, made scale-relative) and then to
  ``lam + tr``. Differentiable in ``phi_b``.
  """
  import torch  # pylint: disable=g-import-not-at-top
  k_bb = phi_b @ phi_b.T
  n_b = k_bb.shape[0]
  tr = torch.diagonal(k_bb).sum().detach()
  lam = reg * tr / n_b
  if not bool(lam > 0):
    lam = torch.ones((), dtype=k_bb.dtype)
  eye = torch.eye(n_b, dtype=k_bb.dtype)
  for ridge in (lam, lam + 1e-3 * tr / n_b, lam + tr):
    factor, info = torch.linalg.cholesky_ex(k_bb + ridge * eye)
    if int(info) == 0 and bool(torch.isfinite(factor).all()):
      break
  alpha = torch.cholesky_solve(y_b, factor)
  return (phi_t @ phi_b.T) @ alpha


def krr_loss(phi_t, y_t, phi_b, y_b, reg: float):
  """Eq. 12 with the support/target roles the dimensions require (the printed equation has
  ``y_b`` and ``y_i`` swapped): ``1/2 mean_i ||Y_i - K_ib (K_bb + lam I)^-1 Y_b||^2``."""
  pred = krr_predict(phi_t, phi_b, y_b, reg)
  return 0.5 * ((pred - y_t) ** 2).sum(1).mean()


# ------------------------------------------------------------ the knowledge cache
def sample_cache(valid, slot_class, p, tau: float, gen, *, mode: str = 'count', cap: int = 0,
                 exclude_row: int | None = None):
  """Eq. 17 for one client: ``bool [K, S]``, the cached items it downloads.

  Args:
    valid: ``bool [K, S]`` cache slots holding an item.
    slot_class: ``int64 [S]`` class of every slot.
    p: ``[C]`` the client's label frequencies.
    tau: ``q_c = tau + (1 - tau) p_c``.
    gen: the ``torch.Generator`` of the draws.
    mode: ``'count'``: ``n_c = floor(q_c |S_c| + u)``, ``u ~ U[0, 1)`` (expected
      ``q_c |S_c|``), uniformly without replacement; ``'bernoulli'``: every item with
      probability ``q_c``; ``'repo'``: ``n_c = floor(m q_c / max_c q_c)``, ``m`` the smallest
      non-empty ``|S_c|`` (the authors' code).
    cap: keep a uniformly random ``cap`` of the selected items (0: no cap).
    exclude_row: a cache row (the client's own) left out before ``|S_c|`` is counted.
  """
  import torch  # pylint: disable=g-import-not-at-top
  if mode not in SAMPLING:
    raise ValueError(f'fedcache2.sampling: one of {SAMPLING}, got {mode!r}')
  avail = valid.clone()
  if exclude_row is not None:
    avail[exclude_row] = False
  k_rows, s = avail.shape
  num_classes = p.shape[0]
  cls = slot_class.expand(k_rows, s).reshape(-1)
  flat = avail.reshape(-1)
  q = tau + (1.0 - tau) * p.double()
  sizes = torch.bincount(cls[flat], minlength=num_classes)
  if mode == 'bernoulli':
    u = torch.rand(flat.shape[0], generator=gen, dtype=torch.float64)
    selected = flat & (u < q[cls])
  else:
    if mode == 'count':
      target = q * sizes.double()
      u = torch.rand(num_classes, generator=gen, dtype=torch.float64)
      n = torch.floor(target).long() + (u < target - torch.floor(target)).long()
    else:
      nonempty = sizes > 0
      m = int(sizes[nonempty].min()) if bool(nonempty.any()) else 0
      n = torch.floor(m * q / q.max() + 1e-9).long()
    n = torch.minimum(n, sizes)
    selected = torch.zeros_like(flat)
    for c in range(num_classes):
      items = torch.nonzero(flat & (cls == c)).flatten()
      pick = items[torch.randperm(len(items), generator=gen)[:int(n[c])]]
      selected[pick] = True
  if cap > 0 and int(selected.sum()) > cap:
    items = torch.nonzero(selected).flatten()
    keep = items[torch.randperm(len(items), generator=gen)[:cap]]
    selected = torch.zeros_like(flat)
    selected[keep] = True
  return selected.reshape(k_rows, s)


def _derangement(k: int, gen) -> np.ndarray:
  """sigma of eq. 8: ``donor[k]``, a random cycle through all clients (nobody its own)."""
  import torch  # pylint: disable=g-import-not-at-top
  order = torch.randperm(k, generator=gen).numpy()
  donor = np.empty(k, np.int64)
  donor[order] = np.roll(order, -1)
  return donor


def _jpeg(q, quality: int):
  """``uint8 [N, C, H, W]`` through PIL's JPEG encoder and decoder."""
  import torch  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  out = []
  for img in q.numpy():
    a = img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format='JPEG', quality=quality)
    buf.seek(0)
    b = np.asarray(Image.open(buf))
    out.append(b[None] if b.ndim == 2 else np.moveaxis(b, -1, 0))
  return torch.from_numpy(np.stack(out))


# ------------------------------------------------------------ local training
def _optimizer(torch, model, tr):
  if tr.optimizer == 'adam':
    return torch.optim.Adam(model.parameters(), lr=tr.learning_rate,
                            weight_decay=tr.weight_decay)
  return torch.optim.SGD(model.parameters(), lr=tr.learning_rate, momentum=tr.momentum,
                         weight_decay=tr.weight_decay)


def train_local(ctx, model, opt, x, y, epochs: int, batch_size: int, lr: float) -> float:
  """Cross-entropy minibatch training with ``opt`` (kept between rounds); mean batch loss.

  A new ``torch.randperm`` every epoch, the partial last batch kept (a DataLoader with
  ``shuffle=True``).
  """
  torch, F = ctx.torch, ctx.torch.nn.functional
  for g in opt.param_groups:
    g['lr'] = lr
  model.train()
  n, losses = x.shape[0], []
  for _ in range(epochs):
    perm = torch.randperm(n, generator=ctx.gen)
    for i in range(0, n, batch_size):
      j = perm[i:i + batch_size]
      loss = F.cross_entropy(model(x[j]), y[j])
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
      losses.append(loss.item())
  return float(np.mean(losses)) if losses else float('nan')


def distill(ctx, model, x_b, y_b, x, y, o, value_range, gen) -> tuple[Any, float, int]:
  """Eqs. 10-12: optimises the synthetic inputs ``x_b`` (rows of the classes in ``y_b``).

  ``epochs`` passes over the client's real data ``(x, y)`` in minibatches (a new
  ``torch.randperm`` from ``gen`` every pass), one Adam step on ``x_b`` per minibatch.

  Returns ``(x_b, mean KRR loss, steps skipped for a non-finite loss or gradient)``.
  """
  torch, F = ctx.torch, ctx.torch.nn.functional
  feat = model[:-1]                 # F_f: everything before the final Linear
  model.eval()
  with torch.no_grad():
    phi_all = torch.cat([feat(x[i:i + 1000]) for i in range(0, x.shape[0], 1000)])
  y_all = F.one_hot(y, y_b.shape[1]).float()
  xb = x_b.clone().requires_grad_(True)
  opt = torch.optim.Adam([xb], lr=o.dd_lr)
  bn_train = o.dd_bn_mode == 'train'
  if bn_train:   # the synthetic batch's own statistics; the model's running ones stay
    import copy  # pylint: disable=g-import-not-at-top
    feat = copy.deepcopy(feat).train()
  lo, hi = value_range
  n, losses, skipped = x.shape[0], [], 0
  for _ in range(o.dd_epochs):
    perm = torch.randperm(n, generator=gen)
    for i in range(0, n, o.dd_batch_size):
      j = perm[i:i + o.dd_batch_size]
      loss = krr_loss(phi_all[j], y_all[j], feat(xb), y_b, o.dd_reg)
      opt.zero_grad(set_to_none=True)
      loss.backward()
      if not (bool(torch.isfinite(loss)) and bool(torch.isfinite(xb.grad).all())):
        skipped += 1
        continue
      opt.step()
      with torch.no_grad():
        xb.clamp_(lo, hi)
      losses.append(loss.item())
  model.eval()
  return xb.detach(), (float(np.mean(losses)) if losses else float('nan')), skipped


# ------------------------------------------------------------ the rounds
def _check(ctx):
  spec = ctx.setting.spec
  if ctx.options.batches == 'fedjax':
    raise ValueError("reference.batches: the FedCache 2.0 reference draws its own batches "
                     "(the download changes each client's data set), 'torch' only")
  if spec.data.augment != 'none':
    raise ValueError(f"data.augment: the reference trains without augmentation, got "
                     f'{spec.data.augment!r}')
  if spec.train.compute_dtype != 'float32':
    raise ValueError(f'train.compute_dtype: float32 only, got {spec.train.compute_dtype!r}')
  sel = spec.selection
  if sel.stragglers > 0:
    raise ValueError(f'selection.stragglers: not implemented, got {sel.stragglers}')
  if sel.method == 'power_of_choice':
    raise ValueError("selection.method: 'power_of_choice' is not implemented")
  o = spec.options
  if spec.algorithm == 'fedcache2' and o.sampling not in SAMPLING:
    raise ValueError(f'fedcache2.sampling: one of {SAMPLING}, got {o.sampling!r}')


def _active(ctx, t: int) -> np.ndarray:
  spec = ctx.setting.spec
  if spec.partial or spec.selection.method != 'uniform':
    return np.flatnonzero(ctx.setting.experiment.ctx.selector.plan(t).active)
  return np.arange(ctx.num_clients)


def rounds(ctx) -> Iterator[dict[str, Any]]:
  """Yields one metrics row per round."""
  torch = ctx.torch
  _check(ctx)
  s, spec = ctx.setting, ctx.setting.spec
  tr, o = spec.train, spec.options
  fedcache = spec.algorithm == 'fedcache2'
  k_all, num_classes = ctx.num_clients, s.num_classes
  models = [ctx.model(k) for k in range(k_all)]
  opts = [_optimizer(torch, m, tr) for m in models]
  if fedcache:
    # The cache's own draws (D_0, downloads, sigma, distillation batches) come from a
    # second generator, so that round 1 trains exactly as the single-client run does.
    gen = torch.Generator().manual_seed(ctx.seed + ctx.options.seed_offset + 7919)
    ipc = o.ipc
    slots = num_classes * ipc
    slot_class = torch.arange(slots) // ipc
    y_slot = torch.nn.functional.one_hot(slot_class, num_classes).float()
    image = len(ctx.shape) == 3 and ctx.shape[-1] in (1, 3)
    lo, hi = float(ctx.xp.min()), float(ctx.xp.max())
    value_range = (0.0, 1.0) if lo >= 0.0 and hi <= 1.0 else (lo, hi if hi > lo else lo + 1)
    p = [torch.bincount(y, minlength=num_classes).double() / max(len(y), 1)
         for _, y in ctx.data]                                        # eq. 16
    # D_0^k (eq. 9): ipc distinct random real samples of every class the client has.
    proto = torch.zeros((k_all, slots) + tuple(ctx.xp.shape[1:]))
    proto_valid = torch.zeros((k_all, slots), dtype=torch.bool)
    for k, (x, y) in enumerate(ctx.data):
      for c in range(num_classes):
        rows = torch.nonzero(y == c).flatten()
        take = rows[torch.randperm(len(rows), generator=gen)[:ipc]]
        proto[k, c * ipc:c * ipc + len(take)] = x[take]
        proto_valid[k, c * ipc:c * ipc + len(take)] = True
    cache_x = torch.zeros_like(proto)
    cache_valid = torch.zeros_like(proto_valid)
    donor = None
  for t in range(1, spec.rounds + 1):
    lr = tr.learning_rate * tr.lr_decay ** (t - 1)
    ids = _active(ctx, t)
    if fedcache and o.proto_init == 'sigma' and (t - 1) % o.sigma_period == 0:
      donor = _derangement(k_all, gen)
    losses, dd_losses, skipped, downs = [], [], 0, []
    new_x, new_valid = {}, {}
    for k in ids:
      k = int(k)
      x, y = ctx.data[k]
      if tr.fresh_optimizer:
        opts[k] = _optimizer(torch, models[k], tr)
      if fedcache:
        # 1. device-centric download from the cache as it stood at the round's start
        mask = sample_cache(cache_valid, slot_class, p[k], o.tau, gen, mode=o.sampling,
                            cap=o.max_download, exclude_row=k if o.exclude_own else None)
        downs.append(int(mask.sum()))
        if downs[-1]:
          x = torch.cat([x, cache_x[mask]])
          y = torch.cat([y, slot_class.expand(k_all, slots)[mask]])
      # 2. local training (eq. 14)
      losses.append(train_local(ctx, models[k], opts[k], x, y, tr.epochs, tr.batch_size, lr))
      if not fedcache:
        continue
      # 3. on-device distillation (eqs. 8-12), from the client's real data only
      x0, v0 = proto[k], proto_valid[k]
      if donor is not None and bool(cache_valid[donor[k]].any()):
        x0, v0 = cache_x[donor[k]], cache_valid[donor[k]]
      if not bool(v0.any()):
        continue
      xr, yr = ctx.data[k]
      xb, loss, skip = distill(ctx, models[k], x0[v0], y_slot[v0], xr, yr, o, value_range,
                                 gen)
      dd_losses.append(loss)
      skipped += skip
      full = torch.zeros_like(x0)
      full[v0] = xb
      new_x[k], new_valid[k] = full, v0.clone()
    row: dict[str, Any] = {'round': t, 'train_loss': float(np.mean(losses))}
    if fedcache:
      # 4. upload (eq. 13): each client's row of the cache is replaced
      for k, xk in new_x.items():
        proto[k], proto_valid[k] = xk, new_valid[k]
        recv = xk
        if image:
          lo_, hi_ = value_range
          q = torch.round((xk.clamp(lo_, hi_) - lo_) / (hi_ - lo_) * 255).to(torch.uint8)
          if o.encoding == 'jpeg' and bool(new_valid[k].any()):
            q[new_valid[k]] = _jpeg(q[new_valid[k]], o.jpeg_quality)
          recv = q.float() / 255 * (hi_ - lo_) + lo_
        cache_x[k] = torch.where(new_valid[k].reshape((-1,) + (1,) * (xk.dim() - 1)),
                                 recv, torch.zeros_like(recv))
        cache_valid[k] = new_valid[k]
      finite = [v for v in dd_losses if np.isfinite(v)]
      row.update(dd_loss=float(np.mean(finite)) if finite else float('nan'),
                 dd_skipped_steps=skipped,
                 down_items=float(np.mean(downs)) if downs else 0.0,
                 up_items=int(sum(int(v.sum()) for v in new_valid.values())),
                 cache_items=int(cache_valid.sum()))
    bad = [k for k, m in enumerate(models)
           if not all(bool(torch.isfinite(w).all()) for w in m.parameters())]
    if bad:
      row['nonfinite'] = f'client models {bad[:5]} hold NaN or Inf after round {t}'
      yield row
      return
    row['test_acc'] = ctx.mean_client_acc(models)
    yield row
