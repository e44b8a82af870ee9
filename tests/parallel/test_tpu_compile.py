"""Ahead-of-time TPU v5p compilation of the expert-parallel MoE on a CPU host.

The TPU compiler (the `libtpu` wheel, `pip install "jax[tpu]==0.10.2"`)
compiles for compile-only v5p devices from `jax.experimental.topologies`; no
TPU is needed. This proves the `ragged` all-to-all path (`jax.lax.
ragged_all_to_all`, which XLA:CPU cannot run) lowers and compiles for TPU, in
the forward pass and in its gradient. Skipped when libtpu is not installed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.config import ConfigError
from recipe_jax.models import abstract_params, forward, get_preset
from recipe_jax.parallel import tpu
from recipe_jax.parallel.mesh import BATCH_AXES
from recipe_jax.parallel.sharding import param_shardings

needs_libtpu = pytest.mark.skipif(
    not tpu.libtpu_available(),
    reason="libtpu is not installed (pip install 'jax[tpu]==0.10.2') - TPU AOT compile not tested")

TOPOLOGY = "v5p:2x2x1"  # one host, 4 chips
BATCH, SEQ = 8, 16


def _train_step(cfg, mesh):
  """Loss and gradients: next-token cross-entropy plus the scaled router balance loss."""

  def loss_fn(params, tokens):
    out = forward(cfg, params, tokens[:, :-1], mesh=mesh)
    logp = jax.nn.log_softmax(out.logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()
    return nll + cfg.router_aux_loss_coef * out.aux_loss

  return jax.value_and_grad(loss_fn)


@needs_libtpu
@pytest.mark.parametrize("mesh_shape", [(1, 1, 4, 1), (1, 2, 2, 1)], ids=["expert4", "fsdp2-expert2"])
@pytest.mark.parametrize("preset", ["tiny-moe", "tiny-glm"])
def test_moe_train_step_compiles_for_tpu_with_ragged_all_to_all(preset, mesh_shape):
  mesh = tpu.tpu_topology_mesh(TOPOLOGY, mesh_shape)
  assert {d.platform for d in mesh.devices.flat} == {"tpu"}
  cfg = get_preset(preset).replace(moe_all_to_all="ragged")
  abstract = abstract_params(cfg)
  p_shard = param_shardings(cfg, abstract, mesh)
  tok_shard = NamedSharding(mesh, P(BATCH_AXES, None))
  tokens = jax.ShapeDtypeStruct((BATCH, SEQ + 1), jnp.int32)

  compiled = tpu.compile_for_tpu(_train_step(cfg, mesh), (abstract, tokens), (p_shard, tok_shard),
                                 (NamedSharding(mesh, P()), p_shard))

  # Two ragged exchanges (there and back) per MoE layer forward, two more in the gradient.
  ops = tpu.hlo_ops(compiled, "ragged-all-to-all")
  assert ops["ragged-all-to-all"] == 4 * cfg.num_moe_layers, ops
  assert compiled.memory_analysis() is not None
  report = tpu.compile_report(compiled)
  assert report.argument_bytes > 0 and report.output_bytes > 0 and report.temp_bytes > 0
  assert report.flops and report.flops > 0
  assert report.bytes_accessed and report.bytes_accessed > 0
  # Gradients come back sharded like the parameters, so per-device outputs hold
  # about one shard of the parameters (plus the scalar loss).
  assert report.output_bytes < 2 * report.argument_bytes


@needs_libtpu
def test_tpu_topology_mesh_axes_and_devices():
  mesh = tpu.tpu_topology_mesh(TOPOLOGY, (1, 2, 2, 1))
  assert mesh.axis_names == ("data", "fsdp", "expert", "tensor")
  assert mesh.devices.shape == (1, 2, 2, 1)
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
  assert {d.device_kind for d in mesh.devices.flat} == {"TPU v5"}
  # The host's own backend is untouched.
  assert jax.default_backend() == "cpu"
  # The mesh must cover the whole slice.
  with pytest.raises(ConfigError, match="4 devices"):
    tpu.tpu_topology_mesh(TOPOLOGY, (1, 1, 2, 1))


def test_tpu_topology_mesh_without_libtpu_says_how_to_install(monkeypatch):
  monkeypatch.setattr(tpu, "libtpu_available", lambda: False)
  with pytest.raises(tpu.TpuUnavailableError, match=r"jax\[tpu\]"):
    tpu.tpu_topology_mesh(TOPOLOGY, (1, 1, 4, 1))
