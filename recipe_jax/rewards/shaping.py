"""Reward shaping for responses that hit the length limit: Tülu 3's truncation penalty and DAPO's
soft over-length penalty.

These act on rewards after verification, so they return plain floats / numpy arrays (the shaped
reward can be negative), not `Score`s. Both take scalars or arrays and broadcast.

Truncation penalty (Lambert et al. 2024, "Tülu 3", arXiv 2411.15124, RLVR section): a response
that ended without the end-of-sequence token gets a fixed reward instead of its verifiable
reward,

  r'(y) = r(y)        if y ends with EOS
  r'(y) = r_trunc     otherwise (Tülu 3 uses r_trunc = -10).

Soft over-length punishment (Yu et al. 2025, "DAPO", arXiv 2503.14476, Eq. 13): with the maximum
length L_max and a buffer of L_cache tokens before it, a penalty added to the reward,

  R_length(y) = 0                                     if |y| <= L_max - L_cache
  R_length(y) = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
  R_length(y) = -1                                    if L_max < |y|

so the penalty falls linearly from 0 to -1 across the buffer. DAPO used L_max = 20,480 and
L_cache = 4,096 (16,384 tokens free of penalty).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

TULU3_TRUNCATION_REWARD = -10.0


def truncation_penalty(rewards: npt.ArrayLike, finished: npt.ArrayLike, *,
                       truncated_reward: float = TULU3_TRUNCATION_REWARD) -> np.ndarray:
  """Replaces the reward of every response that has no end-of-sequence token.

  Args:
    rewards: verifiable rewards r(y), any shape.
    finished: True where the response ended with EOS (same shape as rewards, or broadcastable).
    truncated_reward: r_trunc, the reward a truncated response gets instead (Tülu 3: -10).

  Returns:
    float64 array r'(y), broadcast shape of the inputs.

  Example:
    >>> truncation_penalty([1.0, 1.0, 0.0], [True, False, False]).tolist()
    [1.0, -10.0, -10.0]
  """
  rewards = np.asarray(rewards, dtype=np.float64)
  finished = np.asarray(finished)
  if finished.dtype != np.bool_:
    raise TypeError(f"finished must be booleans (EOS seen), got dtype {finished.dtype}")
  return np.where(finished, rewards, np.float64(truncated_reward))


def overlong_penalty(lengths: npt.ArrayLike, *, max_length: int, cache_length: int) -> np.ndarray:
  """DAPO's soft over-length penalty R_length(y) in [-1, 0] (Eq. 13 of arXiv 2503.14476).

  Args:
    lengths: response lengths |y| in tokens, any shape.
    max_length: L_max, the length from which the penalty is -1.
    cache_length: L_cache, the width of the buffer before L_max where the penalty ramps.

  Returns:
    float64 array of penalties, same shape as lengths.

  Example:
    >>> overlong_penalty([100, 150, 175, 200, 250], max_length=200, cache_length=50).tolist()
    [0.0, 0.0, -0.5, -1.0, -1.0]
  """
  if not 0 < cache_length <= max_length:
    raise ValueError(f"need 0 < cache_length <= max_length, got cache_length={cache_length}, "
                     f"max_length={max_length}")
  lengths = np.asarray(lengths, dtype=np.float64)
  if np.any(lengths < 0):
    raise ValueError(f"lengths must be non-negative, got minimum {lengths.min()}")
  free_length = max_length - cache_length
  ramp = (free_length - lengths) / cache_length
  return np.where(lengths <= free_length, 0.0, np.where(lengths <= max_length, ramp, -1.0))


def apply_overlong_penalty(rewards: npt.ArrayLike, lengths: npt.ArrayLike, *, max_length: int,
                           cache_length: int) -> np.ndarray:
  """DAPO's shaped reward r(y) + R_length(y)."""
  return np.asarray(rewards, dtype=np.float64) + overlong_penalty(
      lengths, max_length=max_length, cache_length=cache_length)
