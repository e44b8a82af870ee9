"""The RL objective as the train step sees it: normalizers per optimizer step, loss per micro-batch.

Batches are packed rows (`recipe_jax.stages.rl_batch`): `tokens, targets, loss_mask,
segment_ids, positions, advantages, sampler_logprobs`, optionally `old_logprobs` (the
proximal policy, when a rollout batch feeds several optimizer steps), `ref_logprobs`
(KL loss) and `replay_experts` `[B, T, L_moe, k]` (routing replay), all rows first.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp

from recipe_jax.config import require
from recipe_jax.losses import count_sequences, token_logprobs
from recipe_jax.losses.policy import policy_loss
from recipe_jax.models import ModelConfig, forward


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """`policy_loss`'s hyperparameters (see `recipe_jax.losses.policy`).

  kl_coef > 0 adds the KL-to-reference loss term (estimator `kl_estimator`);
  kl_reward_coef > 0 subtracts kl_reward_coef * sum_t k1 from each response's reward
  instead. With both 0 the reference model is never run.
  """

  ratio_level: Literal["token", "sequence", "sequence_token"] = "token"
  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float | None = None
  aggregation: Literal["token_mean", "sequence_mean_token_mean", "sequence_mean_token_sum",
                       "constant_sum"] = "token_mean"
  sum_constant: float = 1.0
  kl_coef: float = 0.0
  kl_estimator: Literal["k1", "k2", "k3"] = "k3"
  kl_reward_coef: float = 0.0
  correction: Literal["none", "truncate_token", "truncate_sequence", "mask_token", "mask_sequence"] = "none"
  correction_cap: float = 2.0
  correction_bounds: tuple[float, float] = (0.5, 2.0)
  max_segments: int = 64
  logprob_chunk_size: int = 1024

  def __post_init__(self):
    require(self.clip_low >= 0 and self.clip_high >= 0, "loss.clip_low", "clip ranges must be >= 0")
    require(self.kl_coef >= 0 and self.kl_reward_coef >= 0, "loss.kl_coef", "KL coefficients must be >= 0")
    require(self.max_segments >= 1, "loss.max_segments", "must be >= 1")

  @property
  def uses_reference(self) -> bool:
    return self.kl_coef > 0 or self.kl_reward_coef > 0


def rl_normalizers(batch: dict) -> dict:
  """Step-global denominators, computed once on the whole optimizer-step batch."""
  mask = batch["loss_mask"].astype(jnp.float32)
  return {"num_tokens": mask.sum(), "num_sequences": count_sequences(mask, batch["segment_ids"])}


def replayed_experts(batch: dict):
  """The batch's recorded expert ids `[B, T, L_moe, k]` (stored small) as `forward`'s
  `replay_experts` `[L_moe, B, T, k]` int32, or None without routing replay."""
  experts = batch.get("replay_experts")
  return None if experts is None else jnp.transpose(experts, (2, 0, 1, 3)).astype(jnp.int32)  # [L, B, T, k]


def make_token_logprobs(model: ModelConfig, *, chunk_size: int = 1024, mesh=None, with_entropy: bool = False):
  """`fn(params, batch) -> [B, T]` log-probs of the targets (with routing replay if the batch has it)."""

  def fn(params, batch):
    out = forward(model, params, batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"],
                  replay_experts=replayed_experts(batch), return_hidden=True, mesh=mesh)
    head = params["embed"].T if model.tie_word_embeddings else params["lm_head"]
    lp = token_logprobs(out.hidden_states, head, batch["targets"], chunk_size=chunk_size, with_entropy=with_entropy)
    return (lp, out.aux_loss) if with_entropy else lp

  return fn


def make_rl_loss(model: ModelConfig, loss: PolicyLossConfig, *, num_micro_batches: int = 1, mesh=None):
  """`loss_fn(params, micro_batch, normalizers) -> (loss, metrics)` for `make_train_step`."""
  logprobs_fn = make_token_logprobs(model, chunk_size=loss.logprob_chunk_size, mesh=mesh, with_entropy=True)

  def loss_fn(params, batch, normalizers):
    (logprobs, entropy), balance = logprobs_fn(params, batch)
    value, m = policy_loss(
        logprobs, batch.get("old_logprobs"), batch["advantages"], batch["loss_mask"],
        num_tokens=normalizers["num_tokens"], num_sequences=normalizers["num_sequences"],
        segment_ids=batch["segment_ids"], max_segments=loss.max_segments,
        sampler_logprobs=batch["sampler_logprobs"], ref_logprobs=batch.get("ref_logprobs"), entropy=entropy,
        ratio_level=loss.ratio_level, clip_low=loss.clip_low, clip_high=loss.clip_high, dual_clip=loss.dual_clip,
        aggregation=loss.aggregation, sum_constant=loss.sum_constant, kl_coef=loss.kl_coef,
        kl_estimator=loss.kl_estimator, correction=loss.correction, correction_cap=loss.correction_cap,
        correction_bounds=loss.correction_bounds)
    aux = model.router_aux_loss_coef * balance / num_micro_batches
    metrics = {f"policy/{k}": v for k, v in m._asdict().items()}
    return value + aux, dict(metrics, policy_loss=value, aux_loss=jnp.asarray(aux, jnp.float32))

  return loss_fn
