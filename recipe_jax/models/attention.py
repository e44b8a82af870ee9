"""Grouped-query self-attention over packed rows.

`attention` is the one function every attention implementation plugs in
behind: Pallas kernels (later) must give the same result as the plain XLA
version here, which is also their reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from recipe_jax.kernels.dispatch import flash_attention
from recipe_jax.kernels.reference import check_attention_shapes
from recipe_jax.models.config import ModelConfig
from recipe_jax.models.layers import ParamKeys, RMSNorm, apply_rope, dtype_of, normal_param, zeros_param

_MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)


def segment_causal_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array) -> jax.Array:
  """`[B, T, S]` mask: causal, same segment, and never segment 0 (padding)."""
  t, s = q_segment_ids.shape[1], kv_segment_ids.shape[1]
  causal = jnp.arange(t)[:, None] + (s - t) >= jnp.arange(s)[None, :]
  same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
  valid = kv_segment_ids[:, None, :] != 0
  return causal[None] & same & valid


def attention_xla(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: jax.Array,
                  kv_segment_ids: jax.Array, scale: float) -> jax.Array:
  """Causal attention within segments, plain XLA.

  softmax_s(scale * q_t . k_s + mask_ts) v_s with scores and softmax in float32.
  Key/value heads are shared by groups of N / K query heads without repeating
  them in memory.

  Args:
    q: queries `[B, T, N, H]`.
    k: keys `[B, S, K, H]`; `v` values likewise.
    q_segment_ids: `[B, T]` int, 0 = padding; `kv_segment_ids` `[B, S]`.
    scale: multiplier of the dot products (usually H^-0.5).

  Returns:
    `[B, T, N, H]` in the dtype of `q`. Rows that are padding attend nowhere
    and produce the mean of the values, never NaN.
  """
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  qg = q.reshape(b, t, kv_heads, n // kv_heads, h)
  scores = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
  mask = segment_causal_mask(q_segment_ids, kv_segment_ids)[:, None, None]
  scores = jnp.where(mask, scores, _MASKED)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  # A zero probability times a non-finite padding value is still NaN: zero padding values.
  v = jnp.where((kv_segment_ids != 0)[:, :, None, None], v, jnp.zeros((), v.dtype))
  out = jnp.einsum("bkgts,bskh->btkgh", probs, v, preferred_element_type=jnp.float32)
  return out.reshape(b, t, n, h).astype(q.dtype)


def attention(q, k, v, *, q_segment_ids, kv_segment_ids, scale, impl: str = "xla", mesh=None):
  """Causal segment attention through the configured implementation (`ModelConfig.attention_impl`).

  `xla` runs `attention_xla`; `auto`, `pallas_tpu`, `pallas_gpu` and their
  `_interpret` forms go through `recipe_jax.kernels.dispatch`, which picks the
  Pallas kernel, logs the choice, falls back to `attention_xla` (with a logged
  reason) for shapes or meshes a kernel cannot take, and runs kernels inside
  `shard_map` over `mesh` (default: the context mesh). Mismatched shapes raise
  ValueError. Padding query rows (segment 0) give zeros in the kernels and the
  mean of the values here; they carry no loss.
  """
  if impl == "xla":
    check_attention_shapes(q, k, v, q_segment_ids, kv_segment_ids)
    return attention_xla(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                         scale=scale)
  return flash_attention(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                         scale=scale, impl=impl, mesh=mesh, reference=attention_xla)


class Attention(nnx.Module):
  """Self-attention block.

  Params: q_proj `[D, N, H]`, k_proj / v_proj `[D, K, H]`, o_proj `[N, H, D]`;
  with `attention_bias`, q_bias `[N, H]`, k_bias / v_bias `[K, H]`; with
  `qk_norm`, q_norm / k_norm RMSNorm scales `[H]`.
  """

  def __init__(self, cfg: ModelConfig, keys: ParamKeys):
    d, n, kv, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.cfg = cfg
    self.q_proj = normal_param(keys, (d, n, h), cfg)
    self.k_proj = normal_param(keys, (d, kv, h), cfg)
    self.v_proj = normal_param(keys, (d, kv, h), cfg)
    self.o_proj = normal_param(keys, (n, h, d), cfg)
    if cfg.attention_bias:
      pdt = dtype_of(cfg.param_dtype)
      self.q_bias = zeros_param((n, h), pdt)
      self.k_bias = zeros_param((kv, h), pdt)
      self.v_bias = zeros_param((kv, h), pdt)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg)
      self.k_norm = RMSNorm(h, cfg)

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, segment_ids: jax.Array, *,
               mesh=None) -> jax.Array:
    q, k, v = self.project_qkv(x, cos, sin)
    out = attention(q, k, v, q_segment_ids=segment_ids, kv_segment_ids=segment_ids,
                    scale=self.cfg.head_dim ** -0.5, impl=self.cfg.attention_impl, mesh=mesh)
    return self.project_out(out)

  def project_qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Rotated queries `[B, T, N, H]`, rotated keys and values `[B, T, K, H]` for `x` `[B, T, D]`.

    (The KV-cache paths in `models.cached` call this and `project_out` around
    their own attention over cached keys.)
    """
    cfg = self.cfg
    dt = x.dtype
    q = jnp.einsum("btd,dnh->btnh", x, self.q_proj[...].astype(dt))
    k = jnp.einsum("btd,dkh->btkh", x, self.k_proj[...].astype(dt))
    v = jnp.einsum("btd,dkh->btkh", x, self.v_proj[...].astype(dt))
    if cfg.attention_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

  def project_out(self, out: jax.Array) -> jax.Array:
    """The output projection: attention output `[B, T, N, H]` -> `[B, T, D]`."""
    return jnp.einsum("btnh,nhd->btd", out, self.o_proj[...].astype(out.dtype))
