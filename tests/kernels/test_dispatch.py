"""The dispatcher: choices, logged fallbacks, shape errors, and the model with kernels enabled
(interpret mode, with and without a mesh) giving the logits and gradients of plain attention."""

from __future__ import annotations

import logging
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.kernels import dispatch
from recipe_jax.kernels.dispatch import choose_attention_kernel, choose_decode_kernel, decode_attention
from recipe_jax.models import forward, get_preset, init_params
from recipe_jax.models.attention import attention
from recipe_jax.models.config import AttentionImpl
from recipe_jax.parallel.mesh import make_mesh


def test_config_literal_lists_every_dispatcher_impl():
  assert set(typing.get_args(AttentionImpl)) == set(dispatch.IMPLS)
  assert get_preset("tiny-dense").attention_impl == "xla"


def test_choices_and_logged_fallbacks(caplog):
  caplog.set_level(logging.INFO, logger="recipe_jax.kernels")
  q, k = (2, 256, 8, 128), (2, 256, 2, 128)
  assert choose_attention_kernel("pallas_tpu", q, k).kernel == "pallas_tpu"
  assert choose_attention_kernel("pallas_gpu_interpret", q, k) == ("pallas_gpu", True, "attention_impl='pallas_gpu_interpret'")
  assert choose_attention_kernel("auto", q, k).kernel == "xla"  # the tests run on CPU
  assert "auto on cpu" in caplog.text
  caplog.clear()
  choice = choose_attention_kernel("pallas_tpu", (2, 256, 8, 96), (2, 256, 2, 96))
  assert choice.kernel == "xla" and "head dim 96" in choice.reason
  assert any(r.levelno == logging.WARNING and "falls back to xla" in r.message and "head dim 96" in r.message
             for r in caplog.records)
  assert "T == S" in choose_attention_kernel("pallas_gpu", (2, 1, 8, 128), k).reason
  mesh = make_mesh((1, 2, 1, 4))
  assert "batch 3" in choose_attention_kernel("pallas_gpu", (3, 256, 8, 128), (3, 256, 2, 128), mesh=mesh).reason
  assert "K=2" in choose_attention_kernel("pallas_gpu", q, k, mesh=mesh).reason
  assert "multiple of 16" in choose_decode_kernel("pallas_tpu", (2, 8, 128), (2, 100, 2, 128)).reason
  assert choose_decode_kernel("pallas_gpu", (2, 8, 128), (2, 128, 2, 128)).kernel == "pallas_gpu"
  with pytest.raises(ValueError, match="unknown"):
    choose_attention_kernel("flash", q, k)


def test_mismatched_shapes_raise_clear_errors():
  q = jnp.zeros((2, 8, 4, 16))
  kv = jnp.zeros((2, 8, 2, 16))
  ids = jnp.ones((2, 8), jnp.int32)
  for impl in ("xla", "pallas_gpu_interpret"):
    with pytest.raises(ValueError, match=r"k must be \[B=2, S, K, H=16\]"):
      attention(q, jnp.zeros((2, 8, 2, 32)), kv, q_segment_ids=ids, kv_segment_ids=ids, scale=1.0, impl=impl)
    with pytest.raises(ValueError, match="not divisible by K=3"):
      attention(q, jnp.zeros((2, 8, 3, 16)), jnp.zeros((2, 8, 3, 16)), q_segment_ids=ids,
                kv_segment_ids=ids, scale=1.0, impl=impl)
    with pytest.raises(ValueError, match=r"q_segment_ids must be \[B=2, T=8\]"):
      attention(q, kv, kv, q_segment_ids=ids[:, :4], kv_segment_ids=ids, scale=1.0, impl=impl)
  with pytest.raises(ValueError, match=r"lengths must be \[B=2\]"):
    decode_attention(jnp.zeros((2, 4, 16)), kv, kv, jnp.zeros((3,), jnp.int32), scale=1.0)


def _model_loss(cfg, params, tokens, ids, mesh=None):
  """Mean next-token NLL over real (non-padding) targets, and the logits."""
  out = forward(cfg, params, tokens[:, :-1], segment_ids=ids[:, :-1], mesh=mesh)
  logp = jax.nn.log_softmax(out.logits, axis=-1)
  nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
  real = (ids[:, 1:] != 0) & (ids[:, 1:] == ids[:, :-1])
  return jnp.sum(nll * real) / jnp.sum(real), out.logits


def _tokens_and_ids(batch, length):
  tokens = jax.random.randint(jax.random.key(3), (batch, length + 1), 0, 256)
  ids = np.ones((batch, length + 1), np.int32)
  ids[0, 10:] = 2
  ids[0, 30:] = 0  # padding tail
  ids[1, 1:2] = 3  # a single-token segment
  ids[1, 2:] = 4
  return tokens, jnp.asarray(ids)


def _compare_with_xla(cfg, impl, mesh=None):
  params = init_params(cfg, seed=0)
  tokens, ids = _tokens_and_ids(4 if mesh is not None else 2, 40)
  grad = jax.jit(jax.value_and_grad(lambda p, c: _model_loss(c, p, tokens, ids, mesh), has_aux=True),
                 static_argnums=1)
  (loss_x, logits_x), g_x = grad(params, cfg)
  (loss_k, logits_k), g_k = grad(params, cfg.replace(attention_impl=impl))
  real = np.asarray(ids[:, :-1] != 0)
  np.testing.assert_allclose(np.asarray(logits_k)[real], np.asarray(logits_x)[real], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(float(loss_k), float(loss_x), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g_k), jax.tree.leaves(g_x)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", ["pallas_tpu_interpret"])  # the GPU kernel: the mesh test below
def test_model_with_kernels_matches_plain_attention(impl, caplog):
  caplog.set_level(logging.INFO, logger="recipe_jax.kernels")
  cfg = get_preset("tiny-dense").replace(head_dim=64, num_layers=1)
  _compare_with_xla(cfg, impl)
  assert f"{impl.removesuffix('_interpret')} (interpret)" in caplog.text


def test_model_with_kernel_on_a_mesh_runs_it_in_shard_map():
  cfg = get_preset("tiny-dense").replace(head_dim=64, num_layers=1)
  mesh = make_mesh((1, 2, 1, 2))  # batch over fsdp, heads over tensor
  _compare_with_xla(cfg, "pallas_gpu_interpret", mesh=mesh)
  params = init_params(cfg, seed=0)
  tokens, ids = _tokens_and_ids(4, 40)
  with jax.set_mesh(mesh):  # the context mesh, found inside jit
    jaxpr = jax.make_jaxpr(lambda p: _model_loss(cfg.replace(attention_impl="pallas_gpu_interpret"),
                                                 p, tokens, ids)[0])(params)
  assert "shard_map" in str(jaxpr) and "pallas_call" in str(jaxpr)


def test_decode_dispatch_on_a_mesh_matches_reference():
  mesh = make_mesh((1, 2, 1, 2))
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (4, 4, 64))
  k = jax.random.normal(keys[1], (4, 32, 2, 64))
  v = jax.random.normal(keys[2], (4, 32, 2, 64))
  lengths = jnp.asarray([0, 5, 17, 32])
  out = jax.jit(lambda *a: decode_attention(*a, scale=0.125, impl="pallas_tpu_interpret", mesh=mesh))(
      q, k, v, lengths)
  ref = decode_attention(q, k, v, lengths, scale=0.125, impl="xla")
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)
