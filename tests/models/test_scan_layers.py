"""The scanned decoder (`scan_layers=True`, stacked parameters) against the per-layer loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from recipe_jax.models import abstract_params, forward, get_preset, init_params
from recipe_jax.models.stacking import layer_slices, stack_layers, to_layout, unstack_layers
from recipe_jax.parallel.mesh import MeshConfig, make_mesh
from recipe_jax.parallel.sharding import param_shardings, param_specs


def _close(a, b, tol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), atol=tol, rtol=tol)


def test_layer_runs_of_the_real_presets():
  assert get_preset("glm-4.5-air").layer_runs == ((0, 1), (1, 45))
  assert get_preset("glm-4.5").layer_runs == ((0, 3), (3, 89))
  assert get_preset("qwen3-8b").layer_runs == ((0, 36),)
  alternating = get_preset("tiny-moe").replace(num_layers=4, moe_layer_step=2)
  assert alternating.layer_runs == ((0, 1), (1, 1), (2, 1), (3, 1))


@pytest.mark.parametrize("name", ["tiny-glm"])  # a dense layer, then MoE layers with shared experts
def test_same_seed_gives_the_same_weights_in_both_layouts(name):
  cfg = get_preset(name)
  loop = init_params(cfg, seed=4)
  scan = init_params(cfg.replace(scan_layers=True), seed=4)
  assert "layers" not in scan and len(scan["layer_stacks"]) == len(cfg.layer_runs)
  _close(stack_layers(cfg, loop), scan, tol=0)
  _close(unstack_layers(cfg, scan), loop, tol=0)
  assert jax.tree.structure(abstract_params(cfg.replace(scan_layers=True))) == jax.tree.structure(scan)


def test_scanned_forward_and_gradients_equal_the_loop(tiny_model):
  cfg, params = tiny_model("tiny-glm")  # one dense layer, then a run of two MoE layers
  cfg = cfg.replace(remat="full")  # the scan body under jax.checkpoint (the mesh test runs without)
  scfg = cfg.replace(scan_layers=True)
  sparams = stack_layers(cfg, params)
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  segments = jnp.array([[1] * 9 + [2] * 7, [1] * 12 + [0] * 4])

  def loss(c, p, replay=None):
    out = forward(c, p, tokens, segment_ids=segments, replay_experts=replay)
    return jnp.mean(out.logits ** 2) + out.aux_loss, out

  (l1, o1), g1 = jax.jit(jax.value_and_grad(lambda p: loss(cfg, p), has_aux=True))(params)
  (l2, o2), g2 = jax.jit(jax.value_and_grad(lambda p: loss(scfg, p), has_aux=True))(sparams)
  assert o2.expert_ids.shape == (cfg.num_moe_layers, 2, 16, cfg.num_experts_per_tok)
  np.testing.assert_array_equal(o1.expert_ids, o2.expert_ids)
  _close((l1, o1.logits, o1.aux_loss, o1.expert_load), (l2, o2.logits, o2.aux_loss, o2.expert_load))
  _close(stack_layers(cfg, g1), g2)
  # routing replay feeds each stack its own slice of the recorded layers
  replay = jnp.flip(o1.expert_ids, axis=0)
  r1 = jax.jit(lambda p: loss(cfg, p, replay)[1])(params)
  r2 = jax.jit(lambda p: loss(scfg, p, replay)[1])(sparams)
  np.testing.assert_array_equal(r2.expert_ids, replay)
  _close(r1.logits, r2.logits)


def test_stacked_parameters_shard_like_their_layers_with_a_whole_layer_axis(tiny_model):
  cfg, params = tiny_model("tiny-moe")
  scfg = cfg.replace(scan_layers=True)
  mesh = make_mesh(MeshConfig(data=1, fsdp=2, expert=2, tensor=2))
  loop = param_specs(cfg, abstract_params(cfg), mesh)
  scan = param_specs(scfg, abstract_params(scfg), mesh)
  for (path, spec), _ in zip(jax.tree_util.tree_flatten_with_path(loop["layers"][0],
                                                                  is_leaf=lambda x: isinstance(x, P))[0],
                             range(1000)):
    stacked = scan["layer_stacks"][0]
    for key in path:
      stacked = stacked[key.key]
    assert stacked == P(None, *spec)
  sparams = to_layout(scfg, params, mesh=mesh)
  assert sparams["layer_stacks"][0]["moe"]["gate_proj"].sharding.spec == P(None, "expert", "fsdp", "tensor")
  tokens = jax.random.randint(jax.random.key(2), (8, 16), 0, cfg.vocab_size)
  ref = jax.jit(lambda p: forward(cfg, p, tokens))(params)
  out = jax.jit(lambda p: forward(scfg, p, tokens, mesh=mesh))(sparams)  # expert-parallel inside scan
  _close(ref.logits, out.logits)
  np.testing.assert_array_equal(ref.expert_ids, out.expert_ids)
  _close(to_layout(cfg, sparams), params, tol=0)


def test_layer_slices_name_every_layer_of_a_stack():
  cfg = get_preset("tiny-glm")
  names = [p for p, _ in layer_slices(cfg, "layer_stacks.1.moe.router")]
  assert names == ["layers.1.moe.router", "layers.2.moe.router"]
  assert [p for p, _ in layer_slices(cfg, "embed")] == ["embed"]
  take = dict(layer_slices(cfg, "layer_stacks.1.moe.router"))["layers.2.moe.router"]
  assert take(jnp.arange(6).reshape(2, 3)).tolist() == [3, 4, 5]
