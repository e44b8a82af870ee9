"""Decode attention for NVIDIA GPUs: one query token per row against a ragged KV cache (Pallas Triton).

Split-K ("flash decoding"): the grid is `(B, K, splits)`; each program takes
one key/value head, its `G = N / K` query heads (padded to a power of two of at
least 16 rows, Triton's `dot` minimum) and one contiguous range of key blocks,
stopping at the row's length. It writes a normalised partial output and its
log-sum-exp; `combine_splits` merges the splits in float32:

    o = sum_i exp(lse_i - lse) o_i,   lse = log sum_i exp(lse_i)

Splitting the keys keeps every SM busy when `B * K` is small and the cache long.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

_NEG = -1e30
GPU_DECODE_BLOCKS = (64, 32, 16)


def gpu_decode_block(max_len: int) -> int | None:
  """The largest key block (power of two >= 16) dividing the cache length (None: none divides it)."""
  return next((b for b in GPU_DECODE_BLOCKS if max_len % b == 0), None)


def default_splits(batch: int, kv_heads: int, num_blocks: int, target_programs: int = 256) -> int:
  """Enough key splits for about `target_programs` programs (a few per SM), at most one per block."""
  return max(1, min(num_blocks, target_programs // max(1, batch * kv_heads)))


def _decode_kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, block, blocks_per_split):
  b, split = pl.program_id(0), pl.program_id(2)
  length = lengths_ref[b]
  q = q_ref[...]
  first = split * blocks_per_split
  last = jnp.minimum(first + blocks_per_split, (length + block - 1) // block)

  def body(j, carry):
    acc, m, l = carry
    start = pl.multiple_of(j * block, block)
    pos = start + lax.broadcasted_iota(jnp.int32, (block,), 0)
    valid = pos < length
    k = k_ref[pl.ds(start, block), :]
    v = jnp.where(valid[:, None], v_ref[pl.ds(start, block), :], jnp.zeros((), v_ref.dtype))
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    s = jnp.where(valid[None, :], s, _NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.where(valid[None, :], jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)
    return acc * alpha[:, None] + pv, m_new, alpha * l + jnp.sum(p, axis=1)

  rows, head_dim = q.shape
  init = (jnp.zeros((rows, head_dim), jnp.float32), jnp.full((rows,), _NEG, jnp.float32),
          jnp.zeros((rows,), jnp.float32))
  acc, m, l = lax.fori_loop(first, last, body, init)
  empty = l == 0.0
  safe_l = jnp.where(empty, 1.0, l)
  o_ref[...] = acc / safe_l[:, None]
  lse_ref[...] = jnp.where(empty, _NEG, m + jnp.log(safe_l))


def combine_splits(partial_out: jax.Array, lse: jax.Array) -> jax.Array:
  """Merges `[..., splits, G, H]` normalised partials with their `[..., splits, G]` log-sum-exps."""
  top = jnp.max(lse, axis=-2, keepdims=True)
  weight = jnp.where(lse > 0.5 * _NEG, jnp.exp(lse - top), 0.0)  # empty splits weigh nothing
  total = jnp.sum(weight, axis=-2)
  out = jnp.sum(weight[..., None] * partial_out, axis=-3)
  return out / jnp.where(total == 0.0, 1.0, total)[..., None]


def decode_attention_gpu(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, lengths: jax.Array, *,
                         scale: float, block: int | None = None, splits: int | None = None,
                         interpret: bool = False) -> jax.Array:
  """`[B, N, H]` attention of q `[B, N, H]` over the first `lengths[b]` slots of `[B, S, K, H]` caches.

  `block` must divide S (default `gpu_decode_block(S)`); `splits` default to
  `default_splits`. A row of length 0 gives zeros. Shapes are checked by the
  dispatcher.
  """
  b, n, h = q.shape
  s, kv_heads = k_cache.shape[1], k_cache.shape[2]
  group = n // kv_heads
  block = block or gpu_decode_block(s)
  if block is None or s % block:
    raise ValueError(f"cache length {s} is not a multiple of a decode block {GPU_DECODE_BLOCKS}")
  num_blocks = s // block
  splits = splits or default_splits(b, kv_heads, num_blocks)
  blocks_per_split = -(-num_blocks // splits)
  rows = max(16, 1 << (group - 1).bit_length())
  q4 = q.reshape(b, kv_heads, group, h)
  if rows != group:
    q4 = jnp.pad(q4, [(0, 0), (0, 0), (0, rows - group), (0, 0)])

  compiler_params = None
  if not interpret:
    from jax.experimental.pallas import triton as pltriton
    compiler_params = pltriton.CompilerParams(num_warps=4, num_stages=2)
  kernel = functools.partial(_decode_kernel, scale=float(scale), block=block,
                             blocks_per_split=blocks_per_split)
  cache_spec = pl.BlockSpec((None, s, None, h), lambda bi, ki, si: (bi, 0, ki, 0))
  partial_out, lse = pl.pallas_call(
      kernel, grid=(b, kv_heads, splits),
      in_specs=[pl.BlockSpec((b,), lambda bi, ki, si: (0,)),
                pl.BlockSpec((None, None, rows, h), lambda bi, ki, si: (bi, ki, 0, 0)),
                cache_spec, cache_spec],
      out_specs=[pl.BlockSpec((None, None, None, rows, h), lambda bi, ki, si: (bi, ki, si, 0, 0)),
                 pl.BlockSpec((None, None, None, rows), lambda bi, ki, si: (bi, ki, si, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, kv_heads, splits, rows, h), jnp.float32),
                 jax.ShapeDtypeStruct((b, kv_heads, splits, rows), jnp.float32)],
      compiler_params=compiler_params, interpret=interpret, name="decode_attention_gpu",
  )(lengths.astype(jnp.int32), q4, k_cache, v_cache)
  out = combine_splits(partial_out, lse)[:, :, :group]
  return out.reshape(b, n, h).astype(q.dtype)
