"""Plain-XLA decode attention (the decode kernels' reference) and the shape checks every path shares.

The training attention's reference is `recipe_jax.models.attention.attention_xla`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG = -1e30


def check_attention_shapes(q, k, v, q_segment_ids, kv_segment_ids) -> None:
  """Raises ValueError naming the argument whose shape does not fit q `[B, T, N, H]`, k / v `[B, S, K, H]`."""
  if q.ndim != 4:
    raise ValueError(f"attention: q must be [B, T, N, H], got shape {tuple(q.shape)}")
  b, t, n, h = q.shape
  for name, x in (("k", k), ("v", v)):
    if x.ndim != 4 or x.shape[0] != b or x.shape[3] != h:
      raise ValueError(f"attention: {name} must be [B={b}, S, K, H={h}], got shape {tuple(x.shape)}")
  if k.shape != v.shape:
    raise ValueError(f"attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ")
  if n % k.shape[2]:
    raise ValueError(f"attention: N={n} query heads are not divisible by K={k.shape[2]} key/value heads")
  if tuple(q_segment_ids.shape) != (b, t):
    raise ValueError(f"attention: q_segment_ids must be [B={b}, T={t}], got {tuple(q_segment_ids.shape)}")
  if tuple(kv_segment_ids.shape) != (b, k.shape[1]):
    raise ValueError(f"attention: kv_segment_ids must be [B={b}, S={k.shape[1]}], "
                     f"got {tuple(kv_segment_ids.shape)}")


def check_decode_shapes(q, k_cache, v_cache, lengths) -> None:
  """Raises ValueError naming the argument that does not fit q `[B, N, H]`, caches `[B, S, K, H]`, lengths `[B]`."""
  if q.ndim != 3:
    raise ValueError(f"decode attention: q must be [B, N, H], got shape {tuple(q.shape)}")
  b, n, h = q.shape
  for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
    if x.ndim != 4 or x.shape[0] != b or x.shape[3] != h:
      raise ValueError(f"decode attention: {name} must be [B={b}, S, K, H={h}], got {tuple(x.shape)}")
  if k_cache.shape != v_cache.shape:
    raise ValueError(f"decode attention: k_cache {tuple(k_cache.shape)} and v_cache "
                     f"{tuple(v_cache.shape)} differ")
  if n % k_cache.shape[2]:
    raise ValueError(f"decode attention: N={n} query heads are not divisible by "
                     f"K={k_cache.shape[2]} key/value heads")
  if tuple(lengths.shape) != (b,):
    raise ValueError(f"decode attention: lengths must be [B={b}], got {tuple(lengths.shape)}")


def decode_attention_xla(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array, *,
                         scale: float) -> jax.Array:
  """One query token per row against the first `lengths[b]` slots of its KV cache, plain XLA.

  o[b, n] = sum_{s < len_b} softmax_s(scale * q[b, n] . k[b, s, n // G]) v[b, s, n // G],
  G = N / K, scores and softmax in float32.

  Args:
    q: `[B, N, H]` the new token's queries.
    k_cache: `[B, S, K, H]`; `v_cache` likewise. Slots at or past `lengths[b]`
      are ignored (they may hold anything, NaN included).
    lengths: `[B]` int, filled slots per row (0 allowed).
    scale: multiplier of the dot products.

  Returns:
    `[B, N, H]` in the dtype of q; a row of length 0 gives zeros.
  """
  b, n, h = q.shape
  s, kv_heads = k_cache.shape[1], k_cache.shape[2]
  qg = q.reshape(b, kv_heads, n // kv_heads, h)
  valid = jnp.arange(s)[None, :] < lengths[:, None]  # [B, S]
  scores = jnp.einsum("bkgh,bskh->bkgs", qg, k_cache, preferred_element_type=jnp.float32) * scale
  scores = jnp.where(valid[:, None, None], scores, _NEG)
  top = jnp.max(scores, axis=-1, keepdims=True)
  p = jnp.where(valid[:, None, None], jnp.exp(scores - top), 0.0)
  total = jnp.sum(p, axis=-1)
  v = jnp.where(valid[:, :, None, None], v_cache, jnp.zeros((), v_cache.dtype))
  out = jnp.einsum("bkgs,bskh->bkgh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  out = out / jnp.where(total == 0.0, 1.0, total)[..., None]
  return out.reshape(b, n, h).astype(q.dtype)
