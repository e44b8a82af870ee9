"""Creating parameters directly sharded, and counting them."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax

from recipe_jax.models.config import ModelConfig
from recipe_jax.models.transformer import abstract_params, init_params_unsharded
from recipe_jax.parallel.sharding import param_shardings


def init_params(cfg: ModelConfig, *, mesh=None, seed: int = 0) -> dict:
  """Fresh parameters; with a mesh each one is created on its shards (never whole on one device)."""
  if mesh is None:
    return jax.jit(init_params_unsharded, static_argnums=(0, 1))(cfg, seed)
  shardings = param_shardings(cfg, abstract_params(cfg), mesh)
  return jax.jit(init_params_unsharded, static_argnums=(0, 1), out_shardings=shardings)(cfg, seed)


class ParamCounts(NamedTuple):
  total: int          # every parameter of the decoder
  active: int         # parameters used for one token: all but the unchosen routed experts
  embedding: int      # input embedding plus (untied) LM head

  @property
  def active_non_embedding(self) -> int:
    return self.active - self.embedding


def param_counts(cfg: ModelConfig) -> ParamCounts:
  """Counts from the abstract parameter tree (`jax.eval_shape`; nothing is allocated)."""
  tree = abstract_params(cfg)
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
  per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
  inactive = cfg.num_moe_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
  embedding = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
  return ParamCounts(total, total - inactive, embedding)
