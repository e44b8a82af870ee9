"""The kernels lower for real hardware from this CPU host.

TPU: a full model forward and backward with `attention_impl="pallas_tpu"` compiles ahead of
time for a TPU v5p slice (libtpu, compile-only devices), the splash kernels (forward, dq, dkv)
inside `shard_map` over an fsdp x tensor mesh; so does decode attention. Skipped without libtpu.
GPU: the Triton kernels lower to Triton IR for CUDA (no GPU needed for that step; compiling
the IR to PTX needs the GPU runtime and is left to the benchmark on a GPU machine).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.kernels.decode_gpu import decode_attention_gpu
from recipe_jax.kernels.dispatch import decode_attention
from recipe_jax.kernels.flash_gpu import flash_attention_gpu
from recipe_jax.models import abstract_params, forward, get_preset
from recipe_jax.parallel import tpu
from recipe_jax.parallel.mesh import BATCH_AXES
from recipe_jax.parallel.sharding import param_shardings

needs_libtpu = pytest.mark.skipif(
    not tpu.libtpu_available(),
    reason="libtpu is not installed (pip install 'jax[tpu]==0.10.2') - TPU kernel lowering not tested")


@needs_libtpu
def test_model_with_splash_attention_compiles_for_tpu_v5p():
  mesh = tpu.tpu_topology_mesh("v5p:2x2x1", (1, 2, 1, 2))
  # `auto` takes the platform from the mesh: a TPU topology picks splash attention on a CPU host.
  # Two scanned layers: the kernel also runs inside the layer scan.
  cfg = get_preset("tiny-dense").replace(head_dim=128, num_layers=2, attention_impl="auto", scan_layers=True)
  abstract = abstract_params(cfg)
  p_shard = param_shardings(cfg, abstract, mesh)
  tokens = jax.ShapeDtypeStruct((4, 257), jnp.int32)

  def loss(params, tokens):
    logits = forward(cfg, params, tokens[:, :-1]).logits
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

  with jax.set_mesh(mesh):
    compiled = tpu.compile_for_tpu(jax.value_and_grad(loss), (abstract, tokens),
                                   (p_shard, NamedSharding(mesh, P(BATCH_AXES, None))),
                                   (NamedSharding(mesh, P()), p_shard))
  # Splash forward, dq and dkv kernels: Mosaic custom calls in the TPU executable.
  assert compiled.as_text().count('custom_call_target="tpu_custom_call"') >= 3
  assert tpu.compile_report(compiled).flops > 0


@needs_libtpu
def test_decode_attention_compiles_for_tpu_v5p():
  mesh = tpu.tpu_topology_mesh("v5p:2x2x1", (1, 2, 1, 2))
  q = jax.ShapeDtypeStruct((4, 12, 64), jnp.bfloat16)
  cache = jax.ShapeDtypeStruct((4, 1024, 4, 64), jnp.bfloat16)
  lengths = jax.ShapeDtypeStruct((4,), jnp.int32)
  rows = NamedSharding(mesh, P(BATCH_AXES, "tensor", None))
  caches = NamedSharding(mesh, P(BATCH_AXES, None, "tensor", None))
  fn = lambda *a: decode_attention(*a, scale=0.125, impl="pallas_tpu", mesh=mesh)
  compiled = tpu.compile_for_tpu(fn, (q, cache, cache, lengths),
                                 (rows, caches, caches, NamedSharding(mesh, P(BATCH_AXES))), rows)
  assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1


def _lower_for_cuda(fn, *args):
  try:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  except (NotImplementedError, ImportError, ModuleNotFoundError) as e:  # jaxlib without the Triton dialect
    pytest.skip(f"Pallas Triton lowering unavailable on this host: {e}")


def test_gpu_kernels_lower_to_triton():
  q = jax.ShapeDtypeStruct((1, 1000, 12, 128), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((1, 1000, 4, 128), jnp.bfloat16)
  ids = jax.ShapeDtypeStruct((1, 1000), jnp.int32)

  def loss(q, k, v, ids):
    out = flash_attention_gpu(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, scale=0.1)
    return out.astype(jnp.float32).sum()

  text = _lower_for_cuda(jax.grad(loss, argnums=(0, 1, 2)), q, kv, kv, ids)
  assert text.count("__gpu$xla.gpu.triton") == 3  # forward, dq, dkv
  decode = _lower_for_cuda(lambda *a: decode_attention_gpu(*a, scale=0.1),
                           jax.ShapeDtypeStruct((3, 12, 64), jnp.bfloat16),
                           jax.ShapeDtypeStruct((3, 512, 4, 64), jnp.bfloat16),
                           jax.ShapeDtypeStruct((3, 512, 4, 64), jnp.bfloat16),
                           jax.ShapeDtypeStruct((3,), jnp.int32))
  assert decode.count("__gpu$xla.gpu.triton") == 1
