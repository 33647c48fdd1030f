"""Per-sample losses for local training and distillation.

* Cross-entropy with integer labels, DS-FL eq. (2) (mean over the batch, as Keras,
  where eq. 2 sums).
* Cross-entropy with soft targets, DS-FL eq. (10)/(11): ``-sum_c t_c log p_c``.
* KL(teacher || student) with temperature and the Hinton ``T^2`` scaling, used by
  the KD-style papers (FedCache 2.0, ACE-pFL).
* ACE-pFL's triple-distillation loss (K. He, H. Bai, Y. Li, J. Chen, R. Du,
  IEEE/ACM ToN 2025, Eq. 4) in an implementable form, teacher-first KL towards the
  student ``q``: ``a1 CE(labels) + T^2 [a2 KL(s^r || q) + a3 KL(s^b || q) + a4 KL(M || q)]``.

All functions return per-sample values ``[B]`` so the engine can apply a
validity mask and average over the real samples of a padded batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def cross_entropy(logits: Array, labels: Array) -> Array:
  """Per-sample CE with integer labels: ``-log softmax(logits)[label]``."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def soft_cross_entropy(logits: Array, targets: Array) -> Array:
  """Per-sample CE with soft targets: ``-sum_c t_c log softmax(logits)_c``."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(targets * logp, axis=-1)


KL_DIRECTIONS = ('teacher_student', 'student_teacher')


def tempered_kl(log_q: Array, teacher: Array, direction: str = 'teacher_student',
                eps: float = 1e-8) -> Array:
  """Per-sample KL between a teacher distribution and a student ``q = exp(log_q)``.

  ``'teacher_student'`` is ``KL(t || q)`` (standard KD; zero teacher entries
  contribute 0, so top-K-filtered teachers are fine). ``'student_teacher'`` is
  the ACE-pFL paper's literal ``KL(q || t)``, which is infinite where ``t`` has
  zeros; the teacher is smoothed to ``(t + eps) / (1 + C eps)`` first.
  """
  if direction == 'teacher_student':
    return jnp.sum(jax.scipy.special.xlogy(teacher, teacher) - teacher * log_q, axis=-1)
  if direction == 'student_teacher':
    t = (teacher + eps) / (1.0 + eps * teacher.shape[-1])
    q = jnp.exp(log_q)
    return jnp.sum(q * (log_q - jnp.log(t)), axis=-1)
  raise ValueError(f'direction={direction!r}: expected one of {KL_DIRECTIONS}')


def triple_distillation_loss(logits: Array, labels: Array, teacher: Array, best_logp: Array,
                             history: Array, temperature: Array | float, weights: Array,
                             direction: str = 'teacher_student') -> Array:
  """ACE-pFL's per-sample personalised loss (Eq. 4, teacher-first KL by default).

  Args:
    logits: ``[B, C]`` student logits on public samples.
    labels: ``[B]`` public labels (``L_CE`` at temperature 1).
    teacher: ``[B, C]`` the aggregate ``s^r`` (``L_KD``, explicit global).
    best_logp: ``[B, C]`` log-probabilities of the client's best past model;
      the ``L_SD`` teacher is ``softmax(best_logp / T)`` (implicit local).
    history: ``[B, C]`` mean of past aggregates ``M`` (``L_GD``, implicit global).
    temperature: ``T_r``.
    weights: ``[4]`` ``(a1, a2, a3, a4)``; a zero switches a term off.
    direction: see :func:`tempered_kl`.

  Returns:
    ``[B]`` ``a1 CE + T^2 (a2 KL_KD + a3 KL_SD + a4 KL_GD)``.
  """
  t = jnp.asarray(temperature, logits.dtype)
  log_q = jax.nn.log_softmax(logits / t, axis=-1)
  sd_teacher = jax.nn.softmax(best_logp / t, axis=-1)
  kd = tempered_kl(log_q, teacher, direction)
  sd = tempered_kl(log_q, sd_teacher, direction)
  gd = tempered_kl(log_q, history, direction)
  # 0 * (a possibly huge term) stays 0: switch terms off with where, not by weight alone.
  kl = (jnp.where(weights[1] != 0, weights[1] * kd, 0.0)
        + jnp.where(weights[2] != 0, weights[2] * sd, 0.0)
        + jnp.where(weights[3] != 0, weights[3] * gd, 0.0))
  return weights[0] * cross_entropy(logits, labels) + t * t * kl


def masked_mean(values: Array, mask: Array) -> Array:
  """Mean of ``values`` over entries with ``mask`` true; 0 when none is."""
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)
