"""The same model on many meshes of 8 simulated CPU devices, and the sharding table's guards."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from recipe_jax.config import ConfigError
from recipe_jax.models import PRESETS, abstract_params, forward, get_preset, init_params
from recipe_jax.parallel.mesh import MESH_AXES, MeshConfig, make_mesh
from recipe_jax.parallel.sharding import param_shardings, param_specs, replicated_params

MESHES = [(1, 1, 1, 1), (8, 1, 1, 1), (2, 2, 2, 1), (1, 2, 2, 2), (1, 1, 8, 1), (2, 1, 4, 1)]


def _run(cfg, params, tokens, mesh):
  shardings = param_shardings(cfg, params, mesh)
  params = jax.device_put(params, shardings)
  fn = jax.jit(lambda p, t: forward(cfg, p, t, mesh=mesh))
  return fn(params, tokens)


@pytest.fixture(scope="module")
def reference(tiny_model):
  out = {}
  for name in ("tiny-moe", "tiny-glm"):
    cfg, params = tiny_model(name)
    tokens = jax.random.randint(jax.random.key(5), (8, 16), 0, cfg.vocab_size)
    out[name] = (cfg, params, tokens, forward(cfg.replace(moe_impl="dense"), params, tokens))
  return out


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_tiny_moe_same_logits_on_every_mesh(reference, shape):
  cfg, params, tokens, ref = reference["tiny-moe"]
  out = _run(cfg, params, tokens, make_mesh(shape))
  np.testing.assert_array_equal(out.expert_ids, ref.expert_ids)
  rel = float(jnp.abs(out.logits - ref.logits).max() / jnp.abs(ref.logits).max())
  assert rel < 1e-5, rel


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (2, 1, 4, 1)], ids=lambda s: "x".join(map(str, s)))
def test_tiny_glm_same_logits_on_meshes(reference, shape):
  cfg, params, tokens, ref = reference["tiny-glm"]
  out = _run(cfg, params, tokens, make_mesh(shape))
  np.testing.assert_array_equal(out.expert_ids, ref.expert_ids)
  np.testing.assert_allclose(out.logits, ref.logits, rtol=1e-5, atol=1e-5 * float(jnp.abs(ref.logits).max()))


@pytest.mark.parametrize("chunk", [0, 8], ids=["whole", "token_chunks"])
def test_expert_parallel_gradients_match_single_device(reference, chunk):
  cfg, params, tokens, _ = reference["tiny-moe"]
  cfg = cfg.replace(moe_token_chunk=chunk)  # 32 tokens per device: 4 exchanges of 8
  mesh = make_mesh((1, 2, 2, 2))

  def loss(p, m):
    out = forward(cfg, p, tokens, mesh=m)
    return jnp.mean(jax.nn.log_softmax(out.logits)[..., 1]) + 0.01 * out.aux_loss

  g_ref = jax.jit(jax.grad(lambda p: loss(p, None)))(params)
  sharded = jax.device_put(params, param_shardings(cfg, params, mesh))
  g_mesh = jax.jit(jax.grad(lambda p: loss(p, mesh)))(sharded)
  for a, b in zip(jax.tree.leaves(g_ref), jax.tree.leaves(g_mesh)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_init_params_creates_each_parameter_on_its_shards():
  cfg = get_preset("tiny-glm")
  mesh = make_mesh((1, 2, 2, 2))
  params = init_params(cfg, mesh=mesh, seed=3)
  expected = param_shardings(cfg, abstract_params(cfg), mesh)
  for p, s in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
    assert p.sharding == s
  assert params["layers"][1]["moe"]["gate_proj"].sharding.spec == P("expert", "fsdp", "tensor")
  # Same seed, same values on any mesh.
  plain = init_params(cfg, seed=3)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(1, 2, 2, 2), (1, 1, 8, 1)], ids=["1x2x2x2", "1x1x8x1"])
@pytest.mark.parametrize("name", [n for n in PRESETS if not n.startswith("tiny")])
def test_no_large_parameter_is_left_replicated(name, shape):
  cfg = get_preset(name)
  mesh = AbstractMesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 4)
  abstract = abstract_params(cfg)
  assert replicated_params(abstract, param_specs(cfg, abstract, mesh)) == []


def test_replicated_params_reports_offenders():
  cfg = get_preset("qwen3-0.6b")
  abstract = abstract_params(cfg)
  mesh = AbstractMesh((8, 1, 1, 1), MESH_AXES, axis_types=(AxisType.Auto,) * 4)  # pure data parallel
  found = replicated_params(abstract, param_specs(cfg, abstract, mesh))
  assert any(f.startswith("embed ") for f in found)
  assert any("attn.q_proj" in f for f in found)


def test_mesh_that_does_not_divide_a_dimension_names_the_field():
  cfg = get_preset("tiny-moe")  # 4 query heads, 2 key/value heads
  mesh = AbstractMesh((1, 1, 1, 8), MESH_AXES, axis_types=(AxisType.Auto,) * 4)
  with pytest.raises(ConfigError, match="num_heads|num_kv_heads"):
    param_specs(cfg, abstract_params(cfg), mesh)
  mesh = AbstractMesh((1, 1, 16, 1), MESH_AXES, axis_types=(AxisType.Auto,) * 4)
  with pytest.raises(ConfigError, match="num_experts"):
    param_specs(cfg, abstract_params(cfg), mesh)


def test_forward_takes_the_mesh_from_set_mesh(reference):
  cfg, params, tokens, ref = reference["tiny-moe"]
  mesh = make_mesh((1, 2, 2, 2))
  sharded = jax.device_put(params, param_shardings(cfg, params, mesh))
  with jax.set_mesh(mesh):
    out = jax.jit(lambda p, t: forward(cfg, p, t))(sharded, tokens)
  np.testing.assert_allclose(out.logits, ref.logits, rtol=1e-5, atol=1e-5 * float(jnp.abs(ref.logits).max()))


def test_batch_must_divide_batch_shards(tiny_model):
  cfg, params = tiny_model("tiny-moe")
  with pytest.raises(ConfigError, match="data\\*fsdp\\*expert=8"):
    forward(cfg, params, jnp.zeros((3, 4), jnp.int32), mesh=make_mesh((2, 2, 2, 1)))


def test_mesh_config_resolution():
  assert MeshConfig(fsdp=-1, tensor=2).resolve(8) == (1, 4, 1, 2)
  with pytest.raises(ConfigError, match="mesh"):
    MeshConfig(data=3, fsdp=1).resolve(8)
  with pytest.raises(ConfigError, match="at most one"):
    MeshConfig(data=-1, fsdp=-1)


def test_token_chunk_must_divide_the_tokens_per_device(reference):
  cfg, params, tokens, _ = reference["tiny-moe"]
  with pytest.raises(ValueError, match="moe_token_chunk=5 does not divide the 32 tokens per device"):
    _run(cfg.replace(moe_token_chunk=5), params, tokens, make_mesh((1, 2, 2, 2)))
