"""Local update rules of the personalised parameter-exchange baselines (pure pytree math).

pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020, Algorithm 1, eqs. 7-9) and Per-FedAvg (Fallah,
Mokhtari, Ozdaglar, NeurIPS 2020, Algorithm 1 and its FO / HF variants). Every rule takes
gradient functions ``grad_fn(params, aux) -> (grads, aux)`` of one minibatch's loss, so the
same math runs inside the clients' vmapped local loop (``aux`` threads the BatchNorm
statistics and the last loss value there) and on a hand-checkable quadratic in the tests
(``aux`` anything, e.g. ``None``). Step sizes may be Python floats or traced scalars.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

GradFn = Callable[[Any, Any], tuple[Any, Any]]


def _axpy(a: Any, x: Any, y: Any) -> Any:
  """``y + a x`` leaf by leaf, in ``y``'s dtypes."""
  return jax.tree.map(lambda xi, yi: yi + (a * xi).astype(yi.dtype), x, y)


def pfedme_personalize(grad_fn: GradFn, theta: Any, w: Any, aux: Any, *, lam: Any, lr: Any,
                       steps: int) -> tuple[Any, Any]:
  """pFedMe's inner solve: ``steps`` gradient steps on ``f(theta; D) + lam/2 ||theta - w||^2``.

  ``theta <- theta - lr (grad f(theta; D) + lam (theta - w))``, ``steps`` (pFedMe's K) times
  on the same minibatch ``D`` (the one ``grad_fn`` closes over): the approximate
  ``theta~(w)`` of eq. 7.

  Returns:
    ``(theta, aux)`` after the last step.
  """
  def body(_, carry):
    th, a = carry
    g, a = grad_fn(th, a)
    th = jax.tree.map(lambda t, gi, wi: t - (lr * (gi + lam * (t - wi))).astype(t.dtype),
                      th, g, w)
    return th, a
  return jax.lax.fori_loop(0, int(steps), body, (theta, aux))


def pfedme_local_update(w: Any, theta: Any, *, lam: Any, eta: Any) -> Any:
  """pFedMe's local model step (Algorithm 1): ``w <- w - eta lam (w - theta)``."""
  return jax.tree.map(lambda a, t: a - (eta * lam * (a - t)).astype(a.dtype), w, theta)


def pfedme_server_update(w: Any, mean: Any, beta: Any) -> Any:
  """pFedMe's server step: ``w <- (1 - beta) w + beta mean_S(w_k)``."""
  return jax.tree.map(lambda a, m: ((1.0 - beta) * a + beta * m).astype(a.dtype), w, mean)


def perfedavg_step(grad_fns: tuple[GradFn, ...], w: Any, aux: Any, *, alpha: Any, beta: Any,
                   hessian_free: bool) -> tuple[Any, Any]:
  """One Per-FedAvg local step on batches ``D, D' (, D'')``.

  FO: ``w' = w - alpha grad f(w; D)``, ``w <- w - beta grad f(w'; D')``.
  HF: ``w <- w - beta (I - alpha H(w; D'')) grad f(w'; D')``, with the Hessian-vector
  product ``H(w; D'') v`` exact (``jax.jvp`` of the gradient; the paper approximates it by a
  finite difference of two gradients with a small ``delta``).

  Args:
    grad_fns: gradient functions of ``D``, ``D'`` and, for HF, ``D''``.
    w: the local model.
    aux: threaded through the ``D`` and ``D'`` evaluations; the Hessian pass does not
      change it.
    alpha, beta: the adaptation and meta step sizes.
    hessian_free: the HF variant (needs ``grad_fns[2]``).

  Returns:
    ``(w, aux)``.
  """
  g1, aux = grad_fns[0](w, aux)
  adapted = _axpy(-alpha, g1, w)
  g2, aux = grad_fns[1](adapted, aux)
  if hessian_free:
    g3 = grad_fns[2]
    hvp = jax.jvp(lambda p: g3(p, aux)[0], (w,), (g2,))[1]
    g2 = jax.tree.map(lambda g, h: g - alpha * h, g2, hvp)
  return _axpy(-beta, g2, w), aux


def sgd_steps(grad_fns: tuple[GradFn, ...], w: Any, aux: Any, *, lr: Any) -> tuple[Any, Any]:
  """One plain gradient step ``w <- w - lr grad f(w; D_i)`` per function, in order
  (Per-FedAvg's personalisation from the global model)."""
  for g in grad_fns:
    grads, aux = g(w, aux)
    w = _axpy(-lr, grads, w)
  return w, aux
