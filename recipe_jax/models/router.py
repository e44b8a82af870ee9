"""Expert routing: scores, group-limited top-k selection, gates, replay, balance statistics.

All router semantics come from `ModelConfig` fields (see its docstring); the
same function serves Qwen3-MoE (softmax, optional renormalization) and
GLM-4.5 (sigmoid, selection bias, expert groups, scaling).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from recipe_jax.models.config import ModelConfig


class Routing(NamedTuple):
  expert_ids: jax.Array     # [n, k] int32, the chosen (or replayed) experts
  gates: jax.Array          # [n, k] float32, weight of each chosen expert's output
  balance_probs: jax.Array  # [n, E] float32, per-token distribution used by the balance loss


def router_scores(logits: jax.Array, score: str) -> jax.Array:
  """Float32 scores `[n, E]` from router logits: softmax over experts, or elementwise sigmoid."""
  logits = logits.astype(jnp.float32)
  if score == "softmax":
    return jax.nn.softmax(logits, axis=-1)
  if score == "sigmoid":
    return jax.nn.sigmoid(logits)
  raise ValueError(f"router_score {score!r} is not softmax or sigmoid")


def select_experts(choice: jax.Array, *, k: int, n_group: int, topk_group: int) -> jax.Array:
  """Top-`k` expert ids `[n, k]` from selection scores `[n, E]`, limited to the best groups.

  With `n_group > 1` the experts form `n_group` equal contiguous groups; a
  group's score is the sum of its two best selection scores; only experts in
  the `topk_group` best groups can be chosen.
  """
  if n_group > 1:
    n, e = choice.shape
    grouped = choice.reshape(n, n_group, e // n_group)
    group_score = jax.lax.top_k(grouped, 2)[0].sum(-1)                  # [n, G]
    _, best_groups = jax.lax.top_k(group_score, topk_group)            # [n, topk_group]
    keep = jnp.zeros((n, n_group), bool).at[jnp.arange(n)[:, None], best_groups].set(True)
    keep = jnp.repeat(keep, e // n_group, axis=1)
    choice = jnp.where(keep, choice, -jnp.inf)
  return jax.lax.top_k(choice, k)[1].astype(jnp.int32)


def route(logits: jax.Array, cfg: ModelConfig, *, selection_bias: jax.Array | None = None,
          replay_ids: jax.Array | None = None) -> Routing:
  """Chooses experts and their gates for `n` tokens.

  Args:
    logits: router logits `[n, E]` (computed in float32 by the caller).
    cfg: the model config; its router fields define the semantics.
    selection_bias: `[E]`, added to the scores for selection only (GLM-4.5's
      `e_score_correction_bias`); never part of the gates.
    replay_ids: `[n, k]` recorded expert ids (routing replay). Selection is
      skipped; gates are recomputed from these logits at these ids, so the
      router still receives gradient.
  """
  scores = router_scores(logits, cfg.router_score)
  if replay_ids is None:
    choice = scores if selection_bias is None else scores + selection_bias.astype(jnp.float32)
    ids = select_experts(jax.lax.stop_gradient(choice), k=cfg.num_experts_per_tok,
                         n_group=cfg.router_n_group, topk_group=cfg.router_topk_group)
  else:
    # Engines may record padding as -1 (or E); such ids must not touch real experts' rows.
    ids = jnp.clip(replay_ids.astype(jnp.int32), 0, logits.shape[-1] - 1)
  gates = jnp.take_along_axis(scores, ids, axis=-1)
  if cfg.router_norm_topk_prob:
    gates = gates / (gates.sum(-1, keepdims=True) + 1e-20)
  gates = gates * cfg.router_scaling_factor
  if cfg.router_score == "softmax":
    balance = scores
  else:
    balance = scores / (scores.sum(-1, keepdims=True) + 1e-20)
  return Routing(ids, gates, balance)


def balance_stats(routing: Routing, valid: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array]:
  """Per-expert assignment counts and summed balance probabilities over valid tokens.

  Returns `(counts [E], prob_sums [E])`; padding tokens (`valid` false) count for nothing.
  """
  w = valid.astype(jnp.float32)
  k = routing.expert_ids.shape[1]
  counts = jnp.zeros((num_experts,), jnp.float32).at[routing.expert_ids.reshape(-1)].add(jnp.repeat(w, k))
  prob_sums = jnp.einsum("ne,n->e", routing.balance_probs, w)
  return counts, prob_sums


def load_balancing_loss(counts: jax.Array, prob_sums: jax.Array, num_tokens: jax.Array) -> jax.Array:
  """Switch-Transformer balance loss over all MoE layers, as Hugging Face computes it.

  L_aux = E * sum_e f_e P_e, where f_e = (assignments to expert e over all
  layers) / R and P_e = (summed router probability of e over all layers) / R,
  with R = number of valid tokens times number of MoE layers.

  Args:
    counts: `[L, E]` assignment counts per MoE layer.
    prob_sums: `[L, E]` summed balance probabilities per MoE layer.
    num_tokens: scalar, valid tokens in the batch.

  References:
    Fedus, Zoph, Shazeer (2021). Switch Transformers. arXiv:2101.03961, eq. 4-6.
  """
  num_layers, num_experts = counts.shape
  rows = jnp.maximum(num_tokens.astype(jnp.float32) * num_layers, 1.0)
  f = counts.sum(0) / rows
  p = prob_sums.sum(0) / rows
  return num_experts * jnp.sum(f * p)
