"""Flash attention for TPU: JAX's splash attention (Pallas Mosaic), configured for our layout.

Splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) is a
block-sparse flash kernel with forward, dq and dkv Pallas kernels and a custom
VJP. It takes one row at a time with heads leading (`q [N, T, H]`,
`k / v [K, T, H]`, query head `n` reading key/value head `n // (N / K)`), a
static mask (here causal) and per-token segment ids. This wrapper:

* transposes `[B, T, N, H]` to heads-leading and maps the kernel over the batch;
* pre-scales q by `scale` (splash applies none);
* pads the sequence to a multiple of 128 (the kernel's lane width) with
  segment 0, which no real token attends to, and cuts the padding off again;
* chooses block sizes from the padded length (`default_tpu_blocks`);
* zeroes padding query rows (segment 0). Splash lets them attend to other
  padding tokens; zeroing makes every Pallas kernel here agree (output and
  gradients exactly zero on padding rows, which carry no loss).

GQA is native: the kernel's index maps read one key/value head per group of
query heads, so keys and values are never repeated in memory.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash_lib
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mask_info_lib

LANES = 128  # splash blocks are multiples of the 128-lane vreg width


def default_tpu_blocks(seq_len: int) -> splash.BlockSizes:
  """Block sizes for a padded length (a multiple of 128): large blocks, each dividing the length.

  Query blocks up to 512 and key blocks up to 1024 (computed 512 at a time)
  keep the MXU busy at long lengths while the per-step VMEM stays a few MiB.
  """
  if seq_len % LANES:
    raise ValueError(f"splash attention needs a multiple of {LANES} tokens, got {seq_len}")

  def largest(cap: int) -> int:
    size = cap
    while seq_len % size:
      size //= 2
    return size

  block_q, block_kv = largest(512), largest(1024)
  compute = min(block_kv, 512)
  return splash.BlockSizes(
      block_q=block_q, block_kv=block_kv, block_kv_compute=compute,
      block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=compute,
      block_q_dq=block_q, block_kv_dq=compute)


@functools.lru_cache(maxsize=32)
def _splash_kernel(num_heads: int, seq_len: int, blocks: splash.BlockSizes,
                   interpret: bool) -> splash_lib.SplashAttentionKernel:
  """One kernel per (heads, length, blocks), its block-sparsity tables built in numpy on the host.

  `splash.make_splash_mha` would turn the tables into device arrays, which
  fails inside a trace under a mesh of compile-only TPU devices (`jax.set_mesh`
  for ahead-of-time compilation); numpy tables become constants of the trace.
  """
  mask = splash.MultiHeadMask([splash.CausalMask((seq_len, seq_len))] * num_heads)
  fwd, mask_fn = mask_info_lib.process_mask(mask, (blocks.block_q, blocks.block_kv))
  dq, _ = mask_info_lib.process_mask(mask, (blocks.block_q_dq, blocks.block_kv_dq))
  dkv, _ = mask_info_lib.process_mask_dkv(mask, (blocks.block_q_dkv, blocks.block_kv_dkv))
  return splash_lib.SplashAttentionKernel(
      fwd, dq, dkv, block_sizes=blocks, is_mqa=False, save_residuals=False,
      mask_value=splash_lib.DEFAULT_MASK_VALUE, attn_logits_soft_cap=None,
      residual_checkpoint_name=None, mask_function=mask_fn, interpret=interpret)


def padded_length(seq_len: int) -> int:
  return -(-seq_len // LANES) * LANES


def flash_attention_tpu(q: jax.Array, k: jax.Array, v: jax.Array, *, q_segment_ids: jax.Array,
                        kv_segment_ids: jax.Array, scale: float,
                        blocks: splash.BlockSizes | None = None, interpret: bool = False) -> jax.Array:
  """Causal segment attention `[B, T, N, H]` from q `[B, T, N, H]`, k / v `[B, T, K, H]`.

  Self-attention only (queries and keys share positions); shapes are checked
  by the dispatcher. Float32 softmax statistics and accumulation for any input
  dtype. `blocks` default to `default_tpu_blocks` of the padded length.
  """
  b, t, n, h = q.shape
  padded = padded_length(t)
  blocks = blocks or default_tpu_blocks(padded)
  kernel = _splash_kernel(n, padded, blocks, interpret)

  def heads_first(x):
    x = jnp.pad(x, [(0, 0), (0, padded - t), (0, 0), (0, 0)]) if padded != t else x
    return jnp.swapaxes(x, 1, 2)

  def pad_ids(ids):
    return jnp.pad(ids, [(0, 0), (0, padded - t)]) if padded != t else ids

  qs = heads_first((q.astype(jnp.float32) * scale).astype(q.dtype))  # one rounding, unbiased scale
  ks, vs = heads_first(k), heads_first(v)
  q_ids, kv_ids = pad_ids(q_segment_ids.astype(jnp.int32)), pad_ids(kv_segment_ids.astype(jnp.int32))

  def one_row(q_row, k_row, v_row, q_id_row, kv_id_row):
    return kernel(q_row, k_row, v_row, segment_ids=splash.SegmentIds(q=q_id_row, kv=kv_id_row))

  out = jax.vmap(one_row)(qs, ks, vs, q_ids, kv_ids)  # [B, N, T_pad, H]
  out = jnp.swapaxes(out, 1, 2)[:, :t]
  return jnp.where((q_segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))
