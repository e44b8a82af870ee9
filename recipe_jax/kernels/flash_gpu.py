"""Flash attention for NVIDIA GPUs: a Pallas kernel with the Triton lowering.

Causal attention within segments of packed rows, grouped-query, forward and
backward (dq, dk, dv) as Pallas kernels behind one `jax.custom_vjp`:

    o_t = sum_s p_ts v_s,  p_ts = exp(scale * q_t . k_s - lse_t) on allowed (t, s)
    allowed(t, s) = s <= t and seg_q[t] == seg_kv[s] != 0

The forward kernel keeps a running maximum `m`, normaliser `l` and float32
accumulator per query row while it walks the key blocks up to the causal
diagonal, and saves `lse = m + log l` for the backward pass. The backward pass
recomputes the probabilities from `lse`: one kernel per query block for dq,
one per key block and key/value head for dk and dv, looping over the query
heads of that group, so GQA never repeats keys or values in memory.

Padding query rows (segment 0) attend nowhere: their output and gradients are
zero (the XLA reference gives the mean of the values there; those rows carry
no loss). Lengths that are not a multiple of the block are padded with
segment 0 inside the wrapper.

The same kernels run on any host with `interpret=True` (how the tests check
them against the reference).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

_NEG = -1e30  # finite: masked scores never produce inf - inf


class GpuBlocks(NamedTuple):
  """Tile sizes (powers of two, >= 16: Triton's `dot` minimum) and launch parameters."""

  block_q: int
  block_k: int
  num_warps: int
  num_stages: int


def default_gpu_blocks(seq_len: int, head_dim: int, itemsize: int = 2) -> GpuBlocks:
  """Tiles for Hopper-class GPUs. 16-bit inputs: 128 x 64 for head dim 128 (register budget),
  128 x 128 below. 32-bit inputs take half each way: at 128 x 128 the backward's tiles ask for
  more shared memory than an H200 has (257 KiB of 227)."""
  cap = max(16, 1 << max(0, seq_len - 1).bit_length())  # no tile longer than the padded sequence
  wide = itemsize >= 4
  block_q = min(64 if wide else 128, cap)
  block_k = min((32 if wide else 64) if head_dim > 64 else (64 if wide else 128), cap)
  return GpuBlocks(block_q, block_k, num_warps=8 if head_dim > 64 else 4, num_stages=2)


def _compiler_params(blocks: GpuBlocks, interpret: bool):
  if interpret:
    return None
  from jax.experimental.pallas import triton as pltriton
  return pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)


def _dot_nt(a, b):
  """a @ b.T with float32 accumulation."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_tn(a, b):
  """a.T @ b with float32 accumulation."""
  return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dot(a, b):
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _allowed(q_pos, q_seg, kv_pos, kv_seg):
  """`[bq, bk]` mask: causal, same segment, key not padding."""
  return ((q_pos[:, None] >= kv_pos[None, :]) & (q_seg[:, None] == kv_seg[None, :])
          & (kv_seg[None, :] != 0))


def _causal_kv_blocks(q_block, block_q, block_k, num_kv_blocks):
  """Key blocks a query block needs: up to the one holding its last row."""
  return jnp.minimum(num_kv_blocks, ((q_block + 1) * block_q + block_k - 1) // block_k)


# ----------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------


def _forward_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, o_ref, lse_ref, *, scale, block_q,
                    block_k, num_kv_blocks):
  i = pl.program_id(0)
  q = q_ref[...]
  q_seg = q_seg_ref[...]
  q_pos = i * block_q + lax.broadcasted_iota(jnp.int32, (block_q,), 0)
  head_dim = q.shape[-1]

  def body(j, carry):
    acc, m, l = carry
    start = pl.multiple_of(j * block_k, block_k)
    k = k_ref[pl.ds(start, block_k), :]
    v = v_ref[pl.ds(start, block_k), :]
    kv_seg = kv_seg_ref[pl.ds(start, block_k)]
    kv_pos = start + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
    allowed = _allowed(q_pos, q_seg, kv_pos, kv_seg)
    s = jnp.where(allowed, _dot_nt(q, k) * scale, _NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.where(allowed, jnp.exp(s - m_new[:, None]), 0.0)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + jnp.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.astype(v.dtype), v)
    return acc, m_new, l

  init = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.full((block_q,), _NEG, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  upper = _causal_kv_blocks(i, block_q, block_k, num_kv_blocks)
  acc, m, l = lax.fori_loop(0, upper, body, init)
  empty = l == 0.0  # padding rows: nothing allowed
  safe_l = jnp.where(empty, 1.0, l)
  o_ref[...] = (acc / safe_l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(empty, 0.0, m + jnp.log(safe_l))


def _dq_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
               scale, block_q, block_k, num_kv_blocks):
  i = pl.program_id(0)
  q, do = q_ref[...], do_ref[...]
  lse, delta, q_seg = lse_ref[...], delta_ref[...], q_seg_ref[...]
  q_pos = i * block_q + lax.broadcasted_iota(jnp.int32, (block_q,), 0)

  def body(j, dq):
    start = pl.multiple_of(j * block_k, block_k)
    k = k_ref[pl.ds(start, block_k), :]
    v = v_ref[pl.ds(start, block_k), :]
    kv_seg = kv_seg_ref[pl.ds(start, block_k)]
    kv_pos = start + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
    allowed = _allowed(q_pos, q_seg, kv_pos, kv_seg)
    p = jnp.where(allowed, jnp.exp(_dot_nt(q, k) * scale - lse[:, None]), 0.0)
    ds = p * (_dot_nt(do, v) - delta[:, None])
    return dq + _dot(ds.astype(k.dtype), k)

  upper = _causal_kv_blocks(i, block_q, block_k, num_kv_blocks)
  dq = lax.fori_loop(0, upper, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, q_seg_ref, kv_seg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                *, scale, block_q, block_k, num_q_blocks, group):
  j, kv_head = pl.program_id(0), pl.program_id(2)
  k, v, kv_seg = k_ref[...], v_ref[...], kv_seg_ref[...]
  kv_pos = j * block_k + lax.broadcasted_iota(jnp.int32, (block_k,), 0)
  first_q_block = (j * block_k) // block_q  # earlier query rows cannot see this key block

  def head_body(g, carry):
    head = kv_head * group + g

    def q_body(i, carry):
      dk, dv = carry
      start = pl.multiple_of(i * block_q, block_q)
      q = q_ref[pl.ds(start, block_q), head, :]
      do = do_ref[pl.ds(start, block_q), head, :]
      lse = lse_ref[head, pl.ds(start, block_q)]
      delta = delta_ref[head, pl.ds(start, block_q)]
      q_seg = q_seg_ref[pl.ds(start, block_q)]
      q_pos = start + lax.broadcasted_iota(jnp.int32, (block_q,), 0)
      allowed = _allowed(q_pos, q_seg, kv_pos, kv_seg)
      p = jnp.where(allowed, jnp.exp(_dot_nt(q, k) * scale - lse[:, None]), 0.0)
      dv = dv + _dot_tn(p.astype(do.dtype), do)
      ds = p * (_dot_nt(do, v) - delta[:, None])
      dk = dk + _dot_tn(ds.astype(q.dtype), q)
      return dk, dv

    return lax.fori_loop(first_q_block, num_q_blocks, q_body, carry)

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = lax.fori_loop(0, group, head_body, (zeros, zeros))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------
# pallas_call wrappers (inputs already padded to whole blocks)
# ----------------------------------------------------------------------------


def _forward(q, k, v, q_seg, kv_seg, scale, blocks, interpret):
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  group = n // kv_heads
  nq, nk = t // blocks.block_q, t // blocks.block_k
  kernel = functools.partial(_forward_kernel, scale=scale, block_q=blocks.block_q,
                             block_k=blocks.block_k, num_kv_blocks=nk)
  kv_spec = pl.BlockSpec((None, t, None, h), lambda i, bi, ni: (bi, 0, ni // group, 0))
  return pl.pallas_call(
      kernel, grid=(nq, b, n),
      in_specs=[pl.BlockSpec((None, blocks.block_q, None, h), lambda i, bi, ni: (bi, i, ni, 0)),
                kv_spec, kv_spec,
                pl.BlockSpec((None, blocks.block_q), lambda i, bi, ni: (bi, i)),
                pl.BlockSpec((None, t), lambda i, bi, ni: (bi, 0))],
      out_specs=[pl.BlockSpec((None, blocks.block_q, None, h), lambda i, bi, ni: (bi, i, ni, 0)),
                 pl.BlockSpec((None, None, blocks.block_q), lambda i, bi, ni: (bi, ni, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, t), jnp.float32)],
      compiler_params=_compiler_params(blocks, interpret), interpret=interpret,
      name="flash_attention_gpu_fwd")(q, k, v, q_seg, kv_seg)


def _backward(q, k, v, q_seg, kv_seg, o, lse, do, scale, blocks, interpret):
  b, t, n, h = q.shape
  kv_heads = k.shape[2]
  group = n // kv_heads
  nq, nk = t // blocks.block_q, t // blocks.block_k
  delta = jnp.einsum("btnh,btnh->bnt", o.astype(jnp.float32), do.astype(jnp.float32))
  params = _compiler_params(blocks, interpret)

  row_spec = pl.BlockSpec((None, blocks.block_q, None, h), lambda i, bi, ni: (bi, i, ni, 0))
  kv_spec = pl.BlockSpec((None, t, None, h), lambda i, bi, ni: (bi, 0, ni // group, 0))
  stat_spec = pl.BlockSpec((None, None, blocks.block_q), lambda i, bi, ni: (bi, ni, i))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, scale=scale, block_q=blocks.block_q, block_k=blocks.block_k,
                        num_kv_blocks=nk),
      grid=(nq, b, n),
      in_specs=[row_spec, kv_spec, kv_spec,
                pl.BlockSpec((None, blocks.block_q), lambda i, bi, ni: (bi, i)),
                pl.BlockSpec((None, t), lambda i, bi, ni: (bi, 0)),
                row_spec, stat_spec, stat_spec],
      out_specs=row_spec, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=params, interpret=interpret,
      name="flash_attention_gpu_dq")(q, k, v, q_seg, kv_seg, do, lse, delta)

  all_rows = pl.BlockSpec((None, t, n, h), lambda j, bi, ki: (bi, 0, 0, 0))
  key_block = pl.BlockSpec((None, blocks.block_k, None, h), lambda j, bi, ki: (bi, j, ki, 0))
  all_stats = pl.BlockSpec((None, n, t), lambda j, bi, ki: (bi, 0, 0))
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, scale=scale, block_q=blocks.block_q, block_k=blocks.block_k,
                        num_q_blocks=nq, group=group),
      grid=(nk, b, kv_heads),
      in_specs=[all_rows, key_block, key_block,
                pl.BlockSpec((None, t), lambda j, bi, ki: (bi, 0)),
                pl.BlockSpec((None, blocks.block_k), lambda j, bi, ki: (bi, j)),
                all_rows, all_stats, all_stats],
      out_specs=[key_block, key_block],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=params, interpret=interpret,
      name="flash_attention_gpu_dkv")(q, k, v, q_seg, kv_seg, do, lse, delta)
  return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _flash(q, k, v, q_seg, kv_seg, scale, blocks, interpret):
  return _forward(q, k, v, q_seg, kv_seg, scale, blocks, interpret)[0]


def _flash_fwd(q, k, v, q_seg, kv_seg, scale, blocks, interpret):
  o, lse = _forward(q, k, v, q_seg, kv_seg, scale, blocks, interpret)
  return o, (q, k, v, q_seg, kv_seg, o, lse)


def _flash_bwd(scale, blocks, interpret, residuals, do):
  q, k, v, q_seg, kv_seg, o, lse = residuals
  dq, dk, dv = _backward(q, k, v, q_seg, kv_seg, o, lse, do, scale, blocks, interpret)
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _pad_rows(x, length):
  pad = length - x.shape[1]
  if pad == 0:
    return x
  return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))


def flash_attention_gpu(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: jax.Array,
                        kv_segment_ids: jax.Array, scale: float, blocks: GpuBlocks | None = None,
                        interpret: bool = False) -> jax.Array:
  """Causal segment attention `[B, T, N, H]` from q `[B, T, N, H]`, k / v `[B, T, K, H]`.

  Self-attention only (queries and keys share positions). Shapes are checked
  by the dispatcher (`recipe_jax.kernels.dispatch`); `blocks` default to
  `default_gpu_blocks`. Differentiable in q, k and v.
  """
  t, h = q.shape[1], q.shape[3]
  blocks = blocks or default_gpu_blocks(t, h, q.dtype.itemsize)
  tile = math.lcm(blocks.block_q, blocks.block_k)
  padded = -(-t // tile) * tile
  args = [_pad_rows(x, padded) for x in (q, k, v, q_segment_ids, kv_segment_ids)]
  out = _flash(*args, float(scale), blocks, interpret)
  return out[:, :t]
