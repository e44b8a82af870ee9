"""The decoder: embedding, pre-norm attention / MLP-or-MoE blocks, final norm, LM head.

Users hold parameters as a plain nested dict (`params`); `forward` merges
them into the NNX module graph inside the traced function, so the whole model
is one pure function `forward(config, params, tokens, ...)`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.config import ConfigError
from recipe_jax.models.attention import Attention
from recipe_jax.models.config import ModelConfig
from recipe_jax.models.layers import ParamKeys, MLP, RMSNorm, dtype_of, normal_param, rope_cos_sin
from recipe_jax.models.moe import MoE
from recipe_jax.models.router import balance_stats, load_balancing_loss
from recipe_jax.parallel.mesh import BATCH_AXES, batch_shards
from recipe_jax.parallel.sharding import param_specs


class ModelOutput(NamedTuple):
  """What a forward pass returns.

  logits: `[B, T, V]` float32, or None with `return_hidden=True`.
  hidden_states: `[B, T, D]` after the final norm (the LM head's input).
  expert_ids: `[L_moe, B, T, k]` int32 experts chosen per MoE layer (None for dense models).
  aux_loss: scalar load-balancing loss over MoE layers (0 for dense models), unscaled
    by `router_aux_loss_coef`.
  expert_load: `[L_moe, E]` token assignments per expert over valid tokens.
  """

  logits: jax.Array | None
  hidden_states: jax.Array
  expert_ids: jax.Array | None
  aux_loss: jax.Array
  expert_load: jax.Array | None


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: ModelConfig, layer: int, keys: ParamKeys):
    self.input_norm = RMSNorm(cfg.hidden_size, cfg)
    self.attn = Attention(cfg, keys)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg)
    if cfg.is_moe_layer(layer):
      self.moe = MoE(cfg, keys)
    else:
      self.mlp = MLP(cfg, cfg.intermediate_size, keys)

  def __call__(self, x, cos, sin, segment_ids, *, mesh, replay_ids):
    x = x + self.attn(self.input_norm(x), cos, sin, segment_ids, mesh=mesh)
    return self.feed_forward(x, mesh=mesh, replay_ids=replay_ids)

  def feed_forward(self, x, *, mesh=None, replay_ids=None):
    """The second half of the layer, residual MLP or MoE: `(x, routing or None)` (the KV-cache
    paths in `models.cached` call it after their own attention)."""
    h = self.post_attn_norm(x)
    if hasattr(self, "moe"):
      y, routing = self.moe(h, mesh=mesh, replay_ids=replay_ids)
      return x + y, routing
    return x + self.mlp(h), None


class Transformer(nnx.Module):
  """Params: embed `[V, D]`, layers (a list of `DecoderLayer`), final_norm `[D]`, and
  lm_head `[D, V]` unless `tie_word_embeddings`.

  With `scan_layers`, `layer_stacks` replaces `layers`: one `DecoderLayer` per
  entry of `cfg.layer_runs` whose parameters carry a leading layer axis `[L, ...]`.
  """

  def __init__(self, cfg: ModelConfig, keys: ParamKeys):
    self.cfg = cfg
    self.embed = normal_param(keys, (cfg.vocab_size, cfg.hidden_size), cfg)
    if cfg.scan_layers:
      self.layer_stacks = nnx.List([_stacked_layers(cfg, start, count, keys)
                                    for start, count in cfg.layer_runs])
    else:
      self.layers = nnx.List([DecoderLayer(cfg, i, keys) for i in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg)
    if not cfg.tie_word_embeddings:
      self.lm_head = normal_param(keys, (cfg.hidden_size, cfg.vocab_size), cfg)

  def __call__(self, tokens, positions, segment_ids, *, mesh=None, replay_experts=None,
               return_hidden=False) -> ModelOutput:
    cfg = self.cfg
    dt = dtype_of(cfg.dtype)
    constrain = _constrainer(mesh)
    table = self.embed[...]
    if mesh is not None:  # gather the table over fsdp first: a clean vocab-parallel lookup
      table = jax.lax.with_sharding_constraint(table, _spec_or_sharding(mesh, P("tensor", None)))
    x = constrain(jnp.take(table, tokens, axis=0, mode="clip").astype(dt))
    cos, sin = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, dt)
    valid = (segment_ids != 0).reshape(-1)

    def layer_step(layer, x, replay):
      """One decoder layer: `(x, (expert ids, expert counts, router probs) or None)`."""
      x, routing = layer(x, cos, sin, segment_ids, mesh=mesh, replay_ids=replay)
      if routing is None:
        return constrain(x), None
      c, p = balance_stats(routing, valid, cfg.num_experts)
      return constrain(x), (routing.expert_ids.reshape(*tokens.shape, -1), c, p)

    if cfg.scan_layers:
      x, stats = _scan_layers(cfg, self.layer_stacks, layer_step, x, replay_experts)
    else:
      x, stats = _loop_layers(cfg, self.layers, layer_step, x, replay_experts)
    ids, counts, probs = (list(z) for z in zip(*stats)) if stats else ([], [], [])
    hidden = self.final_norm(x)
    logits = None
    if not return_hidden:
      head = self.embed[...].T if cfg.tie_word_embeddings else self.lm_head[...]
      logits = jnp.einsum("btd,dv->btv", hidden, head.astype(dt), preferred_element_type=jnp.float32)
    if ids:  # each entry has a leading axis of MoE layers
      counts, probs = jnp.concatenate(counts), jnp.concatenate(probs)
      aux = load_balancing_loss(counts, probs, valid.sum())
      return ModelOutput(logits, hidden, jnp.concatenate(ids), aux, counts)
    return ModelOutput(logits, hidden, None, jnp.zeros((), jnp.float32), None)


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _stacked_layers(cfg: ModelConfig, start: int, count: int, keys: ParamKeys) -> DecoderLayer:
  """Layers start .. start+count-1 (one kind) as one `DecoderLayer` with stacked parameters.

  Keys are drawn in the same order as for separate layers, so a seed gives the
  same weights in both layouts.
  """
  layers = [DecoderLayer(cfg, start + j, keys) for j in range(count)]
  graphdef, _ = nnx.split(layers[0])
  return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(l) for l in layers]))


def _loop_layers(cfg: ModelConfig, layers, layer_step, x, replay_experts):
  """Runs the layers one after another (a Python loop: compile time grows with depth)."""
  if cfg.remat != "none":
    layer_step = nnx.remat(layer_step, policy=_REMAT_POLICIES[cfg.remat])
  stats, moe_index = [], 0
  for i, layer in enumerate(layers):
    replay = None
    if replay_experts is not None and cfg.is_moe_layer(i):
      replay, moe_index = replay_experts[moe_index], moe_index + 1
    x, layer_stats = layer_step(layer, x, replay)
    if layer_stats is not None:
      stats.append(jax.tree.map(lambda a: a[None], layer_stats))
  return x, stats


def _scan_layers(cfg: ModelConfig, stacks, layer_step, x, replay_experts):
  """Runs each stack of layers as one `jax.lax.scan` over its leading layer axis."""
  stats, moe_index = [], 0
  for (start, count), stack in zip(cfg.layer_runs, stacks):
    graphdef, state = nnx.split(stack)
    replay = None
    if replay_experts is not None and cfg.is_moe_layer(start):
      replay, moe_index = replay_experts[moe_index:moe_index + count], moe_index + count

    def body(x, xs, graphdef=graphdef):
      layer_state, layer_replay = xs
      return layer_step(nnx.merge(graphdef, layer_state), x, layer_replay)

    if cfg.remat != "none":
      body = jax.checkpoint(body, policy=_REMAT_POLICIES[cfg.remat], prevent_cse=False)
    x, run_stats = jax.lax.scan(body, x, (state, replay))
    if run_stats is not None:
      stats.append(run_stats)
  return x, stats


def _spec_or_sharding(mesh, spec):
  return NamedSharding(mesh, spec) if isinstance(mesh, jax.sharding.Mesh) else spec


def _constrainer(mesh):
  if mesh is None:
    return lambda x: x
  sharding = _spec_or_sharding(mesh, P(BATCH_AXES))
  return lambda x: jax.lax.with_sharding_constraint(x, sharding)


# ----------------------------------------------------------------------------
# Functional interface
# ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _graph(cfg: ModelConfig):
  abstract = nnx.eval_shape(lambda: Transformer(cfg, ParamKeys(0)))
  return nnx.split(abstract)


def abstract_params(cfg: ModelConfig) -> dict:
  """The parameter tree of `cfg` as `jax.ShapeDtypeStruct`s, without allocating anything."""
  return nnx.to_pure_dict(_graph(cfg)[1])


def build_model(cfg: ModelConfig, params: dict) -> Transformer:
  """An NNX `Transformer` holding `params` (a nested dict as `init_params` returns)."""
  graphdef, state = _graph(cfg)
  state = jax.tree.map(lambda x: x, state)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def init_params_unsharded(cfg: ModelConfig, seed: int = 0) -> dict:
  """Fresh parameters as a nested dict (traceable: `jax.jit` it with output shardings)."""
  return nnx.to_pure_dict(nnx.state(Transformer(cfg, ParamKeys(seed))))


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
  """Positions that restart at 0 at the start of every segment of a packed row."""
  t = segment_ids.shape[1]
  idx = jnp.broadcast_to(jnp.arange(t), segment_ids.shape)
  starts = jnp.concatenate(
      [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)


def _context_mesh():
  """The mesh set with `jax.set_mesh`, if any (abstract: it also works under `jax.jit`)."""
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty else mesh


def forward(config: ModelConfig, params: dict, tokens: jax.Array, *, positions: jax.Array | None = None,
            segment_ids: jax.Array | None = None, replay_experts: jax.Array | None = None,
            return_hidden: bool = False, mesh=None) -> ModelOutput:
  """Runs the model on packed rows.

  Args:
    config: the model config.
    params: nested dict of parameters (see `init_params`, `checkpoint.hf.load`).
    tokens: `[B, T]` int token ids.
    positions: `[B, T]` rotary positions; default: restart at 0 in every segment.
    segment_ids: `[B, T]` int; tokens attend only within their own segment; 0
      marks padding. Default: one segment per row.
    replay_experts: `[L_moe, B, T, k]` recorded expert ids (routing replay).
    return_hidden: skip the LM head; `.logits` is None and `.hidden_states` feed
      a chunked log-prob computation.
    mesh: the device mesh; default: the mesh set with `jax.set_mesh`, if any.
      With a mesh, the batch is split over `data, fsdp, expert` and MoE layers
      run expert-parallel.
  """
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
  if segment_ids is None:
    segment_ids = jnp.ones(tokens.shape, jnp.int32)
  if positions is None:
    positions = positions_from_segments(segment_ids)
  if replay_experts is not None:
    expected = (config.num_moe_layers, *tokens.shape, config.num_experts_per_tok)
    if tuple(replay_experts.shape) != expected:
      raise ValueError(f"replay_experts has shape {tuple(replay_experts.shape)}, expected {expected} "
                       "[num_moe_layers, B, T, k]")
  mesh = mesh if mesh is not None else _context_mesh()
  if mesh is not None:
    if tokens.shape[0] % batch_shards(mesh):
      raise ConfigError(f"batch size B={tokens.shape[0]} is not divisible by the batch shards "
                        f"data*fsdp*expert={batch_shards(mesh)} of the mesh")
    param_specs(config, abstract_params(config), mesh)  # names the field a mesh axis does not divide
  model = build_model(config, params)
  return model(tokens, positions, segment_ids, mesh=mesh, replay_experts=replay_experts,
               return_hidden=return_hidden)
