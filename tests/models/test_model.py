"""Forward-pass behaviour of the decoder: packing, padding, routing replay, dispatch paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.models import forward as _forward
from recipe_jax.models import get_preset, positions_from_segments

TINY = ["tiny-dense", "tiny-moe", "tiny-glm"]
MOE = ["tiny-moe", "tiny-glm"]

forward = jax.jit(_forward, static_argnums=0, static_argnames=("return_hidden",))


@pytest.fixture(scope="module")
def models(tiny_model):
  return {name: tiny_model(name) for name in TINY}


def _tokens(cfg, b=2, t=12, seed=0):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)


@pytest.mark.parametrize("name", TINY)
def test_output_shapes(models, name):
  cfg, params = models[name]
  out = forward(cfg, params, _tokens(cfg))
  assert out.logits.shape == (2, 12, cfg.vocab_size) and out.logits.dtype == jnp.float32
  assert out.hidden_states.shape == (2, 12, cfg.hidden_size)
  assert bool(jnp.isfinite(out.logits).all())
  if cfg.is_moe:
    assert out.expert_ids.shape == (cfg.num_moe_layers, 2, 12, cfg.num_experts_per_tok)
    assert out.expert_load.shape == (cfg.num_moe_layers, cfg.num_experts)
    np.testing.assert_array_equal(out.expert_load.sum(-1), 2 * 12 * cfg.num_experts_per_tok)
    assert float(out.aux_loss) > 0
  else:
    assert out.expert_ids is None and float(out.aux_loss) == 0.0
  hidden_only = forward(cfg, params, _tokens(cfg), return_hidden=True)
  assert hidden_only.logits is None
  np.testing.assert_allclose(hidden_only.hidden_states, out.hidden_states, rtol=1e-6, atol=1e-6)


def test_positions_restart_per_segment():
  seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
  np.testing.assert_array_equal(positions_from_segments(seg), [[0, 1, 2, 0, 1, 0, 0, 1]])


@pytest.mark.parametrize("name", TINY)
def test_packed_rows_equal_unpacked(models, name):
  """Two documents packed in one row give the same logits as each run alone."""
  cfg, params = models[name]
  a, b = _tokens(cfg, 1, 5, seed=3), _tokens(cfg, 1, 4, seed=4)
  pad = jnp.zeros((1, 3), a.dtype)
  packed = jnp.concatenate([a, b, pad], axis=1)
  seg = jnp.array([[1] * 5 + [2] * 4 + [0] * 3])
  out = forward(cfg, params, packed, segment_ids=seg)
  alone_a = forward(cfg, params, a).logits
  alone_b = forward(cfg, params, b).logits
  np.testing.assert_allclose(out.logits[:, :5], alone_a, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out.logits[:, 5:9], alone_b, atol=1e-5, rtol=1e-5)
  if cfg.is_moe:  # padding is excluded from expert load statistics
    np.testing.assert_array_equal(out.expert_load.sum(-1), 9 * cfg.num_experts_per_tok)


@pytest.mark.parametrize("name", TINY)
def test_padding_tokens_do_not_leak(models, name):
  cfg, params = models[name]
  tok = _tokens(cfg, 2, 10)
  seg = jnp.array([[1] * 7 + [0] * 3, [1] * 4 + [2] * 6])
  other = tok.at[0, 7:].set((tok[0, 7:] + 17) % cfg.vocab_size)
  x = forward(cfg, params, tok, segment_ids=seg).logits
  y = forward(cfg, params, other, segment_ids=seg).logits
  np.testing.assert_allclose(x[0, :7], y[0, :7], atol=1e-6)
  np.testing.assert_allclose(x[1], y[1], atol=1e-6)


@pytest.mark.parametrize("name", MOE)
def test_replaying_own_routing_is_exact(models, name):
  cfg, params = models[name]
  tok = _tokens(cfg)
  out = forward(cfg, params, tok)
  replayed = forward(cfg, params, tok, replay_experts=out.expert_ids)
  np.testing.assert_array_equal(replayed.logits, out.logits)
  np.testing.assert_array_equal(replayed.expert_ids, out.expert_ids)


@pytest.mark.parametrize("name", MOE)
def test_replay_uses_recorded_ids_and_router_gets_gradient(models, name):
  cfg, params = models[name]
  tok = _tokens(cfg)
  ids = forward(cfg, params, tok).expert_ids
  other = (ids + 1) % cfg.num_experts  # k distinct ids stay distinct
  replayed = forward(cfg, params, tok, replay_experts=other)
  np.testing.assert_array_equal(replayed.expert_ids, other)
  assert not np.allclose(replayed.logits, forward(cfg, params, tok).logits)

  def loss(p):
    return forward(cfg, p, tok, replay_experts=other).logits.std()

  layer = cfg.moe_layer_ids[0]
  g = jax.grad(loss)(params)["layers"][layer]["moe"]["router"]
  assert float(jnp.abs(g).max()) > 0


@pytest.mark.parametrize("name", MOE)
def test_ragged_dispatch_matches_dense_reference(models, name):
  """The grouped-matmul path agrees with every-expert-on-every-token, values and gradients."""
  cfg, params = models[name]
  tok = _tokens(cfg)

  def run(c):
    def loss(p):
      out = forward(c, p, tok)
      return jnp.mean(jax.nn.log_softmax(out.logits)[..., 0]) + out.aux_loss, out.logits
    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, logits, grads

  v1, l1, g1 = run(cfg.replace(moe_impl="dense"))
  v2, l2, g2 = run(cfg.replace(moe_impl="ragged"))
  np.testing.assert_allclose(l1, l2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v1, v2, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bfloat16_forward_is_finite_and_close(models):
  cfg, params = models["tiny-moe"]
  tok = _tokens(cfg)
  ref = forward(cfg, params, tok).logits
  bf = forward(cfg.replace(dtype="bfloat16"), params, tok).logits
  assert bf.dtype == jnp.float32 and bool(jnp.isfinite(bf).all())
  assert float(jnp.abs(bf - ref).max()) < 0.1


def test_replay_shape_is_checked(models):
  cfg, params = models["tiny-moe"]
  with pytest.raises(ValueError, match="num_moe_layers"):
    forward(cfg, params, _tokens(cfg), replay_experts=jnp.zeros((1, 2, 12, 2), jnp.int32))


@pytest.mark.parametrize("policy", ["full", "dots_no_batch"])
def test_rematerialization_gives_the_same_gradients(models, policy):
  cfg, params = models["tiny-moe"]
  tok = _tokens(cfg)

  def grads(c):
    return jax.jit(jax.grad(lambda p: _forward(c, p, tok).logits.std()))(params)

  for a, b in zip(jax.tree.leaves(grads(cfg)), jax.tree.leaves(grads(cfg.replace(remat=policy)))):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", MOE)
def test_bad_values_at_padding_never_reach_valid_tokens(models, name):
  """Out-of-vocabulary padding tokens and -1 / E replay ids at padding leave valid tokens alone."""
  cfg, params = models[name]
  tok = _tokens(cfg, 2, 10)
  seg = jnp.array([[1] * 7 + [0] * 3, [1] * 10])
  ref = forward(cfg, params, tok, segment_ids=seg)
  bad_tok = tok.at[0, 7:].set(cfg.vocab_size + 5)
  ids = ref.expert_ids.at[:, 0, 7:].set(-1).at[:, 0, 8:].set(cfg.num_experts)
  out = forward(cfg, params, bad_tok, segment_ids=seg, replay_experts=ids)
  assert bool(jnp.isfinite(out.logits).all())
  np.testing.assert_array_equal(out.logits[0, :7], ref.logits[0, :7])
  np.testing.assert_array_equal(out.logits[1], ref.logits[1])
  dense = forward(cfg.replace(moe_impl="dense"), params, bad_tok, segment_ids=seg, replay_experts=ids)
  np.testing.assert_allclose(dense.logits[0, :7], ref.logits[0, :7], rtol=1e-5, atol=1e-5)


def test_choice_fields_are_validated():
  from recipe_jax.config import ConfigError
  with pytest.raises(ConfigError, match="^moe_impl:"):
    get_preset("tiny-moe").replace(moe_impl="Dense")
  with pytest.raises(ConfigError, match="^family:"):
    get_preset("tiny-moe").replace(family="llama")
  assert get_preset("tiny-moe").replace(dense_layers=[0]).dense_layers == (0,)
