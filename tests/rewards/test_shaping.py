"""Truncation penalty (Tülu 3) and soft over-length penalty (DAPO) against loop transcriptions."""

import numpy as np
import pytest

from recipe_jax.rewards import shaping


def dapo_reference(length: float, max_length: int, cache_length: int) -> float:
  """Eq. 13 of arXiv 2503.14476, one case at a time."""
  if length <= max_length - cache_length:
    return 0.0
  if length <= max_length:
    return ((max_length - cache_length) - length) / cache_length
  return -1.0


def test_truncation_penalty_replaces_reward():
  out = shaping.truncation_penalty([1.0, 1.0, 0.0, 0.5], [True, False, False, True])
  np.testing.assert_array_equal(out, [1.0, -10.0, -10.0, 0.5])
  assert out.dtype == np.float64


def test_truncation_penalty_configurable_and_broadcasts():
  out = shaping.truncation_penalty(np.ones((2, 3)), np.array([[True], [False]]),
                                   truncated_reward=-1.0)
  np.testing.assert_array_equal(out, [[1, 1, 1], [-1, -1, -1]])


def test_truncation_penalty_rejects_non_boolean_mask():
  with pytest.raises(TypeError, match="finished must be booleans"):
    shaping.truncation_penalty([1.0], [1])


def test_overlong_penalty_matches_equation():
  rng = np.random.default_rng(0)
  max_length, cache_length = 20480, 4096
  lengths = np.concatenate([rng.integers(0, 25000, size=200), [16384, 16385, 20480, 20481, 0]])
  expected = [dapo_reference(float(n), max_length, cache_length) for n in lengths]
  out = shaping.overlong_penalty(lengths, max_length=max_length, cache_length=cache_length)
  np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)


def test_overlong_penalty_anchors():
  out = shaping.overlong_penalty([150, 151, 175, 199, 200, 201], max_length=200, cache_length=50)
  np.testing.assert_allclose(out, [0.0, -0.02, -0.5, -0.98, -1.0, -1.0])


def test_apply_overlong_penalty_adds():
  out = shaping.apply_overlong_penalty([1.0, 1.0], [100, 175], max_length=200, cache_length=50)
  np.testing.assert_allclose(out, [1.0, 0.5])


@pytest.mark.parametrize("max_length, cache_length", [(100, 0), (100, 101), (100, -5)])
def test_overlong_penalty_bad_config(max_length, cache_length):
  with pytest.raises(ValueError, match="cache_length"):
    shaping.overlong_penalty([1], max_length=max_length, cache_length=cache_length)


def test_overlong_penalty_negative_length():
  with pytest.raises(ValueError, match="non-negative"):
    shaping.overlong_penalty([-1], max_length=10, cache_length=5)


def test_composition_truncation_then_overlong():
  rewards = shaping.truncation_penalty([1.0, 1.0], [True, False])
  out = shaping.apply_overlong_penalty(rewards, [175, 250], max_length=200, cache_length=50)
  np.testing.assert_allclose(out, [0.5, -11.0])
