"""group_advantages against float64 NumPy loops, plus the identities between the modes."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.losses.advantages import group_advantages


def _numpy_advantages(rewards, mode, ddof, eps):
  r = np.asarray(rewards, np.float64)
  out = np.zeros_like(r)
  for g in range(r.shape[0]):
    size = r.shape[1]
    mu = sum(r[g]) / size
    sigma = math.sqrt(sum((x - mu) ** 2 for x in r[g]) / (size - ddof)) if mode == "normalized" else 0.0
    for i in range(size):
      if mode == "normalized":
        out[g, i] = (r[g, i] - mu) / (sigma + eps)
      elif mode == "mean_only":
        out[g, i] = r[g, i] - mu
      else:
        out[g, i] = r[g, i] - sum(r[g, j] for j in range(size) if j != i) / (size - 1)
  return out


def _rewards(seed=0, groups=5, size=8):
  rng = np.random.default_rng(seed)
  rewards = rng.normal(0.0, 1.0, size=(groups, size))
  rewards[0] = (rng.random(size) < 0.5).astype(np.float64)  # a binary-reward group
  rewards[1] = 1.0                                            # all correct: no signal
  return rewards


@pytest.mark.parametrize("mode,ddof,eps", [("normalized", 1, 1e-6), ("normalized", 0, 1e-8),
                                           ("normalized", 1, 0.25), ("mean_only", 1, 1e-6),
                                           ("leave_one_out", 1, 1e-6)])
@pytest.mark.parametrize("as_jax", [False, True])
def test_matches_numpy(mode, ddof, eps, as_jax):
  rewards = _rewards()
  got = group_advantages(jnp.asarray(rewards) if as_jax else rewards, mode=mode, std_ddof=ddof, eps=eps)
  assert got.dtype == jnp.float32 and got.shape == rewards.shape
  np.testing.assert_allclose(got, _numpy_advantages(rewards, mode, ddof, eps), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["normalized", "mean_only", "leave_one_out"])
def test_equal_rewards_give_zero_and_advantages_sum_to_zero(mode):
  adv = group_advantages(_rewards(1), mode=mode)
  assert float(jnp.abs(adv[1]).max()) == 0.0
  np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-5)


def test_leave_one_out_is_a_rescaled_mean_only():
  rewards = _rewards(2, size=4)
  np.testing.assert_allclose(group_advantages(rewards, mode="leave_one_out"),
                             4 / 3 * group_advantages(rewards, mode="mean_only"), rtol=1e-5, atol=1e-7)


def test_binary_group_anchor():
  """Rewards [1, 0, 0, 1]: mu = 0.5, sample std = sqrt(1/3), population std = 0.5."""
  rewards = [[1.0, 0.0, 0.0, 1.0]]
  np.testing.assert_allclose(group_advantages(rewards, mode="normalized", std_ddof=0, eps=0.0),
                             [[1.0, -1.0, -1.0, 1.0]], rtol=1e-6)
  np.testing.assert_allclose(group_advantages(rewards, mode="normalized", std_ddof=1, eps=0.0),
                             [[math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2]],
                             rtol=1e-6)
  np.testing.assert_allclose(group_advantages(rewards, mode="leave_one_out"), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]],
                             rtol=1e-6)


def test_single_response_groups():
  rewards = np.array([[0.3], [1.0]])
  np.testing.assert_allclose(group_advantages(rewards, mode="mean_only"), 0.0)
  np.testing.assert_allclose(group_advantages(rewards, mode="normalized", std_ddof=0), 0.0)
  with pytest.raises(ValueError, match="std_ddof 1 needs 0 <= std_ddof < G = 1"):
    group_advantages(rewards, mode="normalized", std_ddof=1)
  with pytest.raises(ValueError, match="leave_one_out needs at least 2 responses per group, got G = 1"):
    group_advantages(rewards, mode="leave_one_out")


@pytest.mark.parametrize("kwargs,message", [
    (dict(mode="zscore"), "advantage mode 'zscore'"), (dict(eps=-1.0), "eps must be >= 0"),
    (dict(std_ddof=-1), "std_ddof -1"),
])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    group_advantages(_rewards(), **kwargs)
  with pytest.raises(ValueError, match=r"rewards must be \[num_groups, G\], got shape \(8,\)"):
    group_advantages(np.zeros(8))
