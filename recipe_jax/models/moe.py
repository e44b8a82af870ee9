"""The Mixture-of-Experts feed-forward block (router, routed experts, shared experts)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from recipe_jax.models import moe_dispatch
from recipe_jax.models.config import ModelConfig
from recipe_jax.models.layers import ParamKeys, MLP, normal_param, zeros_param
from recipe_jax.models.router import Routing, route
from recipe_jax.parallel.mesh import mesh_platform


def resolve_all_to_all(choice: str, mesh=None) -> str:
  """`auto` picks ragged all-to-all on TPU and GPU, padded elsewhere (XLA:CPU lacks it).

  The platform is that of the mesh's devices when known, so compiling for a TPU
  topology from a CPU host takes the TPU path.
  """
  if choice != "auto":
    return choice
  return "ragged" if mesh_platform(mesh) in ("tpu", "gpu") else "padded"


class MoE(nnx.Module):
  """Routed experts plus optional shared experts.

  Params: router `[D, E]` (float32), router_bias `[E]` (float32, selection
  only, when `router_selection_bias`), gate_proj / up_proj `[E, D, M]`,
  down_proj `[E, M, D]`, and `shared` (an `MLP` of width S) when
  `num_shared_experts > 0`.
  """

  def __init__(self, cfg: ModelConfig, keys: ParamKeys):
    d, e, m = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    self.cfg = cfg
    self.router = normal_param(keys, (d, e), cfg, dtype=jnp.float32)
    if cfg.router_selection_bias:
      self.router_bias = zeros_param((e,), jnp.float32)
    self.gate_proj = normal_param(keys, (e, d, m), cfg)
    self.up_proj = normal_param(keys, (e, d, m), cfg)
    self.down_proj = normal_param(keys, (e, m, d), cfg)
    if cfg.num_shared_experts:
      self.shared = MLP(cfg, cfg.shared_intermediate_size, keys)

  def __call__(self, x: jax.Array, *, mesh=None, replay_ids: jax.Array | None = None
               ) -> tuple[jax.Array, Routing]:
    """x `[B, T, D]` -> (y `[B, T, D]`, routing over the `B*T` flattened tokens)."""
    cfg = self.cfg
    b, t, d = x.shape
    flat = x.reshape(b * t, d)
    if cfg.router_logits_dtype == "model":
      logits = (flat @ self.router[...].astype(flat.dtype)).astype(jnp.float32)
    else:  # a true float32 product, also on TPU where the default precision is bf16 passes
      logits = jnp.matmul(flat.astype(jnp.float32), self.router[...], precision=jax.lax.Precision.HIGHEST)
    bias = self.router_bias[...] if cfg.router_selection_bias else None
    replay = None if replay_ids is None else replay_ids.reshape(b * t, -1)
    routing = route(logits, cfg, selection_bias=bias, replay_ids=replay)
    weights = (self.gate_proj[...], self.up_proj[...], self.down_proj[...])
    if cfg.moe_impl == "dense":
      y = moe_dispatch.experts_dense(flat, routing.expert_ids, routing.gates, *weights)
    elif mesh is None:
      y = moe_dispatch.experts_ragged(flat, routing.expert_ids, routing.gates, *weights)
    else:
      y = moe_dispatch.experts_sharded(flat, routing.expert_ids, routing.gates, *weights, mesh=mesh,
                                       a2a=resolve_all_to_all(cfg.moe_all_to_all, mesh),
                                       token_chunk=cfg.moe_token_chunk)
    y = y.reshape(b, t, d)
    if cfg.num_shared_experts:
      y = y + self.shared(x)
    return y, routing
