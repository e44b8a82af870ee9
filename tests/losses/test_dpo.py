"""dpo_loss (DPO, cDPO, length-normalized DPO, SimPO, IPO) against float64 NumPy transcriptions, plus anchors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.losses import count_pairs, dpo_loss, sequence_logps

LOSSES = ["sigmoid", "length_normalized", "simpo", "ipo"]


def _log_sigmoid(x):
  return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _numpy_dpo(lp, mask, ref, loss_type, beta, eps, gamma, tau, n_pairs):
  """The module docstring's equations, one pair and one token at a time, in float64."""
  lp, mask = np.asarray(lp, np.float64), np.asarray(mask, np.float64)
  total, correct = 0.0, 0.0
  for b in range(lp.shape[0]):
    logp, length = [0.0, 0.0], [0.0, 0.0]
    for p in range(2):
      for t in range(lp.shape[2]):
        logp[p] += lp[b, p, t] * mask[b, p, t]
        length[p] += mask[b, p, t]
    if min(length) == 0:
      continue  # a padding pair
    rho = [logp[p] - float(ref[b, p]) for p in range(2)] if ref is not None else None
    if loss_type == "sigmoid":
      h = beta * rho[0] - beta * rho[1]
      loss = -(1 - eps) * _log_sigmoid(h) - eps * _log_sigmoid(-h)
    elif loss_type == "length_normalized":
      h = beta / length[0] * rho[0] - beta / length[1] * rho[1]
      loss = -_log_sigmoid(h)
    elif loss_type == "simpo":
      h = beta / length[0] * logp[0] - beta / length[1] * logp[1]
      loss = -_log_sigmoid(h - gamma)
    else:
      h = rho[0] / length[0] - rho[1] / length[1]
      loss = (h - 1 / (2 * tau)) ** 2
    total += loss
    correct += h > 0
  return total / n_pairs, correct / n_pairs


def _inputs(seed=0, b=6, t=9):
  rng = np.random.default_rng(seed)
  lp = -rng.gamma(2.0, 0.5, size=(b, 2, t)).astype(np.float32)
  mask = (rng.random((b, 2, t)) < 0.6).astype(np.float32)
  mask[:, :, 0] = 0.0       # the prompt
  mask[:, :, 1] = 1.0       # every real half has a response token
  mask[-1] = 0.0            # the last pair is padding
  ref = (lp * mask).sum(-1) + rng.normal(0, 1.0, size=(b, 2)).astype(np.float32)
  return lp, mask, ref


KW = dict(beta=0.7, gamma=0.3, tau=0.2)


@pytest.mark.parametrize("loss_type,eps", [(name, 0.0) for name in LOSSES] + [("sigmoid", 0.2)])
def test_matches_numpy(loss_type, eps):
  lp, mask, ref = _inputs()
  n = 7.0  # step-global pairs: more than this call holds
  got, m = dpo_loss(jnp.asarray(lp), jnp.asarray(mask), jnp.asarray(ref), loss_type=loss_type,
                    label_smoothing=eps, num_pairs=n, **KW)
  want, acc = _numpy_dpo(lp, mask, ref, loss_type, KW["beta"], eps, KW["gamma"], KW["tau"], n)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(m.reward_accuracy, acc, rtol=1e-6)
  assert float(m.num_pairs) == 5.0


@pytest.mark.parametrize("loss_type", ["sigmoid", "length_normalized"])
def test_policy_equal_to_reference_gives_ln2(loss_type):
  lp, mask, _ = map(jnp.asarray, _inputs(1))
  ref, _ = sequence_logps(lp, mask)  # the reference model is the policy
  loss, m = dpo_loss(lp, mask, ref, loss_type=loss_type, beta=5.0)
  np.testing.assert_allclose(loss, math.log(2.0), rtol=1e-6)
  assert float(m.margin) == 0.0 and float(m.reward_accuracy) == 0.0


def test_ipo_at_reference_is_the_squared_target_margin():
  lp, mask, _ = map(jnp.asarray, _inputs(2))
  loss, _ = dpo_loss(lp, mask, sequence_logps(lp, mask)[0], loss_type="ipo", tau=0.25)
  np.testing.assert_allclose(loss, (1 / (2 * 0.25)) ** 2, rtol=1e-6)


def test_length_normalized_with_equal_lengths_is_dpo_with_beta_over_length():
  rng = np.random.default_rng(3)
  length, beta = 4, 5.0
  lp = jnp.asarray(-rng.gamma(2.0, 0.5, size=(5, 2, 8)), jnp.float32)
  mask = jnp.zeros((5, 2, 8)).at[:, :, 2:2 + length].set(1.0)
  ref = jnp.asarray(rng.normal(-4.0, 1.0, size=(5, 2)), jnp.float32)
  ln, _ = dpo_loss(lp, mask, ref, loss_type="length_normalized", beta=beta)
  plain, _ = dpo_loss(lp, mask, ref, loss_type="sigmoid", beta=beta / length)
  np.testing.assert_allclose(ln, plain, rtol=1e-6)


@pytest.mark.parametrize("loss_type", LOSSES)
def test_gradient_flows_only_through_the_policy(loss_type):
  lp, mask, ref = _inputs(4)
  f = lambda p, r: dpo_loss(p, jnp.asarray(mask), r, loss_type=loss_type, **KW)[0]  # noqa: E731
  g_policy, g_ref = jax.grad(f, argnums=(0, 1))(jnp.asarray(lp), jnp.asarray(ref))
  assert float(jnp.abs(g_ref).max()) == 0.0
  assert float(jnp.abs(g_policy).max()) > 0.0


@pytest.mark.parametrize("loss_type", LOSSES)
def test_masked_tokens_change_neither_loss_nor_gradient(loss_type):
  lp, mask, ref = _inputs(5)
  f = lambda p: dpo_loss(p, jnp.asarray(mask), jnp.asarray(ref), loss_type=loss_type, **KW)[0]  # noqa: E731
  moved = np.where(mask > 0, lp, lp - 9.0)
  np.testing.assert_allclose(f(jnp.asarray(moved)), f(jnp.asarray(lp)), rtol=1e-6)
  g = jax.grad(f)(jnp.asarray(lp))
  assert float(jnp.abs(jnp.where(mask > 0, 0.0, g)).max()) == 0.0


@pytest.mark.parametrize("loss_type", LOSSES)
@pytest.mark.parametrize("splits", [2, 4])
def test_micro_batches_sum_to_the_full_batch(loss_type, splits):
  lp, mask, ref = map(jnp.asarray, _inputs(6, b=8))
  n = count_pairs(mask)
  f = lambda p, m, r: dpo_loss(p, m, r, loss_type=loss_type, num_pairs=n, **KW)  # noqa: E731
  (full, m_full), g_full = jax.value_and_grad(f, has_aux=True)(lp, mask, ref)
  total, acc, grads = 0.0, 0.0, []
  for i in range(splits):
    sl = slice(i * 8 // splits, (i + 1) * 8 // splits)
    (part, m), g = jax.value_and_grad(f, has_aux=True)(lp[sl], mask[sl], ref[sl])
    total, acc = total + part, acc + m.reward_accuracy
    grads.append(g)
  np.testing.assert_allclose(total, full, rtol=1e-6)
  np.testing.assert_allclose(acc, m_full.reward_accuracy, rtol=1e-6)
  np.testing.assert_allclose(jnp.concatenate(grads), g_full, rtol=1e-6, atol=1e-9)


def test_jit_equals_eager_and_bf16_is_finite():
  lp, mask, ref = map(jnp.asarray, _inputs(7))
  f = lambda p: dpo_loss(p, mask, ref, loss_type="length_normalized", beta=5.0)[0]  # noqa: E731
  np.testing.assert_allclose(jax.jit(f)(lp), f(lp), rtol=1e-6)
  out = f(lp.astype(jnp.bfloat16))
  assert out.dtype == jnp.float32 and bool(jnp.isfinite(out))


def test_simpo_needs_no_reference_and_all_padding_gives_zero():
  lp, mask, _ = map(jnp.asarray, _inputs(8))
  loss, _ = dpo_loss(lp, mask, None, loss_type="simpo", beta=2.0, gamma=0.5)
  assert bool(jnp.isfinite(loss))
  empty, m = dpo_loss(lp, jnp.zeros_like(mask), jnp.zeros(lp.shape[:2]), beta=0.1)
  assert float(empty) == 0.0 and float(m.num_pairs) == 0.0


def test_bad_arguments_are_errors():
  lp, mask, ref = map(jnp.asarray, _inputs(9))
  with pytest.raises(ValueError, match="reference"):
    dpo_loss(lp, mask, None, loss_type="sigmoid")
  with pytest.raises(ValueError, match=r"\[B, 2, T\]"):
    dpo_loss(lp[:, :1], mask[:, :1], ref[:, :1])
  with pytest.raises(ValueError, match="loss_type"):
    dpo_loss(lp, mask, ref, loss_type="hinge")
  with pytest.raises(ValueError, match="label_smoothing"):
    dpo_loss(lp, mask, ref, label_smoothing=0.5)
