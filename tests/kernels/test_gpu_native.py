"""The GPU kernels compiled for a real GPU (not interpret mode) match the XLA references.

Skipped unless JAX runs on a GPU (`JAX_PLATFORMS=cuda pytest tests/kernels/test_gpu_native.py`);
the interpret-mode tests beside this file cover the same kernels on CPU. Cases use the
default tiles (`default_gpu_blocks`), lengths that are not a tile multiple, packed rows with
an all-padding row, and the model forward with `attention_impl="pallas_gpu"`. Float32 matmuls
run as TF32 on the GPU, in the kernels and in XLA's references alike (10-bit mantissas), so
float32 is held to 5e-3 here, not the 1e-5 of interpret mode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_flash import _close, _inputs, _value_and_grads

from recipe_jax.kernels.decode_gpu import decode_attention_gpu
from recipe_jax.kernels.flash_gpu import flash_attention_gpu
from recipe_jax.kernels.reference import decode_attention_xla
from recipe_jax.models.attention import attention_xla

TF32 = 5e-3

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU (JAX_PLATFORMS=cuda)")


@pytest.mark.parametrize("length,head_dim,dtype,tol", [(300, 64, jnp.float32, TF32), (700, 128, jnp.float32, TF32),
                                                       (1000, 128, jnp.bfloat16, 2e-2), (2100, 64, jnp.bfloat16, 2e-2)])
def test_flash_kernel_on_gpu_matches_reference(length, head_dim, dtype, tol):
  q, k, v, ids, do = _inputs(length, head_dim, dtype, seed=length)
  out, grads = _value_and_grads(flash_attention_gpu, q, k, v, ids, do)
  ref_out, ref_grads = _value_and_grads(attention_xla, q, k, v, ids, do)
  real = np.asarray(ids != 0)[:, :, None, None]
  _close(np.where(real, out.astype(jnp.float32), 0), np.where(real, ref_out.astype(jnp.float32), 0), tol)
  for name, g, ref in zip("qkv", grads, ref_grads):
    assert g.dtype == dtype, name
    _close(g, ref, tol)


@pytest.mark.parametrize("head_dim,dtype,tol", [(64, jnp.float32, TF32), (128, jnp.bfloat16, 2e-2)])
def test_decode_kernel_on_gpu_matches_reference(head_dim, dtype, tol):
  lengths = jnp.asarray([0, 1, 333, 1024, 4096], jnp.int32)
  b, n, kv, s = len(lengths), 8, 2, 4096
  keys = jax.random.split(jax.random.key(head_dim), 3)
  q = jax.random.normal(keys[0], (b, n, head_dim), jnp.float32).astype(dtype)
  k = jax.random.normal(keys[1], (b, s, kv, head_dim), jnp.float32).astype(dtype)
  v = jax.random.normal(keys[2], (b, s, kv, head_dim), jnp.float32).astype(dtype)
  out = jax.jit(lambda *a: decode_attention_gpu(*a, scale=head_dim ** -0.5))(q, k, v, lengths)
  ref = decode_attention_xla(q, k, v, lengths, scale=head_dim ** -0.5)
  out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
  assert not out[0].any()
  np.testing.assert_allclose(out, ref, atol=tol, rtol=tol)


def test_model_with_gpu_kernel_matches_plain_attention():
  from recipe_jax.models import forward, get_preset, init_params

  cfg = get_preset("tiny-dense").replace(head_dim=64)
  params = init_params(cfg, seed=0)
  tokens = jax.random.randint(jax.random.key(1), (2, 256), 0, cfg.vocab_size)
  seg = jnp.concatenate([jnp.ones((2, 100), jnp.int32), jnp.full((2, 150), 2, jnp.int32),
                         jnp.zeros((2, 6), jnp.int32)], axis=1)
  pos = jnp.concatenate([jnp.arange(100), jnp.arange(150), jnp.zeros(6, jnp.int32)])[None].repeat(2, 0)

  def loss(impl):
    def fn(p):
      out = forward(cfg.replace(attention_impl=impl), p, tokens, positions=pos, segment_ids=seg)
      return jnp.sum(jnp.where(seg[..., None] > 0, out.logits.astype(jnp.float32), 0.0) ** 2) * 1e-4, out.logits
    return jax.jit(jax.value_and_grad(fn, has_aux=True))(params)

  (_, logits), grads = loss("pallas_gpu")
  (_, ref_logits), ref_grads = loss("xla")
  real = np.asarray(seg > 0)[..., None]
  _close(np.where(real, logits, 0), np.where(real, ref_logits, 0), TF32)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    _close(g, r, TF32)
