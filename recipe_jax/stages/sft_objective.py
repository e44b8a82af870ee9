"""The SFT objective as the train step sees it: normalizers per step, loss per micro-batch.

Batches are packed rows: `tokens`, `targets` (next token within the segment),
`loss_mask` (1 where the target is supervised), `segment_ids` (0 = padding) and
`positions`, all `[B, T]`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax.numpy as jnp

from recipe_jax.config import require
from recipe_jax.losses import count_sequences, sft_loss, token_logprobs
from recipe_jax.models import ModelConfig, forward


@dataclasses.dataclass(frozen=True)
class SftLossConfig:
  normalization: Literal["sum", "token_mean", "sequence_mean"] = "sum"
  sum_constant: float = 1.0
  logprob_chunk_size: int = 1024

  def __post_init__(self):
    require(self.sum_constant > 0, "loss.sum_constant", "must be positive")
    require(self.logprob_chunk_size >= 1, "loss.logprob_chunk_size", "must be >= 1")


def sft_normalizers(batch: dict) -> dict:
  """Step-global denominators, computed once on the whole optimizer-step batch."""
  mask = batch["loss_mask"].astype(jnp.float32)
  return {"num_tokens": mask.sum(), "num_sequences": count_sequences(mask, batch["segment_ids"])}


def make_sft_loss(model: ModelConfig, loss: SftLossConfig, *, num_micro_batches: int = 1, mesh=None):
  """`loss_fn(params, micro_batch, normalizers) -> (loss, metrics)` for `make_train_step`.

  The MoE balance loss is averaged over micro-batches and weighted by
  `router_aux_loss_coef`.
  """

  def loss_fn(params, batch, normalizers):
    out = forward(model, params, batch["tokens"], positions=batch["positions"],
                  segment_ids=batch["segment_ids"], return_hidden=True, mesh=mesh)
    head = params["embed"].T if model.tie_word_embeddings else params["lm_head"]
    logprobs = token_logprobs(out.hidden_states, head, batch["targets"], chunk_size=loss.logprob_chunk_size)
    value, m = sft_loss(logprobs, batch["loss_mask"], normalization=loss.normalization,
                        num_tokens=normalizers["num_tokens"], num_sequences=normalizers["num_sequences"],
                        sum_constant=loss.sum_constant, segment_ids=batch["segment_ids"])
    aux = model.router_aux_loss_coef * out.aux_loss / num_micro_batches
    return value + aux, {"sft_loss": value, "aux_loss": aux, "loss_sum": m.loss_sum,
                         "loss_tokens": m.loss_tokens}

  return loss_fn
