"""Logic puzzles: reasoning-gym records and their checkers run in the sandbox."""

import json

import pytest

from recipe_jax.rewards import puzzles

# Light and heavy imports, checkers that eval() the answer (n_queens, spiral_matrix) or the
# reference (number_sorting), sympy-based checkers, and gsm_symbolic, whose module cannot be
# imported on its own (the runner falls back to importing all of reasoning-gym).
DATASETS = ["n_queens", "spiral_matrix", "basic_arithmetic", "number_sorting",
            "simple_equations", "gsm_symbolic", "word_sorting"]


@pytest.fixture(scope="module")
def records():
  return [r for name in DATASETS for r in puzzles.generate(name, seed=11, size=2)]


def _answer(text: str) -> str:
  return f"Let me think.\n<answer>{text}</answer>"


def test_records_are_json_and_deterministic(records):
  assert json.loads(json.dumps(records)) == records
  again = puzzles.generate("n_queens", seed=11, size=2)
  assert again == records[:2]
  assert puzzles.generate("n_queens", seed=12, size=2)[0]["question"] != records[0]["question"]
  first = records[0]
  assert first["id"] == "n_queens/11/0"
  assert first["reference"]["module"] == "reasoning_gym.games.n_queens"


def test_generator_answers_score_one_and_wrong_answers_zero(records):
  references = [r["reference"] for r in records]
  right = puzzles.score_many([_answer(str(r["answer"])) for r in references], references)
  assert [(s.value, s.reason) for s in right] == [(1.0, "correct")] * len(records)
  wrong = puzzles.score_many([_answer("definitely not it")] * len(records), references)
  assert [s.value for s in wrong] == [0.0] * len(records)
  assert {s.reason.split(":")[0] for s in wrong} <= {"wrong_answer", "checker_error"}


def test_single_score_and_extraction(records):
  reference = records[4]["reference"]  # basic_arithmetic
  assert puzzles.score(_answer(reference["answer"]), reference).value == 1.0
  assert puzzles.score(reference["answer"], reference).reason == "no_answer"
  assert puzzles.score(f"  {reference['answer']} ", reference, extract="raw").value == 1.0
  assert puzzles.extract_answer("<answer>a</answer> then <answer> b </answer>") == "b"


def test_partial_credit_is_not_a_reward(records):
  reference = records[4]["reference"]  # basic_arithmetic: the answer inside more text scores
  result = puzzles.score(_answer(reference["answer"] + " or so"), reference)  # len ratio
  assert result.value == 0.0 and 0.0 < result.details["checker_score"] < 1.0


def test_tampered_or_malformed_reference_raises(records):
  tampered = dict(records[0]["reference"], answer="not what the generator made")
  with pytest.raises(ValueError, match="regenerated answer differs"):
    puzzles.score(_answer("x"), tampered)
  with pytest.raises(ValueError, match="lacks"):
    puzzles.score(_answer("x"), {"dataset": "n_queens"})
  with pytest.raises(ValueError, match="unknown reasoning-gym dataset"):
    puzzles.generate("no_such_puzzle", seed=0, size=1)


def test_sandbox_unavailable_unless_fallback(records):
  reference = records[4]["reference"]
  missing = puzzles.score(_answer(reference["answer"]), reference, bwrap="/nonexistent/bwrap")
  assert missing.reason == "sandbox_unavailable"
  fallback = puzzles.score(_answer(reference["answer"]), reference, bwrap="/nonexistent/bwrap",
                           fallback=True)
  assert (fallback.value, fallback.reason) == (1.0, "correct: rlimits fallback")
