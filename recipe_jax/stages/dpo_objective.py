"""The preference objective as the train step sees it: pair normalizer, loss per micro-batch.

Batches are whole pairs (`recipe_jax.data.preference`): `tokens`, `targets`,
`loss_mask`, `segment_ids`, `positions`, each `[B, 2, T]` (pair axis: chosen,
rejected), and `reference_logps` `[B, 2]`. The model sees the `2B` rows as one
batch; the log-probs are folded back onto the pair axis for `dpo_loss`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from recipe_jax.config import require
from recipe_jax.losses import count_pairs, dpo_loss, sequence_logps, token_logprobs
from recipe_jax.losses.dpo import PREFERENCE_LOSSES, PreferenceLoss
from recipe_jax.models import ModelConfig, forward


@dataclasses.dataclass(frozen=True)
class DpoLossConfig:
  """Which preference loss and its hyperparameters (see `recipe_jax.losses.dpo`)."""

  loss_type: PreferenceLoss = "length_normalized"
  beta: float = 5.0
  label_smoothing: float = 0.0   # sigmoid (cDPO)
  gamma: float = 0.0             # SimPO's target margin
  tau: float = 0.1               # IPO
  logprob_chunk_size: int = 1024

  def __post_init__(self):
    require(self.loss_type in PREFERENCE_LOSSES, "loss.loss_type", f"{self.loss_type!r} is not one of "
            f"{list(PREFERENCE_LOSSES)}")
    require(self.beta > 0, "loss.beta", "must be positive")
    require(0 <= self.label_smoothing < 0.5, "loss.label_smoothing", "must be in [0, 0.5)")
    require(self.tau > 0, "loss.tau", "must be positive")
    require(self.logprob_chunk_size >= 1, "loss.logprob_chunk_size", "must be >= 1")


def dpo_normalizers(batch: dict) -> dict:
  """N, the real pairs of the whole optimizer-step batch (computed once, before the micro-batches)."""
  return {"num_pairs": count_pairs(batch["loss_mask"])}


def pair_token_logprobs(model: ModelConfig, params, batch: dict, *, chunk_size: int,
                        mesh=None) -> tuple[jax.Array, jax.Array]:
  """`([B, 2, T] log pi(target), MoE balance loss)` of a batch of pairs."""
  b, p, t = batch["tokens"].shape
  flat = {k: batch[k].reshape(b * p, t) for k in ("tokens", "targets", "segment_ids", "positions")}
  out = forward(model, params, flat["tokens"], positions=flat["positions"], segment_ids=flat["segment_ids"],
                return_hidden=True, mesh=mesh)
  head = params["embed"].T if model.tie_word_embeddings else params["lm_head"]
  logprobs = token_logprobs(out.hidden_states, head, flat["targets"], chunk_size=chunk_size)
  return logprobs.reshape(b, p, t), out.aux_loss


def make_sequence_logps(model: ModelConfig, *, chunk_size: int, mesh=None):
  """A jitted `(params, batch) -> (log pi(y|x) [B, 2], |y| [B, 2])`: reference pass and evaluation."""

  @jax.jit
  def logps(params, batch):
    lp, _ = pair_token_logprobs(model, params, batch, chunk_size=chunk_size, mesh=mesh)
    return sequence_logps(lp, batch["loss_mask"])

  return logps


def make_dpo_loss(model: ModelConfig, loss: DpoLossConfig, *, num_micro_batches: int = 1, mesh=None):
  """`loss_fn(params, micro_batch, normalizers) -> (loss, metrics)` for `make_train_step`.

  The metrics are step means already divided by N, so they add up over micro-batches.
  """

  def loss_fn(params, batch, normalizers):
    logprobs, balance = pair_token_logprobs(model, params, batch, chunk_size=loss.logprob_chunk_size, mesh=mesh)
    value, m = dpo_loss(logprobs, batch["loss_mask"], batch["reference_logps"], loss_type=loss.loss_type,
                        beta=loss.beta, label_smoothing=loss.label_smoothing, gamma=loss.gamma, tau=loss.tau,
                        num_pairs=normalizers["num_pairs"])
    aux = model.router_aux_loss_coef * balance / num_micro_batches
    metrics = {k: v for k, v in m._asdict().items() if k != "num_pairs"}
    return value + aux, dict(metrics, dpo_loss=value, aux_loss=jnp.asarray(aux, jnp.float32))

  return loss_fn
