"""Isolation (deadline, memory limit, crashes, threads) and adversarial math answers.

Every hostile answer must score 0 within its deadline (plus a small margin for the fork and
the reply) and leave the verifier usable.
"""

import os
import threading
import time

import pytest

from recipe_jax.rewards import isolation
from recipe_jax.rewards import math as math_verifier

DEADLINE_S = 1.0
MARGIN_S = 1.5  # fork, reply and a loaded CI machine


def square(x):
  return x * x


def parent_pid():
  return os.getppid()


@pytest.fixture(scope="module", autouse=True)
def warm_zygote():
  # The first call starts a zygote and imports sympy and math-verify (outside any deadline);
  # run it once so the timings below measure calls, not the start.
  assert math_verifier.score("\\boxed{1}", "1").value == 1.0


# ---- isolation -------------------------------------------------------------------------------

def test_returns_the_value_of_a_module_level_function():
  outcome = isolation.run_isolated(square, 7)
  assert (outcome.status, outcome.value) == ("ok", 49)
  assert isolation.call_isolated(square, x=3) == 9


def test_calls_fork_from_a_persistent_zygote():
  first = isolation.call_isolated(parent_pid)
  second = isolation.call_isolated(parent_pid)
  assert first == second != os.getpid()


def test_timeout_kills_the_call():
  start = time.monotonic()
  outcome = isolation.run_isolated(time.sleep, 60, timeout_s=0.3)
  assert outcome.status == "timeout"
  assert time.monotonic() - start < 0.3 + MARGIN_S
  assert isolation.call_isolated(square, 2) == 4  # the zygote survives


def test_memory_limit_is_a_crash_not_a_caller_failure():
  outcome = isolation.run_isolated(bytearray, 8 << 30, memory_limit_bytes=1 << 30)
  assert outcome.status == "crash" and "MemoryError" in outcome.detail


def test_signal_death_is_a_crash():
  outcome = isolation.run_isolated(os.abort)
  assert outcome.status == "crash" and "SIGABRT" in outcome.detail


def test_exception_is_reported_with_its_type():
  outcome = isolation.run_isolated(int, "not a number")
  assert outcome.status == "error" and outcome.detail.startswith("ValueError")
  with pytest.raises(isolation.IsolatedCallFailed, match="ValueError"):
    isolation.call_isolated(int, "not a number")


def test_concurrent_calls_from_threads_overlap():
  outcomes = []
  threads = [threading.Thread(target=lambda: outcomes.append(
      isolation.run_isolated(time.sleep, 0.5, timeout_s=5))) for _ in range(3)]
  start = time.monotonic()
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert [o.status for o in outcomes] == ["ok"] * 3
  assert time.monotonic() - start < 3 * 0.5 + 1.0  # not serialized behind one zygote


def test_bad_timeout_is_an_error():
  with pytest.raises(ValueError, match="timeout_s"):
    isolation.run_isolated(square, 1, timeout_s=0)


# ---- adversarial math answers ----------------------------------------------------------------

HOSTILE = {
    "tower_of_exponents": "9^{9^{9^{9}}}",
    "power_tower_of_twos": "2^{2^{2^{2^{2^{2}}}}}",
    "huge_power": "10^{10^{9}}",
    "huge_factorial": "(10^{10})!",
    "deep_parentheses": "(" * 300 + "1" + ")" * 300,
    "deep_fractions": "\\frac{1}{" * 300 + "2" + "}" * 300,
    "deep_roots": "\\sqrt{" * 400 + "2" + "}" * 400,
    "long_sum": "+".join(["1"] * 2000),
}


@pytest.fixture(scope="module")
def warm_checker():
  """Starts the isolated checker once, outside the timed calls (integer answers never start it)."""
  assert math_verifier.score("\\boxed{\\frac{1}{2}}", "0.5").value == 1.0


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_answer_is_contained(name, warm_checker):
  start = time.monotonic()
  result = math_verifier.score(f"\\boxed{{{HOSTILE[name]}}}", "3", timeout_s=DEADLINE_S,
                               max_answer_chars=100_000)
  elapsed = time.monotonic() - start
  assert result.value == 0.0
  assert result.reason.split(":")[0] in ("timeout", "crash", "not_equivalent", "unparseable")
  assert elapsed < DEADLINE_S + MARGIN_S, (name, result, elapsed)


def test_hostile_gold_side_is_contained_too():
  result = math_verifier.score("\\boxed{3}", "(10^{10})!", timeout_s=DEADLINE_S)
  assert (result.value, result.reason) == (0.0, "timeout")


def test_very_long_answer_is_rejected_without_parsing():
  start = time.monotonic()
  result = math_verifier.score("\\boxed{" + "1+" * 500_000 + "1}", "3")
  assert result.reason == "unparseable: answer longer than 1000 characters"
  assert time.monotonic() - start < 0.5


def test_very_long_response_extraction_is_linear():
  start = time.monotonic()
  assert math_verifier.score("{" * 2_000_000 + " so \\boxed{3}", "3").value == 1.0
  assert math_verifier.score("\\boxed{" + "{" * 2_000_000, "3").reason.startswith("unparseable")
  assert time.monotonic() - start < 3.0


def test_verifier_still_works_after_hostile_inputs():
  math_verifier.score("\\boxed{(10^{10})!}", "3", timeout_s=0.3)
  assert math_verifier.score("\\boxed{\\frac{2}{4}}", "0.5").value == 1.0
