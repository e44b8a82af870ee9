"""On-policy distillation losses: a student pi_S is trained toward a frozen teacher pi_T on its own samples.

The student samples a response y ~ pi_S(.|x); the teacher scores every prefix of
it. At each response position t (mask m_t) let s_t = pi_S(.|x, y_<t) and
p_t = pi_T(.|x, y_<t) be the two next-token distributions over the vocabulary.

Sampled-token reverse KL (NebulaExp OPD; MiniLLM; GKD with the reverse KL). Only
the log-probabilities of the sampled tokens are needed:

  d_t = log pi_S(y_t) - log pi_T(y_t),       E_{y_t ~ s_t}[d_t] = KL(s_t || p_t).

Its gradient is not the gradient of d_t: sampling depends on the student too.
With the prefix held fixed, the score-function (REINFORCE) identity gives

  grad KL(s_t || p_t) = sum_v grad s_t(v) (log s_t(v) - log p_t(v)) + sum_v s_t(v) grad log s_t(v)
                      = E_{y_t ~ s_t}[d_t grad log pi_S(y_t)]          (the second sum is grad 1 = 0).

Differentiating d_t itself would give E[grad log pi_S(y_t)] = 0: no signal, only
noise. `sampled_kl_loss` therefore uses the surrogate

  l_t = sg(d_t) (log pi_S(y_t) - sg(log pi_S(y_t))) + sg(d_t),

whose value is d_t (an unbiased estimate of the KL, for logging) and whose
gradient is exactly sg(d_t) grad log pi_S(y_t); we leave out the zero-mean term
grad d_t = grad log pi_S(y_t), which would only add variance. Each token is
credited with its own d_t (no sum over later tokens, i.e. discount 0), as in
on-policy distillation practice; the gradient is that of sum_t KL(s_t || p_t)
with the prefixes held fixed. `distill_advantages` hands the same signal,
A_t = -coef sg(d_t), to any policy-gradient loss, so distillation mixes with
verifiable rewards.

Full-distribution divergences over the vocabulary V, from the logits z_S, z_T of
every position at temperature tau (P_S = softmax(z_S / tau), P_T = softmax(z_T / tau)):

  forward_kl   KL(P_T || P_S) = sum_v P_T(v) (log P_T(v) - log P_S(v))     (mode covering)
  reverse_kl   KL(P_S || P_T) = sum_v P_S(v) (log P_S(v) - log P_T(v))     (mode seeking)
  jsd          D_beta = JSD_beta / (beta (1 - beta)),   with M = beta P_T + (1 - beta) P_S,
               JSD_beta = beta KL(P_T || M) + (1 - beta) KL(P_S || M)      (GKD's generalized JSD),
               so D_beta = KL(P_T || M) / (1 - beta) + KL(P_S || M) / beta.

The rescaling makes the family continuous on [0, 1] with the two KLs at its ends:
as beta -> 0, KL(P_T || M) -> KL(P_T || P_S) while KL(P_S || M) = O(beta^2); as
beta -> 1 the roles swap. So D_0 = forward KL and D_1 = reverse KL exactly (the
endpoints are computed as those KLs), and D_{1/2} = 4 JSD_{1/2}. Libraries that
use GKD's unscaled JSD_beta in the interior (TRL, ms-swift) report values
beta (1 - beta) times ours; scale the learning rate or the loss to match them.
log M is formed in log space, logaddexp(log beta + log P_T, log(1 - beta) + log P_S).
Near an endpoint the limit is reached slowly (the gap is O(beta chi^2(P_T || P_S)),
large where the student gives little mass to the teacher's tokens), and float32
rounding in KL(P_S || M) / beta grows like 1e-7 / beta: keep beta in [0.01, 0.99],
or use 0 or 1 themselves, which are exact.

top_k > 0 keeps, at each position, only the teacher's k most likely tokens K_t
(ties go to the lower token id) and renormalizes both distributions over them:
P(v) -> P(v) / sum_{u in K_t} P(u), i.e. a log-softmax of the gathered logits.
Student logits outside K_t get no gradient.

The loss is L = (1 / N) sum_t m_t D_t with N the loss tokens of the whole
optimizer step (`num_tokens`), so it and the metrics add up across micro-batches.
The teacher is a constant (`stop_gradient`). All log-softmax math is float32.
`chunked_divergence` computes the logits of `chunk_size` positions at a time from
the final hidden states and LM heads and rematerializes them in the backward
pass, so neither model's `[B, T, V]` logits exist at once (see logprobs.py).

References:
  Agarwal et al. (2024). On-Policy Distillation of Language Models: Learning from
  Self-Generated Mistakes (GKD). arXiv:2306.13649, section 3 (generalized JSD).
  Gu et al. (2024). MiniLLM: Knowledge Distillation of Large Language Models.
  arXiv:2306.08543 (reverse KL, policy-gradient form).
  Williams (1992). Simple statistical gradient-following algorithms for
  connectionist reinforcement learning (REINFORCE).
  NebulaExp-8B (2026). arXiv:2606.26671, section V-C (on-policy distillation:
  reverse KL on the student's own samples, single and multi-teacher).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

Divergence = Literal["reverse_kl", "forward_kl", "jsd"]
DIVERGENCES: tuple[str, ...] = ("reverse_kl", "forward_kl", "jsd")


class SampledKlMetrics(NamedTuple):
  """Sums over this call's loss tokens divided by the step's `num_tokens` (so they add up)."""

  reverse_kl: jax.Array    # mean d_t, the sampled estimate of KL(pi_S || pi_T)
  student_logp: jax.Array  # mean log pi_S(y_t)
  teacher_logp: jax.Array  # mean log pi_T(y_t)
  loss_tokens: jax.Array   # loss tokens in this call (a count, not a mean)


class DistillMetrics(NamedTuple):
  """Sums over this call's loss tokens divided by the step's `num_tokens` (so they add up)."""

  loss: jax.Array              # mean D_t
  teacher_entropy: jax.Array   # mean H(P_T), full vocabulary, at temperature tau
  student_entropy: jax.Array   # mean H(P_S), full vocabulary, at temperature tau
  top1_agreement: jax.Array    # fraction of tokens where argmax P_S = argmax P_T
  loss_tokens: jax.Array       # loss tokens in this call (a count, not a mean)


def _normalizer(mask: jax.Array, num_tokens) -> jax.Array:
  n = mask.sum() if num_tokens is None else jnp.asarray(num_tokens, jnp.float32)
  return jnp.maximum(n, 1.0)


def _check_tokens(student, teacher, mask):
  if student.ndim != 2 or teacher.shape != student.shape or mask.shape != student.shape:
    raise ValueError(f"student log-probs {student.shape}, teacher log-probs {teacher.shape} and mask "
                     f"{mask.shape} must all be [B, T]")


# ---------------------------------------------------------------- sampled-token reverse KL


def sampled_reverse_kl(student_logprobs: Float[Array, "B T"], teacher_logprobs: Float[Array, "B T"],
                       mask: Float[Array, "B T"]) -> Float[Array, "B T"]:
  """d_t = log pi_S(y_t) - log pi_T(y_t) on the student's sampled tokens, 0 where the mask is 0."""
  _check_tokens(student_logprobs, teacher_logprobs, mask)
  d = student_logprobs.astype(jnp.float32) - teacher_logprobs.astype(jnp.float32)
  return jnp.where(mask > 0, d, 0.0)


def sampled_kl_loss(student_logprobs: Float[Array, "B T"], teacher_logprobs: Float[Array, "B T"],
                    mask: Float[Array, "B T"], *,
                    num_tokens: jax.Array | float | None = None) -> tuple[jax.Array, SampledKlMetrics]:
  """Per-token reverse KL on student samples, with the score-function gradient (module docstring).

  Args:
    student_logprobs: `[B, T]` log pi_S(y_t | y_<t) of the sampled tokens, from the model being
      trained (differentiable; `token_logprobs`).
    teacher_logprobs: `[B, T]` log pi_T(y_t | y_<t) of the same tokens; a constant (`stop_gradient`).
    mask: `[B, T]` m_t, 1 on response tokens.
    num_tokens: N, loss tokens in the whole optimizer step; defaults to this call's count.

  Returns:
    `(loss, SampledKlMetrics)`. The loss value is (1 / N) sum_t m_t d_t; its gradient is
    (1 / N) sum_t m_t d_t grad log pi_S(y_t), whose expectation over y ~ pi_S is the gradient
    of (1 / N) sum_t m_t KL(pi_S(.|y_<t) || pi_T(.|y_<t)).

  Example:
    >>> lp = jnp.log(jnp.full((1, 2), 0.5)); m = jnp.ones((1, 2))
    >>> float(sampled_kl_loss(lp, lp - jnp.log(2.0), m)[0])  # teacher gives half: ln 2
    0.6931...
  """
  mask = mask.astype(jnp.float32)
  teacher = jax.lax.stop_gradient(teacher_logprobs)
  d = sampled_reverse_kl(student_logprobs, teacher, mask)
  logp = student_logprobs.astype(jnp.float32)
  signal = jax.lax.stop_gradient(d)
  surrogate = signal * (logp - jax.lax.stop_gradient(logp)) + signal    # value d_t, gradient d_t grad logp
  n = _normalizer(mask, num_tokens)
  mean = lambda x: jnp.sum(jnp.where(mask > 0, x, 0.0) * mask) / n  # noqa: E731
  metrics = SampledKlMetrics(reverse_kl=mean(signal), student_logp=mean(jax.lax.stop_gradient(logp)),
                             teacher_logp=mean(teacher.astype(jnp.float32)), loss_tokens=mask.sum())
  return mean(surrogate), metrics


def distill_advantages(student_logprobs: Float[Array, "B T"], teacher_logprobs: Float[Array, "B T"],
                       mask: Float[Array, "B T"], coef: float = 1.0) -> Float[Array, "B T"]:
  """Per-token advantages A_t = -coef d_t (constants) for a policy-gradient loss; 0 off the mask.

  A policy loss -A_t log pi_S(y_t) (or its clipped-ratio form) then descends coef times the
  sampled reverse KL, and A_t can be added to reward advantages to mix distillation with RL.
  """
  return jax.lax.stop_gradient(-coef * sampled_reverse_kl(student_logprobs, teacher_logprobs, mask))


# ---------------------------------------------------------------- full-distribution divergences


def _kl(logp: jax.Array, logq: jax.Array) -> jax.Array:
  """KL(p || q) over the last axis from log-probabilities (float32)."""
  return jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)


def _check_divergence(kind, beta, top_k, temperature):
  if kind not in DIVERGENCES:
    raise ValueError(f"kind {kind!r} is not one of {DIVERGENCES}")
  if not 0.0 <= beta <= 1.0:
    raise ValueError(f"beta must be in [0, 1], got {beta}")
  if int(top_k) != top_k or top_k < 0:
    raise ValueError(f"top_k must be a non-negative integer (0: the full vocabulary), got {top_k}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature}")


def _divergence(log_s: jax.Array, log_t: jax.Array, kind: str, beta: float) -> jax.Array:
  if kind == "forward_kl" or (kind == "jsd" and beta == 0.0):
    return _kl(log_t, log_s)
  if kind == "reverse_kl" or (kind == "jsd" and beta == 1.0):
    return _kl(log_s, log_t)
  log_m = jnp.logaddexp(math.log(beta) + log_t, math.log1p(-beta) + log_s)
  return _kl(log_t, log_m) / (1.0 - beta) + _kl(log_s, log_m) / beta


def _token_terms(student_logits, teacher_logits, kind, beta, top_k, temperature):
  """Per-token D_t, H(P_T), H(P_S) and top-1 agreement from `[..., V]` logits (float32)."""
  zs = student_logits.astype(jnp.float32) / temperature
  zt = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)) / temperature
  log_s, log_t = jax.nn.log_softmax(zs, axis=-1), jax.nn.log_softmax(zt, axis=-1)
  if 0 < top_k < zs.shape[-1]:
    _, keep = jax.lax.top_k(zt, top_k)                                     # [..., k], teacher's choice
    div = _divergence(jax.nn.log_softmax(jnp.take_along_axis(zs, keep, axis=-1), axis=-1),
                      jax.nn.log_softmax(jnp.take_along_axis(zt, keep, axis=-1), axis=-1), kind, beta)
  else:
    div = _divergence(log_s, log_t, kind, beta)
  sg = jax.lax.stop_gradient
  entropy_t = -jnp.sum(jnp.exp(log_t) * log_t, axis=-1)
  entropy_s = sg(-jnp.sum(jnp.exp(log_s) * log_s, axis=-1))
  agree = (jnp.argmax(zs, axis=-1) == jnp.argmax(zt, axis=-1)).astype(jnp.float32)
  return div, entropy_t, entropy_s, agree


def divergence_from_logits(student_logits: Float[Array, "B T V"], teacher_logits: Float[Array, "B T V"],
                           mask: Float[Array, "B T"], *, kind: Divergence = "reverse_kl", beta: float = 0.5,
                           top_k: int = 0, temperature: float = 1.0) -> Float[Array, "B T"]:
  """Reference: per-token D_t from full logits (module docstring), float32, 0 where the mask is 0.

  The teacher logits are a constant (`stop_gradient`).
  """
  _check_divergence(kind, beta, top_k, temperature)
  if student_logits.ndim != 3 or teacher_logits.shape != student_logits.shape \
      or mask.shape != student_logits.shape[:2]:
    raise ValueError(f"student logits {student_logits.shape}, teacher logits {teacher_logits.shape} must "
                     f"be [B, T, V] and mask {mask.shape} [B, T]")
  div = _token_terms(student_logits, teacher_logits, kind, beta, top_k, temperature)[0]
  return jnp.where(mask > 0, div, 0.0)


def chunked_divergence(student_hidden: Float[Array, "B T D"], student_head: Float[Array, "D V"],
                       teacher_hidden: Float[Array, "B T D"], teacher_head: Float[Array, "D V"],
                       mask: Float[Array, "B T"], *, kind: Divergence = "reverse_kl", beta: float = 0.5,
                       top_k: int = 0, temperature: float = 1.0, chunk_size: int = 1024,
                       num_tokens: jax.Array | float | None = None) -> tuple[jax.Array, DistillMetrics]:
  """Full-vocabulary distillation loss from hidden states and LM heads, `chunk_size` positions at a time.

  Args:
    student_hidden: `[B, T, Ds]` final-norm hidden states of the student at the positions that
      predict the response tokens (`forward(..., return_hidden=True)`).
    student_head: `[Ds, V]` student LM head (the transposed embedding for tied models).
    teacher_hidden: `[B, T, Dt]` teacher hidden states at the same positions; constant.
    teacher_head: `[Dt, V]` teacher LM head over the same vocabulary; constant.
    mask: `[B, T]` m_t, 1 on response tokens.
    kind: `reverse_kl` KL(P_S || P_T), `forward_kl` KL(P_T || P_S), or `jsd` (D_beta).
    beta: the JSD interpolation; 0 gives the forward KL, 1 the reverse KL.
    top_k: restrict both distributions to the teacher's top-k tokens (0: full vocabulary).
    temperature: tau, dividing both models' logits.
    chunk_size: positions per chunk; `T` is padded up to a multiple of it.
    num_tokens: N, loss tokens in the whole optimizer step; defaults to this call's count.

  Returns:
    `(loss, DistillMetrics)`: L = (1 / N) sum_t m_t D_t, and metrics that are sums over this
    call divided by N. Equal to `divergence_from_logits(h_S W_S, h_T W_T, mask, ...)` summed / N.

  Example:
    >>> h = jnp.ones((1, 3, 4)); w = jnp.eye(4, 6); m = jnp.ones((1, 3))
    >>> float(chunked_divergence(h, w, h, w, m, kind="jsd")[0])  # student = teacher
    0.0
  """
  _check_divergence(kind, beta, top_k, temperature)
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  b, t = mask.shape
  if student_hidden.shape[:2] != (b, t) or teacher_hidden.shape[:2] != (b, t):
    raise ValueError(f"student hidden {student_hidden.shape} and teacher hidden {teacher_hidden.shape} "
                     f"must both start with the mask's [B, T] = {(b, t)}")
  if student_head.shape != (student_hidden.shape[-1], teacher_head.shape[-1]) \
      or teacher_head.shape[0] != teacher_hidden.shape[-1]:
    raise ValueError(f"heads {student_head.shape} (student) and {teacher_head.shape} (teacher) must be "
                     f"[D, V] with the hidden widths {student_hidden.shape[-1]}, {teacher_hidden.shape[-1]} "
                     f"and one shared V")
  mask = mask.astype(jnp.float32)
  teacher_hidden = jax.lax.stop_gradient(teacher_hidden)
  teacher_head = jax.lax.stop_gradient(teacher_head)

  def chunk_terms(hs, ht, m):
    zs = jnp.einsum("btd,dv->btv", hs, student_head.astype(hs.dtype), preferred_element_type=jnp.float32)
    zt = jnp.einsum("btd,dv->btv", ht, teacher_head.astype(ht.dtype), preferred_element_type=jnp.float32)
    terms = _token_terms(zs, zt, kind, beta, top_k, temperature)
    return jnp.stack([jnp.where(m > 0, x, 0.0) * m for x in terms])      # [4, B, chunk]

  if t <= chunk_size:
    sums = chunk_terms(student_hidden, teacher_hidden, mask).sum(axis=(1, 2))
  else:
    n = -(-t // chunk_size)
    pad = n * chunk_size - t
    split = lambda x: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)).reshape(  # noqa: E731
        (b, n, chunk_size) + x.shape[2:]).swapaxes(0, 1)                   # [n, B, chunk, ...]
    body = jax.checkpoint(lambda xs: chunk_terms(*xs).sum(axis=(1, 2)))
    sums = jax.lax.map(body, (split(student_hidden), split(teacher_hidden), split(mask))).sum(axis=0)
  denom = _normalizer(mask, num_tokens)
  loss = sums[0] / denom
  sg = jax.lax.stop_gradient
  metrics = DistillMetrics(loss=sg(loss), teacher_entropy=sg(sums[1]) / denom,
                           student_entropy=sg(sums[2]) / denom, top1_agreement=sg(sums[3]) / denom,
                           loss_tokens=mask.sum())
  return loss, metrics
