"""Decode attention for TPU: one new query token per row against a ragged KV cache (Pallas Mosaic).

    o[b, n] = sum_{s < len_b} softmax_s(scale * q[b, n] . k[b, s, n // G]) v[b, s, n // G]

Grid `(B, S_max / block)`: the key axis is sequential, a running maximum,
normaliser and float32 accumulator per query head live in VMEM scratch, and the
output block stays resident until the last key block. Row lengths are
prefetched into SMEM: blocks past a row's length are neither computed nor
fetched (their index map repeats the last needed block, which Mosaic does not
copy again), so a step reads only the filled part of each row's cache.

The cache is read as `[B, S_max, K * H]` (a free reshape of `[B, S_max, K, H]`)
so each block is one contiguous `[block, K * H]` tile; every key/value head is
a static lane slice of it and sees the `G = N / K` query heads of its group as
one `[G, H] x [H, block]` product (GQA without repeats).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_NEG = -1e30
_LANES = 128
TPU_DECODE_BLOCKS = (512, 256, 128, 64, 32, 16)


def tpu_decode_block(max_len: int) -> int | None:
  """The largest supported key block dividing the cache length (None: none divides it)."""
  return next((b for b in TPU_DECODE_BLOCKS if max_len % b == 0), None)


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale, block,
                   kv_heads, head_dim):
  b, j = pl.program_id(0), pl.program_id(1)
  length = lengths_ref[b]

  @pl.when(j == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, _NEG, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  @pl.when(j * block < length)
  def _accumulate():
    pos_row = j * block + lax.broadcasted_iota(jnp.int32, (1, block), 1)
    pos_col = j * block + lax.broadcasted_iota(jnp.int32, (block, 1), 0)
    valid_row, valid_col = pos_row < length, pos_col < length
    for kv in range(kv_heads):
      lanes = slice(kv * head_dim, (kv + 1) * head_dim)
      k = k_ref[:, lanes]
      v = jnp.where(valid_col, v_ref[:, lanes], jnp.zeros((), v_ref.dtype))  # unwritten slots may hold NaN
      q = q_ref[kv]
      s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
      s = jnp.where(valid_row, s, _NEG)
      m_prev, l_prev = m_ref[kv], l_ref[kv]  # [G, LANES], lanes equal
      m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
      p = jnp.where(valid_row, jnp.exp(s - m_new[:, :1]), 0.0)
      alpha = jnp.exp(m_prev - m_new)
      l_ref[kv] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
      m_ref[kv] = m_new
      pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                           preferred_element_type=jnp.float32)
      acc_ref[kv] = acc_ref[kv] * alpha[:, :1] + pv

  @pl.when(j == pl.num_programs(1) - 1)
  def _finish():
    l = l_ref[...][..., :1]
    o_ref[...] = (acc_ref[...] / jnp.where(l == 0.0, 1.0, l)).astype(o_ref.dtype)


def decode_attention_tpu(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array, *,
                         scale: float, block: int | None = None, interpret: bool = False) -> jax.Array:
  """`[B, N, H]` attention of q `[B, N, H]` over the first `lengths[b]` slots of `[B, S, K, H]` caches.

  `block` must divide S (default `tpu_decode_block(S)`). A row of length 0
  gives zeros. Shapes are checked by the dispatcher.
  """
  b, n, h = q.shape
  s, kv_heads = k_cache.shape[1], k_cache.shape[2]
  group = n // kv_heads
  block = block or tpu_decode_block(s)
  if block is None or s % block:
    raise ValueError(f"cache length {s} is not a multiple of a decode block {TPU_DECODE_BLOCKS}")
  q4 = q.reshape(b, kv_heads, group, h)
  k3 = k_cache.reshape(b, s, kv_heads * h)
  v3 = v_cache.reshape(b, s, kv_heads * h)

  def cache_index(bi, j, lengths_ref):
    last = jnp.maximum(pl.cdiv(lengths_ref[bi], block) - 1, 0)
    return bi, jnp.minimum(j, last), 0

  kernel = functools.partial(_decode_kernel, scale=float(scale), block=block, kv_heads=kv_heads,
                             head_dim=h)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=1, grid=(b, s // block),
      in_specs=[pl.BlockSpec((None, kv_heads, group, h), lambda bi, j, lengths_ref: (bi, 0, 0, 0)),
                pl.BlockSpec((None, block, kv_heads * h), cache_index),
                pl.BlockSpec((None, block, kv_heads * h), cache_index)],
      out_specs=pl.BlockSpec((None, kv_heads, group, h), lambda bi, j, lengths_ref: (bi, 0, 0, 0)),
      scratch_shapes=[pltpu.VMEM((kv_heads, group, _LANES), jnp.float32),
                      pltpu.VMEM((kv_heads, group, _LANES), jnp.float32),
                      pltpu.VMEM((kv_heads, group, h), jnp.float32)])
  out = pl.pallas_call(
      kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q4.shape, q.dtype),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      interpret=interpret, name="decode_attention_tpu",
  )(lengths.astype(jnp.int32), q4, k3, v3)
  return out.reshape(b, n, h)
