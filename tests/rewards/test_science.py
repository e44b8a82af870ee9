"""Science verifier: exact, numeric, fuzzy and multiple-choice decisions."""

import pytest

from recipe_jax.rewards import science


def boxed(answer: str) -> str:
  return f"Reasoning... final answer: \\boxed{{{answer}}}"


@pytest.mark.parametrize("answer, gold, match", [
    ("Mitochondria", "the mitochondria", "exact"),  # case and articles
    ("\\text{NaCl}", "NaCl", "exact"),
    ("3.5 m", "3.5 m", "exact"),
    ("3.5", "3.5 m", "numbers"),  # a bare number for a quantity with unit
    ("3.5 \\times 10^{4} J", "35000 J", "numbers"),  # scientific notation
    ("3.5e4 J", "35,000 J", "numbers"),
    ("-273.15 °C", "−273.15 °C", "numbers"),  # unicode minus
    ("sodium chloride", "sodium chlorid", "fuzzy"),  # a typo, ratio 96.6 >= 90
])
def test_correct(answer, gold, match):
  result = science.score(boxed(answer), gold)
  assert (result.value, result.reason, result.details["match"]) == (1.0, "correct", match)


@pytest.mark.parametrize("answer, gold, reason", [
    ("35 m", "3.5 m", "numbers_differ"),  # fuzzy-similar text, different magnitude
    ("3.5 m", "3.6 m", "numbers_differ"),
    ("3.5 m", "3.5 m 2 s", "numbers_differ"),  # a number missing
    ("3.5 meters", "3.5 m", "not_equivalent"),  # unit words are compared as text
    ("photosynthesis", "respiration", "not_equivalent"),
    ("mitochondrion", "mitochondria", "not_equivalent"),  # ratio 88 < 90
    ("4 chromosomes", "chromosomes", "numbers_differ"),  # numbers the gold does not have
])
def test_wrong(answer, gold, reason):
  result = science.score(boxed(answer), gold)
  assert (result.value, result.reason) == (0.0, reason), result


def test_threshold_is_configurable():
  assert science.score(boxed("mitochondrion"), "mitochondria", threshold=85).value == 1.0
  assert science.score(boxed("sodium chloride"), "sodium chlorid", threshold=99).value == 0.0


def test_rel_tol_is_configurable():
  assert science.score(boxed("9.8 m/s^2"), "9.81 m/s^2").value == 0.0
  assert science.score(boxed("9.8 m/s^2"), "9.81 m/s^2", rel_tol=0.01).value == 1.0


def test_aliases():
  assert science.score(boxed("NaCl"), ["sodium chloride", "NaCl"]).value == 1.0
  assert science.score(boxed("KCl"), ["sodium chloride", "NaCl"]).value == 0.0


@pytest.mark.parametrize("answer", ["B", "(B)", "B) 42 J", "B.", "Option B", "\\text{B}", "b"])
def test_choice_letter_correct(answer):
  assert science.score(boxed(answer), "B").reason == "correct"
  assert science.score(boxed(answer), "(B)").value == 1.0


@pytest.mark.parametrize("answer, reason", [
    ("C", "wrong_choice"), ("(A) 12 J", "wrong_choice"),
    ("Because it is", "unparseable: no option letter in the answer"),
    ("A cat", "unparseable: no option letter in the answer"),  # an article, not option A
])
def test_choice_letter_wrong(answer, reason):
  result = science.score(boxed(answer), "B")
  assert (result.value, result.reason) == (0.0, reason)


def test_choice_by_option_text():
  choices = ["12 J", "42 J", "7 J"]
  assert science.score(boxed("42 J"), "B", choices=choices).details["match"] == "choice_text"
  assert science.score(boxed("7 J"), "B", choices=choices).reason == "wrong_choice"


def test_unboxed_responses():
  assert science.score("The answer is 3.5 m", "3.5 m").reason == "no_boxed_answer"
  assert science.score("3.5 m", "3.5 m", require_boxed=False).value == 1.0
  assert science.score("I think the answer is (B).", "B", require_boxed=False).value == 1.0
  assert science.score("\\boxed{3.5", "3.5").reason.startswith("unparseable")


@pytest.mark.parametrize("bad", ["", "  ", [], ["x", ""], 3])
def test_bad_reference(bad):
  with pytest.raises(ValueError, match="science reference"):
    science.score(boxed("x"), bad)


def test_numbers_parsing():
  assert science.numbers("1,000.5 kg and 2e-3 s and 6.02 x 10^{23}") == [1000.5, 0.002, 6.02e23]
