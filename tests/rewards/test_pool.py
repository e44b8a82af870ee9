"""The reward pool: order, parallel workers, timeouts and crashes that do not stop a batch.

This file doubles as a verifier module (`score` below) that the pool's workers import by the
name `test_pool` (pytest puts this directory on sys.path, and workers inherit sys.path).
"""

import os
import time

import pytest

from recipe_jax.rewards import pool
from recipe_jax.rewards.pool import Item, RewardPool
from recipe_jax.rewards.score import Score

VERIFIER = "test_pool"


def score(response: str, reference: str, **options) -> Score:
  """A verifier that misbehaves on request."""
  if response == "sleep":
    time.sleep(600)
  elif response == "abort":
    os.abort()
  elif response == "segfault":
    import ctypes

    ctypes.string_at(0)
  elif response == "exit":
    os._exit(3)
  elif response == "raise":
    raise ValueError("bad input")
  elif response == "not a score":
    return 1.0
  elif response == "pid":
    return Score.correct(pid=os.getpid())
  return Score(float(response == reference), "match" if response == reference else "mismatch",
               {"echo": options.get("echo")})


def test_results_keep_input_order():
  items = [Item(VERIFIER, str(i % 3), "1", {"echo": i}) for i in range(9)]
  scores = pool.score_batch(items, num_workers=3, deadline_s=30)
  assert [s.value for s in scores] == [float(i % 3 == 1) for i in range(9)]
  assert [s.details["echo"] for s in scores] == list(range(9))


def test_workers_run_in_parallel_processes():
  with RewardPool(num_workers=2, deadline_s=30) as rewards:
    pids = {s.details["pid"] for s in rewards.score([Item(VERIFIER, "pid", "")] * 6)}
  assert len(pids) == 2 and os.getpid() not in pids


def test_hang_times_out_and_the_rest_is_scored():
  items = [Item(VERIFIER, "a", "a"), Item(VERIFIER, "sleep", ""), Item(VERIFIER, "b", "b")]
  start = time.monotonic()
  with RewardPool(num_workers=2, deadline_s=2) as rewards:
    scores = rewards.score(items)
    assert rewards.replaced == 1
    again = rewards.score([Item(VERIFIER, "c", "c")])  # the replacement worker works
  assert [s.reason for s in scores] == ["match", "timeout", "match"]
  assert time.monotonic() - start < 20
  assert again[0].value == 1.0


@pytest.mark.parametrize("how", ["abort", "segfault", "exit"])
def test_crash_is_scored_and_the_rest_is_scored(how):
  items = [Item(VERIFIER, how, "")] + [Item(VERIFIER, "x", "x")] * 3
  scores = pool.score_batch(items, num_workers=2, deadline_s=30)
  assert scores[0].value == 0.0 and scores[0].reason.startswith("crash"), scores[0]
  assert [s.reason for s in scores[1:]] == ["match"] * 3


def test_verifier_errors_are_scored_zero():
  scores = pool.score_batch([Item(VERIFIER, "raise", ""), Item(VERIFIER, "not a score", "")])
  assert scores[0].reason == "verifier_error: ValueError: bad input"
  assert scores[1].reason.startswith("verifier_error: TypeError")
  missing = pool.score_batch([Item("recipe_jax.rewards.no_such_verifier", "", "")])
  assert missing[0].reason.startswith("verifier_error: ModuleNotFoundError")


def test_real_verifiers_by_module_path():
  items = [Item("recipe_jax.rewards.code", "```python\ndef f(x):\n  return x + 1\n```",
                {"tests": ["assert f(1) == 2"]}),
           Item("recipe_jax.rewards.code", "```python\ndef f(x):\n  return x\n```",
                {"tests": ["assert f(1) == 2"]}),
           Item("recipe_jax.rewards.math", "The answer is \\boxed{4}.", "4"),
           Item("recipe_jax.rewards.math", "The answer is \\boxed{5}.", "4")]
  assert [s.value for s in pool.score_batch(items, num_workers=2)] == [1.0, 0.0, 1.0, 0.0]


def test_bad_arguments():
  with pytest.raises(ValueError, match="num_workers"):
    RewardPool(num_workers=0)
  with RewardPool(num_workers=1) as rewards, pytest.raises(TypeError, match="pool.Item"):
    rewards.score([("test_pool", "a", "a")])
