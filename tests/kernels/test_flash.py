"""The flash attention kernels (TPU splash wrapper, GPU Triton kernel) in Pallas interpret mode
match the plain XLA reference: outputs and dq, dk, dv, on packed rows with random segment
layouts (an empty row, single-token segments, padding tails) and lengths that are not a
multiple of the block size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.kernels.flash_gpu import GpuBlocks, default_gpu_blocks, flash_attention_gpu
from recipe_jax.kernels.flash_tpu import default_tpu_blocks, flash_attention_tpu
from recipe_jax.models.attention import attention_xla

N, K = 4, 2  # two query heads per key/value head


def packed_segment_ids(rng: np.random.Generator, rows: int, length: int) -> np.ndarray:
  """Row 0 all padding; row 1 single-token segments then one long one; row 2 random packing
  with a padding tail; further rows one segment each."""
  ids = np.zeros((rows, length), np.int32)
  ids[1, :5] = np.arange(1, 6)
  ids[1, 5:length - 3] = 6
  pos, seg = 0, 1
  end = length - int(rng.integers(1, length // 4))
  while pos < end:
    size = int(rng.choice([1, 2, int(rng.integers(3, length // 2))]))
    ids[2, pos:min(pos + size, end)] = seg
    pos, seg = pos + size, seg + 1
  ids[3:] = 7
  return ids


def _inputs(length, head_dim, dtype, seed):
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(packed_segment_ids(rng, 4, length))
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (4, length, N, head_dim), jnp.float32).astype(dtype)
  k = jax.random.normal(keys[1], (4, length, K, head_dim), jnp.float32).astype(dtype)
  v = jax.random.normal(keys[2], (4, length, K, head_dim), jnp.float32).astype(dtype)
  # Padding rows carry no loss: their cotangent is zero.
  do = jax.random.normal(keys[3], q.shape, jnp.float32) * (ids != 0)[:, :, None, None]
  return q, k, v, ids, do.astype(dtype)


def _value_and_grads(fn, q, k, v, ids, do):
  def loss(q, k, v):
    out = fn(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, scale=q.shape[-1] ** -0.5)
    return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32)), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


def _close(actual, expected, tol):
  actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
  assert np.isfinite(actual).all()
  scale = max(1.0, float(np.abs(expected).max()))
  np.testing.assert_allclose(actual, expected, atol=tol * scale, rtol=tol)


KERNELS = {
    "gpu": lambda q, k, v, **kw: flash_attention_gpu(q, k, v, blocks=GpuBlocks(16, 16, 4, 2),
                                                     interpret=True, **kw),
    "tpu": lambda q, k, v, **kw: flash_attention_tpu(q, k, v, interpret=True, **kw),
}

CASES = [  # kernel, length (never a block multiple), head dim, dtype, tolerance
    ("gpu", 40, 64, jnp.float32, 1e-5),
    ("gpu", 23, 128, jnp.bfloat16, 2e-2),
    ("tpu", 130, 64, jnp.float32, 1e-5),
    ("tpu", 100, 128, jnp.bfloat16, 2e-2),
]


@pytest.mark.parametrize("kernel,length,head_dim,dtype,tol", CASES,
                         ids=[f"{c[0]}-T{c[1]}-H{c[2]}-{jnp.dtype(c[3]).name}" for c in CASES])
def test_kernel_matches_reference_outputs_and_gradients(kernel, length, head_dim, dtype, tol):
  q, k, v, ids, do = _inputs(length, head_dim, dtype, seed=length)
  out, grads = _value_and_grads(KERNELS[kernel], q, k, v, ids, do)
  ref_out, ref_grads = _value_and_grads(attention_xla, q, k, v, ids, do)
  assert out.dtype == dtype and out.shape == q.shape
  real = np.asarray(ids != 0)[:, :, None, None]
  # Real rows match the reference; padding rows (no loss) are exactly zero in the kernels.
  _close(np.where(real, out.astype(jnp.float32), 0), np.where(real, ref_out.astype(jnp.float32), 0), tol)
  assert not np.asarray(out.astype(jnp.float32))[~np.broadcast_to(real, out.shape)].any()
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert g.dtype == dtype, name
    _close(g, ref, tol)


def test_tpu_block_sizes_divide_the_padded_length():
  for length in (128, 384, 1024, 4096, 65536):
    blocks = default_tpu_blocks(length)
    for size in (blocks.block_q, blocks.block_kv, blocks.block_kv_compute, blocks.block_q_dkv,
                 blocks.block_kv_dkv, blocks.block_q_dq, blocks.block_kv_dq):
      assert length % size == 0 and size % 128 == 0, (length, blocks)
  assert default_tpu_blocks(65536).block_q == 512 and default_tpu_blocks(384).block_q == 128
  with pytest.raises(ValueError, match="multiple of 128"):
    default_tpu_blocks(200)


def test_gpu_blocks_are_powers_of_two_within_the_sequence():
  assert default_gpu_blocks(65536, 128) == GpuBlocks(128, 64, 8, 2)
  assert default_gpu_blocks(4096, 64) == GpuBlocks(128, 128, 4, 2)
  assert default_gpu_blocks(4096, 64, itemsize=4) == GpuBlocks(64, 64, 4, 2)   # float32: shared memory
  assert default_gpu_blocks(4096, 128, itemsize=4) == GpuBlocks(64, 32, 8, 2)
  small = default_gpu_blocks(20, 64)
  assert small.block_q == small.block_k == 32
