"""The engine on a sampling mesh: same greedy tokens and log-probs as one device, and
`update_params` takes parameters sharded on a different (training) mesh without recompiling."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from recipe_jax.models import init_params
from recipe_jax.parallel.mesh import make_mesh
from recipe_jax.parallel.sharding import param_shardings
from recipe_jax.models.transformer import abstract_params
from recipe_jax.sampling import Engine, generate

PROMPTS = [[3, 17, 250, 9, 44], [100], [7, 7, 7, 1, 2, 3, 4, 5, 6, 11], [42, 43], [5, 6, 7]]
MAX_LEN = 16
STEPS = 4


def _greedy(engine):
  return generate(engine, PROMPTS, max_new_tokens=STEPS, temperature=0.0)


def _assert_same(got, want):
  for a, b in zip(got, want, strict=True):
    assert a.token_ids == b.token_ids, (a.prompt_index, a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    if b.expert_ids is not None:
      np.testing.assert_array_equal(a.expert_ids, b.expert_ids)


def _mesh_axes(tree) -> set[tuple]:
  """The distinct (mesh shape, spec) pairs the leaves of `tree` are placed with."""
  out = set()
  for leaf in jax.tree.leaves(tree):
    s = leaf.sharding
    assert isinstance(s, NamedSharding), s
    out.add((tuple(s.mesh.shape.items()), s.spec))
  return out


@pytest.fixture(scope="module")
def moe(tiny_model):
  return tiny_model("tiny-moe")


def test_engine_on_mesh_matches_single_device_and_takes_training_params(moe):
  cfg, params = moe
  single = Engine(cfg, params, slots=4, max_len=MAX_LEN)
  mesh = make_mesh((1, 2, 2, 2))          # slots over data*fsdp*expert = 4, KV heads over tensor = 2
  engine = Engine(cfg, params, slots=4, max_len=MAX_LEN, mesh=mesh)

  # Parameters and the cache live on the sampling mesh as stated.
  want = param_shardings(cfg, abstract_params(cfg), mesh)
  for got, spec in zip(jax.tree.leaves(engine.params), jax.tree.leaves(want)):
    assert got.sharding.is_equivalent_to(spec, got.ndim)
  state = engine.init_decode_state()
  cache_spec = state.cache.k.sharding.spec
  assert cache_spec[1] == ("data", "fsdp", "expert") and cache_spec[3] == "tensor"
  assert state.cache.k.addressable_shards[0].data.shape == (cfg.num_layers, 1, MAX_LEN, 1, cfg.head_dim)
  del state

  reference = _greedy(single)
  _assert_same(_greedy(engine), reference)
  compiled = engine.compilations()
  assert compiled > 0

  # Freshly "trained" parameters, sharded on a training mesh that differs (fsdp over all 8).
  train_mesh = make_mesh((1, 8, 1, 1))
  new = init_params(cfg, seed=11)
  on_train = jax.device_put(new, param_shardings(cfg, abstract_params(cfg), train_mesh))
  assert any(("fsdp", 8) in m for m, _ in _mesh_axes(on_train))
  engine.update_params(on_train)
  assert all(dict(m) == dict(mesh.shape) for m, _ in _mesh_axes(engine.params))
  single.update_params(new)
  updated = _greedy(engine)
  _assert_same(updated, _greedy(single))
  assert [c.token_ids for c in updated] != [c.token_ids for c in reference]
  assert engine.compilations() == compiled

  # Back to the first parameters, again from the training mesh: the first outputs return.
  engine.update_params(jax.device_put(params, param_shardings(cfg, abstract_params(cfg), train_mesh)))
  _assert_same(_greedy(engine), reference)
  assert engine.compilations() == compiled


def test_mesh_that_does_not_divide_the_slots_is_refused(moe):
  cfg, params = moe
  with pytest.raises(ValueError, match="slots=2 is not divisible by the mesh's batch shards 4"):
    Engine(cfg, params, slots=2, max_len=MAX_LEN, mesh=make_mesh((1, 2, 2, 2)))
