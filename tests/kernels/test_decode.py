"""Decode attention kernels (TPU Mosaic, GPU Triton split-K) in Pallas interpret mode match the
plain reference on ragged caches: lengths 0, 1, not a block multiple, and full; GQA groups of 3;
garbage (NaN) in unfilled cache slots never leaks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.kernels.decode_gpu import combine_splits, decode_attention_gpu, default_splits
from recipe_jax.kernels.decode_tpu import decode_attention_tpu, tpu_decode_block
from recipe_jax.kernels.reference import decode_attention_xla

N, K, S = 6, 2, 96
LENGTHS = (0, 1, 37, S)


def _inputs(head_dim, dtype, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(keys[0], (len(LENGTHS), N, head_dim), jnp.float32).astype(dtype)
  k = jax.random.normal(keys[1], (len(LENGTHS), S, K, head_dim), jnp.float32).astype(dtype)
  v = jax.random.normal(keys[2], (len(LENGTHS), S, K, head_dim), jnp.float32).astype(dtype)
  lengths = jnp.asarray(LENGTHS, jnp.int32)
  unfilled = (jnp.arange(S)[None, :] >= lengths[:, None])[:, :, None, None]
  return q, jnp.where(unfilled, jnp.nan, k).astype(dtype), jnp.where(unfilled, jnp.nan, v).astype(dtype), lengths


KERNELS = {
    "tpu": lambda *a, **kw: decode_attention_tpu(*a, block=32, interpret=True, **kw),
    "gpu": lambda *a, **kw: decode_attention_gpu(*a, block=16, splits=4, interpret=True, **kw),
}


@pytest.mark.parametrize("head_dim,dtype,tol", [(64, jnp.float32, 1e-5), (128, jnp.bfloat16, 2e-2)],
                         ids=["H64-float32", "H128-bfloat16"])
@pytest.mark.parametrize("kernel", ["tpu", "gpu"])
def test_decode_kernel_matches_reference(kernel, head_dim, dtype, tol):
  q, k, v, lengths = _inputs(head_dim, dtype)
  scale = head_dim ** -0.5
  out = jax.jit(lambda *a: KERNELS[kernel](*a, scale=scale))(q, k, v, lengths)
  ref = decode_attention_xla(q, k, v, lengths, scale=scale)
  assert out.shape == q.shape and out.dtype == dtype
  out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
  assert np.isfinite(out).all() and np.isfinite(ref).all()
  assert not out[0].any()  # a row of length 0 gives zeros
  np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)


def test_decode_reference_equals_full_attention_on_the_last_token():
  q, k, v, lengths = _inputs(64, jnp.float32, seed=1)
  b = 2  # length 37
  length = int(lengths[b])
  scores = jnp.einsum("nh,snh->ns", q[b], jnp.repeat(k[b, :length], N // K, axis=1)) * 0.125
  expected = jnp.einsum("ns,snh->nh", jax.nn.softmax(scores, -1), jnp.repeat(v[b, :length], N // K, axis=1))
  got = decode_attention_xla(q, k, v, lengths, scale=0.125)[b]
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_combine_splits_ignores_empty_splits():
  partial = jnp.stack([jnp.full((1, 4), 2.0), jnp.zeros((1, 4)), jnp.full((1, 4), 5.0)])
  lse = jnp.asarray([[0.0], [-1e30], [jnp.log(3.0)]])
  np.testing.assert_allclose(np.asarray(combine_splits(partial, lse)), np.full((1, 4), (2 + 3 * 5) / 4),
                             rtol=1e-6)


def test_block_and_split_choices():
  assert tpu_decode_block(4096) == 512 and tpu_decode_block(96) == 32 and tpu_decode_block(100) is None
  assert default_splits(batch=1, kv_heads=8, num_blocks=1024) == 32
  assert default_splits(batch=64, kv_heads=8, num_blocks=1024) == 1
  assert default_splits(batch=1, kv_heads=1, num_blocks=3) == 3
