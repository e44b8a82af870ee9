"""The on-policy distillation objective as the train step sees it: teacher signals in, loss per micro-batch.

Batches are packed rows (`recipe_jax.stages.rl_batch`): `tokens, targets, loss_mask,
segment_ids, positions, sampler_logprobs, advantages` (unused), plus what the teachers
produced for the same rows:

  teacher_logprobs  [B, T]        log pi_T(y_t) of the sampled tokens, from the row's teacher
  domain_ids        [B, T] int32  1 + the domain index of each loss token (0 elsewhere)
  teacher_rows      [B]    int32  the teacher that scored each row (-1: padding row)
  teacher_hidden    [B, T, D]     full-distribution kinds only: the teacher's final hidden states,
                                  zero-padded to the widest teacher's D (a zero column adds
                                  nothing to h W)

and `replay_experts` `[B, T, L_moe, k]` with routing replay. The teachers' LM heads
(`[D, V]`, zero-padded the same way) enter the step as a separate argument, not as
rows, because micro-batching splits every batch field by rows.

Kinds (`recipe_jax.losses.distill` has the maths):

  sampled      per-token sampled reverse KL, d_t = log pi_S(y_t) - log pi_T(y_t), with the
               score-function gradient (NebulaExp's OPD and MOPD)
  advantage    A_t = -coef d_t fed to `losses.policy.policy_loss` (clipped surrogate), the
               form that mixes with reward advantages
  reverse_kl, forward_kl, jsd
               the full-vocabulary divergence at every response position from both models'
               hidden states and heads (`chunked_divergence`, optional teacher top-k)

Whatever the kind, the metrics carry the sampled estimate mean d_t overall and per domain
(sums `domain_kl_sum` / `domain_tokens`, which add across micro-batches; the stage divides).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from recipe_jax.config import require
from recipe_jax.losses import token_logprobs
from recipe_jax.losses.distill import DIVERGENCES, chunked_divergence, distill_advantages, sampled_kl_loss
from recipe_jax.losses.policy import policy_loss
from recipe_jax.models import ModelConfig, forward
from recipe_jax.stages.rl_objective import PolicyLossConfig, replayed_experts, rl_normalizers

DistillKind = Literal["sampled", "advantage", "reverse_kl", "forward_kl", "jsd"]
distill_normalizers = rl_normalizers   # num_tokens and num_sequences of the whole optimizer step


@dataclasses.dataclass(frozen=True)
class DistillLossConfig:
  """How the student is pulled toward its teachers.

  kind: see the module docstring; "sampled" is the NebulaExp default.
  coef: the advantage scale of kind "advantage" (A_t = -coef d_t).
  policy: the clipped surrogate's settings for kind "advantage" (no reference model: kl_coef 0).
  beta, top_k, temperature: the full-distribution kinds' JSD weight, teacher top-k (0: all
    of V) and logit temperature.
  chunk_size: positions per chunk of the full-distribution loss (its [B, chunk, V] logits).
  """

  kind: DistillKind = "sampled"
  coef: float = 1.0
  policy: PolicyLossConfig = PolicyLossConfig()
  beta: float = 0.5
  top_k: int = 0
  temperature: float = 1.0
  chunk_size: int = 1024
  logprob_chunk_size: int = 1024
  max_segments: int = 64

  def __post_init__(self):
    require(self.kind in ("sampled", "advantage") + DIVERGENCES, "loss.kind",
            f"{self.kind!r} is not one of {['sampled', 'advantage', *DIVERGENCES]}")
    require(self.coef > 0, "loss.coef", f"must be > 0, got {self.coef}")
    require(not self.policy.uses_reference, "loss.policy.kl_coef",
            "distillation loads no reference model; set kl_coef and kl_reward_coef to 0")
    require(0.0 <= self.beta <= 1.0, "loss.beta", f"must be in [0, 1], got {self.beta}")
    require(self.top_k >= 0, "loss.top_k", f"must be >= 0 (0: the full vocabulary), got {self.top_k}")
    require(self.temperature > 0, "loss.temperature", f"must be > 0, got {self.temperature}")
    require(self.chunk_size >= 1 and self.logprob_chunk_size >= 1, "loss.chunk_size",
            "and loss.logprob_chunk_size must be >= 1")
    require(self.max_segments >= 1, "loss.max_segments", "must be >= 1")

  @property
  def full_distribution(self) -> bool:
    """Whether the loss needs the teachers' hidden states and heads, not only their log-probs."""
    return self.kind in DIVERGENCES


def _head(model: ModelConfig, params):
  return params["embed"].T if model.tie_word_embeddings else params["lm_head"]


def make_teacher_pass(model: ModelConfig, *, chunk_size: int = 1024, with_hidden: bool = False, mesh=None):
  """`fn(params, rows) -> teacher_logprobs [B, T]` (and the final hidden states `[B, T, D]` with
  `with_hidden`): one forward of a teacher over the rows routed to it. No routing replay: a
  teacher routes the tokens its own way."""

  def fn(params, rows):
    out = forward(model, params, rows["tokens"], positions=rows["positions"], segment_ids=rows["segment_ids"],
                  return_hidden=True, mesh=mesh)
    lp = token_logprobs(out.hidden_states, _head(model, params), rows["targets"], chunk_size=chunk_size)
    return (lp, out.hidden_states) if with_hidden else lp

  return fn


def teacher_head(model: ModelConfig, params, width: int) -> jax.Array:
  """A teacher's `[D, V]` LM head with zero rows appended up to `width` (the widest teacher)."""
  head = _head(model, params)
  return jnp.pad(head, ((0, width - head.shape[0]), (0, 0)))


def make_distill_loss(model: ModelConfig, loss: DistillLossConfig, *, num_domains: int, num_micro_batches: int = 1,
                      mesh=None):
  """`make(heads) -> loss_fn(params, micro_batch, normalizers) -> (loss, metrics)` for `make_train_step`.

  `heads` is the tuple of teachers' padded LM heads (empty unless the kind is full-distribution).
  """

  def make(heads: tuple = ()):
    def loss_fn(params, batch, normalizers):
      out = forward(model, params, batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"],
                    replay_experts=replayed_experts(batch), return_hidden=True, mesh=mesh)
      head = _head(model, params)
      logp = token_logprobs(out.hidden_states, head, batch["targets"], chunk_size=loss.logprob_chunk_size)
      mask = batch["loss_mask"].astype(jnp.float32)
      teacher = batch["teacher_logprobs"].astype(jnp.float32)
      n = normalizers["num_tokens"]
      # the sampled reverse KL of every kind, for the metrics (its loss and gradient are the "sampled" kind's)
      value, m = sampled_kl_loss(logp, teacher, mask, num_tokens=n)
      metrics = {"distill/reverse_kl": m.reverse_kl, "distill/student_logp": m.student_logp,
                 "distill/teacher_logp": m.teacher_logp}
      if loss.kind == "advantage":
        p = loss.policy
        value, pm = policy_loss(
            logp, None, distill_advantages(logp, teacher, mask, loss.coef), mask, num_tokens=n,
            num_sequences=normalizers["num_sequences"], segment_ids=batch["segment_ids"],
            max_segments=loss.max_segments, sampler_logprobs=batch["sampler_logprobs"],
            ratio_level=p.ratio_level, clip_low=p.clip_low, clip_high=p.clip_high, dual_clip=p.dual_clip,
            aggregation=p.aggregation, sum_constant=p.sum_constant, correction=p.correction,
            correction_cap=p.correction_cap, correction_bounds=p.correction_bounds)
        metrics.update({f"policy/{k}": v for k, v in pm._asdict().items()})
      elif loss.full_distribution:
        value = jnp.zeros((), jnp.float32)
        rows = batch["teacher_rows"]
        for k, teacher_w in enumerate(heads):     # each teacher's divergence on its own rows
          mask_k = mask * (rows == k).astype(jnp.float32)[:, None]
          v, dm = chunked_divergence(out.hidden_states, head, batch["teacher_hidden"], teacher_w, mask_k,
                                     kind=loss.kind, beta=loss.beta, top_k=loss.top_k,
                                     temperature=loss.temperature, chunk_size=loss.chunk_size, num_tokens=n)
          value = value + v
          for name in ("teacher_entropy", "student_entropy", "top1_agreement"):
            key = f"distill/{name}"
            metrics[key] = metrics.get(key, 0.0) + getattr(dm, name)
        metrics["distill/divergence"] = value
      d = jnp.where(mask > 0, jax.lax.stop_gradient(logp) - teacher, 0.0)
      onehot = (batch["domain_ids"][..., None] == jnp.arange(1, num_domains + 1)).astype(jnp.float32)
      metrics["domain_kl_sum"] = jnp.einsum("bt,btk->k", d * mask, onehot)
      metrics["domain_tokens"] = jnp.einsum("bt,btk->k", mask, onehot)
      aux = model.router_aux_loss_coef * out.aux_loss / num_micro_batches
      return value + aux, dict(metrics, distill_loss=value, aux_loss=jnp.asarray(aux, jnp.float32))

    return loss_fn

  return make
