"""The decoder against a preallocated KV cache: prefill a prompt, then decode one token per step.

Both functions run the model's own modules (`Attention.project_qkv` /
`project_out`, the norms, `MLP`, `MoE`) on the same parameters as `forward`,
so their logits and expert ids match a full forward pass of the same tokens.

The cache holds keys and values of every layer, `[L, S, M, K, H]`: `S` slots
(one sequence each), `M` positions (`max_len`). A slot's length (positions
filled) lives beside it, `lengths [S]`; positions past it are never read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from recipe_jax.models.attention import attention
from recipe_jax.models.config import ModelConfig
from recipe_jax.models.layers import dtype_of, rope_cos_sin
from recipe_jax.models.transformer import build_model

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


class KVCache(NamedTuple):
  """Keys and values `[L, S, M, K, H]` of every layer, slot and cached position."""

  k: jax.Array
  v: jax.Array


class PrefillOutput(NamedTuple):
  """last_logits `[B, V]` float32 at each row's last prompt token; k, v `[L, B, T, K, H]`;
  expert_ids `[L_moe, B, T, k]` int32 (None for dense models)."""

  last_logits: jax.Array
  k: jax.Array
  v: jax.Array
  expert_ids: jax.Array | None


class DecodeOutput(NamedTuple):
  """logits `[S, V]` float32 for the next token; the cache with the fed tokens written;
  expert_ids `[L_moe, S, k]` chosen for the fed tokens (None for dense models)."""

  logits: jax.Array
  cache: KVCache
  expert_ids: jax.Array | None


def empty_cache(cfg: ModelConfig, slots: int, max_len: int) -> KVCache:
  """A zero cache for `slots` sequences of up to `max_len` positions, in the model dtype."""
  shape = (cfg.num_layers, slots, max_len, cfg.num_kv_heads, cfg.head_dim)
  return KVCache(jnp.zeros(shape, dtype_of(cfg.dtype)), jnp.zeros(shape, dtype_of(cfg.dtype)))


def _embed(model, tokens: jax.Array, dt) -> jax.Array:
  return jnp.take(model.embed[...], tokens, axis=0, mode="clip").astype(dt)


def _lm_head(cfg: ModelConfig, model, hidden: jax.Array) -> jax.Array:
  """Final norm and LM head, float32 logits `[..., V]`."""
  hidden = model.final_norm(hidden)
  head = model.embed[...].T if cfg.tie_word_embeddings else model.lm_head[...]
  return jnp.einsum("...d,dv->...v", hidden, head.astype(hidden.dtype), preferred_element_type=jnp.float32)


def _feed_forward(layer, x: jax.Array, *, mesh) -> tuple[jax.Array, jax.Array | None]:
  """The second half of a `DecoderLayer`: residual MLP or MoE. Returns (x, expert ids or None)."""
  x, routing = layer.feed_forward(x, mesh=mesh)
  return x, None if routing is None else routing.expert_ids.reshape(*x.shape[:2], -1)


def _map_layers(cfg: ModelConfig, model, fn: Callable, x: jax.Array, per_layer):
  """Runs `fn(layer, x, layer_inputs) -> (x, (k, v, expert ids or None))` over all layers.

  `per_layer` is a pytree whose leaves have a leading axis of `L` layers (or
  None). Returns `(x, k [L, ...], v [L, ...], expert ids [L_moe, ...] or None)`.
  Per-layer parameters run as a Python loop, stacked ones as one scan per run.
  """
  ks, vs, ids = [], [], []
  if cfg.scan_layers:
    for (start, count), stack in zip(cfg.layer_runs, model.layer_stacks):
      graphdef, state = nnx.split(stack)
      xs = jax.tree.map(lambda a, s=start, c=count: a[s:s + c], per_layer)

      def body(x, inputs, graphdef=graphdef):
        layer_state, layer_inputs = inputs
        return fn(nnx.merge(graphdef, layer_state), x, layer_inputs)

      x, (k, v, e) = jax.lax.scan(body, x, (state, xs))
      ks.append(k), vs.append(v)
      if e is not None:
        ids.append(e)
  else:
    for i, layer in enumerate(model.layers):
      x, (k, v, e) = fn(layer, x, jax.tree.map(lambda a, i=i: a[i], per_layer))
      ks.append(k[None]), vs.append(v[None])
      if e is not None:
        ids.append(e[None])
  return x, jnp.concatenate(ks), jnp.concatenate(vs), jnp.concatenate(ids) if ids else None


def prefill(config: ModelConfig, params: dict, tokens: jax.Array, lengths: jax.Array, *,
            mesh=None) -> PrefillOutput:
  """Runs right-padded prompts `tokens [B, T]` of `lengths [B]` and returns their keys and values.

  Positions `>= lengths` are padding: they attend nowhere and nothing attends
  to them. Attention goes through `models.attention.attention`, so a
  configured kernel serves prefill as it serves training.
  """
  model = build_model(config, params)
  dt = dtype_of(config.dtype)
  b, t = tokens.shape
  segment_ids = (jnp.arange(t)[None, :] < lengths[:, None]).astype(jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  cos, sin = rope_cos_sin(positions, config.rotary_dim, config.rope_theta, dt)

  def layer_fn(layer, x, _):
    q, k, v = layer.attn.project_qkv(layer.input_norm(x), cos, sin)
    out = attention(q, k, v, q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                    scale=config.head_dim ** -0.5, impl=config.attention_impl, mesh=mesh)
    x, ids = _feed_forward(layer, x + layer.attn.project_out(out), mesh=mesh)
    return x, (k, v, ids)

  x, k, v, ids = _map_layers(config, model, layer_fn, _embed(model, tokens, dt), None)
  last = jnp.take_along_axis(x, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)[:, 0]
  return PrefillOutput(_lm_head(config, model, last), k, v, ids)


def decode_attention(q: jax.Array, k_new: jax.Array, v_new: jax.Array, k_cache: jax.Array,
                     v_cache: jax.Array, lengths: jax.Array, *, scale: float) -> jax.Array:
  """One query per slot against its cached keys (positions `< lengths`) and its own new key.

  Args:
    q: `[S, N, H]` queries; k_new, v_new `[S, K, H]` this step's keys and values.
    k_cache, v_cache: `[S, M, K, H]`; lengths `[S]` int.

  Returns `[S, N, H]` in the dtype of `q`; scores and softmax in float32 as in
  `attention_xla`, key/value heads shared by groups of N / K query heads.
  """
  s, n, h = q.shape
  kv_heads = k_cache.shape[2]
  qg = q.reshape(s, kv_heads, n // kv_heads, h)
  cached = jnp.einsum("skgh,smkh->skgm", qg, k_cache, preferred_element_type=jnp.float32) * scale
  valid = jnp.arange(k_cache.shape[1])[None, :] < lengths[:, None]                  # [S, M]
  cached = jnp.where(valid[:, None, None, :], cached, _MASKED)
  own = jnp.einsum("skgh,skh->skg", qg, k_new, preferred_element_type=jnp.float32)[..., None] * scale
  probs = jax.nn.softmax(jnp.concatenate([cached, own], axis=-1), axis=-1).astype(v_cache.dtype)
  v_cache = jnp.where(valid[:, :, None, None], v_cache, jnp.zeros((), v_cache.dtype))
  out = jnp.einsum("skgm,smkh->skgh", probs[..., :-1], v_cache, preferred_element_type=jnp.float32)
  out = out + jnp.einsum("skg,skh->skgh", probs[..., -1], v_new, preferred_element_type=jnp.float32)
  return out.reshape(s, n, h).astype(q.dtype)


def decode_step(config: ModelConfig, params: dict, cache: KVCache, tokens: jax.Array,
                lengths: jax.Array, *, mesh=None) -> DecodeOutput:
  """Feeds `tokens [S]` at positions `lengths [S]`, writes their keys and values there.

  Slots whose length is `>= M` write nothing (their outputs are garbage and
  must be ignored). Run it under `jax.jit` with the cache donated so the write
  happens in place.
  """
  model = build_model(config, params)
  dt = dtype_of(config.dtype)
  cos, sin = rope_cos_sin(lengths[:, None], config.rotary_dim, config.rope_theta, dt)

  def layer_fn(layer, x, layer_cache):
    k_cache, v_cache = layer_cache
    q, k, v = layer.attn.project_qkv(layer.input_norm(x), cos, sin)
    out = decode_attention(q[:, 0], k[:, 0], v[:, 0], k_cache, v_cache, lengths,
                           scale=config.head_dim ** -0.5)
    x, ids = _feed_forward(layer, x + layer.attn.project_out(out[:, None]), mesh=mesh)
    return x, (k[:, 0], v[:, 0], None if ids is None else ids[:, 0])

  x, k, v, ids = _map_layers(config, model, layer_fn, _embed(model, tokens[:, None], dt),
                             (cache.k, cache.v))
  slots = jnp.arange(tokens.shape[0])
  new_cache = KVCache(cache.k.at[:, slots, lengths].set(k, mode="drop"),
                      cache.v.at[:, slots, lengths].set(v, mode="drop"))
  return DecodeOutput(_lm_head(config, model, x[:, 0]), new_cache, ids)
