"""Math verifier: boxed-answer extraction and every decision of the equivalence policy."""

import threading

import pytest

from recipe_jax.rewards import math as math_verifier


def boxed(answer: str) -> str:
  return f"Some reasoning first. So the final answer is $\\boxed{{{answer}}}$."


# ---- extraction (pure Python, no child process) ----------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("\\boxed{3}", ("3", "ok")),
    ("first \\boxed{1} then \\boxed{2}", ("2", "ok")),  # the last box wins
    ("\\boxed{\\frac{1}{2}}", ("\\frac{1}{2}", "ok")),  # nested braces
    ("\\boxed{\\{1,2\\}}", ("\\{1,2\\}", "ok")),  # escaped braces do not nest
    ("\\boxed{1} and later \\fbox{7}", ("7", "ok")),
    ("\\boxed 5.", ("5", "ok")),  # without braces: one token
    ("\\boxed{\\boxed{4}}", ("4", "ok")),
    ("no box here", ("", "none")),
    ("\\boxed{1} then \\boxed{\\frac{1}{2", ("", "unclosed")),  # truncated final box
    ("\\boxed", ("", "unclosed")),
])
def test_extract_boxed(text, expected):
  assert math_verifier.extract_boxed(text) == expected


@pytest.mark.parametrize("reference, expected", [
    ("3", "3"), (12, "12"), ("$\\frac{1}{2}$", "\\frac{1}{2}"), ("\\boxed{x=3}", "x=3"),
    ("50\\%", "50"),
])
def test_normalize_reference(reference, expected):
  assert math_verifier.normalize_reference(reference) == expected


@pytest.mark.parametrize("bad", ["", "  ", "$$", 1.5, None, True])
def test_bad_reference_is_a_clear_error(bad):
  with pytest.raises((ValueError, TypeError), match="math reference"):
    math_verifier.score(boxed("1"), bad)


@pytest.mark.parametrize("response, reason", [
    ("The answer is 3.", "no_boxed_answer"),
    ("\\boxed{1} so \\boxed{\\frac{1}{2", "unparseable: final \\boxed is not closed (truncated)"),
    ("\\boxed{}", "unparseable: empty box"),
    ("\\boxed{(1,2}", "unparseable: unbalanced brackets"),
    ("\\boxed{" + "1+" * 600 + "1}", "unparseable: answer longer than 1000 characters"),
])
def test_rejected_before_parsing(response, reason):
  result = math_verifier.score(response, "3")
  assert (result.value, result.reason) == (0.0, reason)


# ---- the equivalence policy ------------------------------------------------------------------

EQUAL = [
    # plain forms
    ("3", "3"), ("\\frac{1}{2}", "1/2"), ("\\dfrac12", "\\frac{1}{2}"), ("1,000", "1000"),
    ("x^2+2x+1", "(x+1)^2"), ("\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}"),
    # exact numbers: a decimal literal is the fraction it denotes
    ("0.5", "\\frac{1}{2}"), ("1.5", "\\frac32"), ("0.1", "\\frac{1}{10}"), ("3.140", "3.14"),
    ("\\frac{1}{2004!}", "\\frac{1}{2004!}"), ("\\log_2 8", "3"), ("\\sqrt{16}", "4"),
    # two irrational closed forms of the same value
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt{6}}"),
    # relations: an assignment to one variable unwraps, on either side
    ("x = 3", "3"), ("3", "x = 3"), ("x=3", "x = 3"),
    # one-variable inequality == its solution set, either side
    ("x<2", "(-\\infty,2)"), ("(-\\infty, 2)", "x<2"), ("1<x<2", "(1,2)"),
    ("(-\\infty,2)\\cup(3,\\infty)", "x<2 \\text{ or } x>3"),
    # sets: braces or a bare list, any order; a one-element set equals its element
    ("2,1", "\\{1,2\\}"), ("\\{2, 1\\}", "1, 2"), ("\\{3\\}", "3"),
    # tuples in order, intervals with the same ends and openness
    ("(2,1)", "(2,1)"), ("(1,2,3)", "(1, 2, 3)"), ("[0,\\tfrac12)", "[0,0.5)"),
    # percent signs are ignored, text answers, letters, matrices, complex numbers
    ("50\\%", "50"), ("50", "50\\%"), ("\\text{Monday}", "\\text{Monday}"), ("A", "A"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("1+2i", "1+2i"),
]

NOT_EQUAL = [
    ("4", "3"), ("-3", "3"), ("\\frac{1}{3}", "\\frac{1}{2}"),
    # no float tolerance against an exact gold
    ("0.1000004", "0.1"), ("0.333333", "\\frac{1}{3}"), ("\\frac{1}{2006!}", "\\frac{1}{2004!}"),
    ("0.50001", "\\frac12"),
    # a rational (decimal) never equals an irrational gold
    ("0.866025", "\\frac{\\sqrt{3}}{2}"), ("3.14", "\\pi"), ("1.41421356237", "\\sqrt{2}"),
    # relations
    ("2x=6", "3"), ("y=3", "x=3"), ("x<2", "(-\\infty,2]"), ("x>2", "(-\\infty,2)"),
    # sets and tuples
    ("(1,2)", "\\{1,2\\}"), ("\\{1,2,3\\}", "\\{1,2\\}"), ("(3,1)", "(2,1)"),
    ("(1,2,3)", "(3,2,1)"), ("[1,2]", "(1,2)"), ("\\{1,2\\}", "1"),
    # other
    ("B", "A"), ("x^2+1", "(x+1)^2"), ("\\text{Tuesday}", "\\text{Monday}"),
]


@pytest.mark.parametrize("answer, gold", EQUAL)
def test_equal(answer, gold):
  result = math_verifier.score(boxed(answer), gold)
  assert (result.value, result.reason) == (1.0, "correct"), result


@pytest.mark.parametrize("answer, gold", NOT_EQUAL)
def test_not_equal(answer, gold):
  result = math_verifier.score(boxed(answer), gold)
  assert result.value == 0.0 and result.reason.startswith("not_equivalent"), result


@pytest.mark.parametrize("answer", ["2+", "\\frac{1}{}", "x^"])
def test_unparseable_answer_never_equal(answer):
  result = math_verifier.score(boxed(answer), "2")
  assert (result.value, result.reason) == (0.0, "unparseable: math-verify cannot parse the answer")


def test_reason_details_carry_answer_and_time():
  result = math_verifier.score(boxed("\\frac{1}{2}"), "0.5")
  assert result.details["answer"] == "\\frac{1}{2}"
  assert 0.0 < result.details["seconds"] < math_verifier.DEFAULT_TIMEOUT_S


def test_works_from_threads():
  # math-verify's own timeout (SIGALRM) fails outside the main thread; ours does not.
  results = {}

  def check(index, answer):
    results[index] = math_verifier.score(boxed(answer), "\\frac{1}{2}").value

  threads = [threading.Thread(target=check, args=(i, a)) for i, a in enumerate(["0.5", "0.6"])]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert results == {0: 1.0, 1: 0.0}
