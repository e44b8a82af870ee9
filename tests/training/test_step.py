"""The generic train step: micro-batch and mesh invariance, learning, donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.parallel.mesh import make_mesh
from recipe_jax.parallel.sharding import param_shardings
from recipe_jax.stages.sft_objective import SftLossConfig, make_sft_loss, sft_normalizers
from recipe_jax.training import (OptimizerConfig, accumulate_gradients, init_train_state, jit_train_step,
                                 learning_rate_schedule, make_optimizer, make_train_step)


def _batch(cfg, b=8, t=16, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, size=(b, t)).astype(np.int32)
  cut = rng.integers(3, t - 3, size=b)
  seg = np.where(np.arange(t)[None] < cut[:, None], 1, 2).astype(np.int32)
  seg[:, -2:] = 0
  pos = np.zeros_like(seg)
  for i in range(b):
    for j in range(1, t):
      pos[i, j] = 0 if seg[i, j] != seg[i, j - 1] else pos[i, j - 1] + 1
  targets = np.roll(tokens, -1, axis=1)
  last = np.roll(seg, -1, axis=1) != seg
  mask = (rng.random((b, t)) < 0.7) & ~last & (seg > 0)
  return {k: jnp.asarray(v) for k, v in dict(tokens=tokens, targets=targets, segment_ids=seg, positions=pos,
                                               loss_mask=mask.astype(np.float32)).items()}


@pytest.fixture(scope="module")
def setup(tiny_model):
  cfg, params = tiny_model("tiny-moe")
  cfg = cfg.replace(router_aux_loss_coef=0.0)  # the balance loss is nonlinear in the batch
  return cfg, params, _batch(cfg)


def _grads(cfg, params, batch, normalization, n, mesh=None):
  loss_fn = make_sft_loss(cfg, SftLossConfig(normalization=normalization, logprob_chunk_size=8),
                          num_micro_batches=n, mesh=mesh)
  fn = jax.jit(lambda p, b: accumulate_gradients(loss_fn, p, b, sft_normalizers(b), n))
  return fn(params, batch)


def _assert_same_gradients(a_tree, b_tree):
  """Agreement to 1e-5 of each parameter's largest gradient entry (summation order differs)."""
  for a, b in zip(jax.tree.leaves(a_tree), jax.tree.leaves(b_tree)):
    scale = float(jnp.abs(a).max()) or 1.0
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("normalization,splits", [("sum", (4,)), ("token_mean", (4,)), ("sequence_mean", (2, 4))])
def test_gradient_is_the_same_for_1_2_4_micro_batches(setup, normalization, splits):
  cfg, params, batch = setup
  loss1, _, g1 = _grads(cfg, params, batch, normalization, 1)
  for n in splits:
    loss_n, _, gn = _grads(cfg, params, batch, normalization, n)
    np.testing.assert_allclose(loss_n, loss1, rtol=1e-5)
    _assert_same_gradients(g1, gn)


@pytest.mark.parametrize("shape,n", [((1, 2, 2, 2), 2), ((2, 1, 4, 1), 1)], ids=["1x2x2x2", "2x1x4x1"])
def test_gradient_is_the_same_on_meshes(setup, shape, n):
  cfg, params, batch = setup
  _, _, ref = _grads(cfg, params, batch, "token_mean", 1)
  mesh = make_mesh(shape)
  sharded = jax.device_put(params, param_shardings(cfg, params, mesh))
  _, _, got = _grads(cfg, sharded, batch, "token_mean", n, mesh=mesh)
  _assert_same_gradients(ref, got)


def test_steps_reduce_the_loss_and_donate_state(setup):
  cfg, params, batch = setup
  opt_cfg = OptimizerConfig(learning_rate=3e-3, warmup_steps=2, total_steps=20, clip_norm=1.0)
  optimizer = make_optimizer(opt_cfg)
  step = jit_train_step(make_train_step(make_sft_loss(cfg, SftLossConfig("token_mean")), optimizer,
                                        normalizers_fn=sft_normalizers, num_micro_batches=2,
                                        learning_rate_fn=learning_rate_schedule(opt_cfg)))
  state = init_train_state(jax.tree.map(jnp.copy, params), optimizer)
  old = state.params["embed"]
  losses = []
  for _ in range(8):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert old.is_deleted()  # donated
  assert int(state.step) == 8 and losses[-1] < 0.8 * losses[0]
  assert float(metrics["grad_norm"]) > 0 and float(metrics["num_tokens"]) == float(batch["loss_mask"].sum())


def test_learning_rate_schedule_warmup_and_cosine():
  lr = learning_rate_schedule(OptimizerConfig(learning_rate=1.0, warmup_steps=10, total_steps=110))
  np.testing.assert_allclose([lr(0), lr(5), lr(10), lr(60), lr(110)], [0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
