"""Science verifier: normalized exact match, then numbers, then fuzzy text match.

`score(response, reference)` takes the final `\\boxed{...}` of the response (or, with
`require_boxed=False` and no box, the whole response) and compares it with the gold answer:

1. Multiple choice: when the reference is one option letter ("B", "(B)", "B."), the answer's
   option letter must be the same letter ("B", "(B)", "B) 42 J", "Option B", "\\text{B}"); with
   `choices` (the option texts in letter order) the exact text of the right option also counts.
   No fuzzy matching for letters.
2. Normalized exact match: lower case, NFKC, LaTeX text wrappers and `$` removed, punctuation
   outside numbers dropped, articles dropped, whitespace collapsed.
3. Numbers: when the reference contains numbers, the answer must contain the same numbers in
   the same order, each within `rel_tol` relatively ("3.5 m" vs "35 m" fails here, whatever
   the text similarity; "3.5e4", "3.5 \\times 10^{4}" and "35000" are the same number).
   The remaining words (units) must then be missing from the answer or fuzzy-match.
4. Fuzzy match: rapidfuzz's `fuzz.ratio` of the normalized strings >= `threshold` (0-100).
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Sequence

from rapidfuzz import fuzz

from recipe_jax.rewards import math as math_verifier
from recipe_jax.rewards.score import Score

DEFAULT_THRESHOLD = 90.0
DEFAULT_REL_TOL = 1e-6
_LETTERS = "ABCDEFGHIJ"
_NUMBER = re.compile(
    r"[-−]?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)"
    r"(?:\s*(?:e|E)\s*([-+−]?\d+)|\s*(?:\\times|×|x|\*)\s*10\s*\^\s*\{?\s*([-+−]?\d+)\s*\}?)?")
_REFERENCE_LETTER = re.compile(r"^\(?([A-J])[).:]?$")
# "B", "(B)", "B)", "B.", "B: text", "Option B", "answer is (B)"; not "Because" or "A cat".
_ANSWER_LETTER = re.compile(
    r"^(?:(?:option|choice|answer)(?:\s+is)?\s*:?\s*)?(?:\(([A-J])\)|([A-J])(?=[.:)]|$))",
    re.IGNORECASE)
_ARTICLES = {"a", "an", "the"}


def score(response: str, reference: str | Sequence[str], *, threshold: float = DEFAULT_THRESHOLD,
          rel_tol: float = DEFAULT_REL_TOL, choices: Sequence[str] | None = None,
          require_boxed: bool = True) -> Score:
  """Scores the final answer of `response` against the gold answer(s) `reference`.

  Args:
    response: the model's full response text.
    reference: the gold answer ("3.5 m", "mitochondria", "B"), or a list of accepted aliases
      (any one matching is enough).
    threshold: fuzzy-match threshold, rapidfuzz ratio from 0 to 100.
    rel_tol: relative tolerance for each number (|a - b| <= rel_tol * max(|a|, |b|)).
    choices: for multiple choice, the option texts in order A, B, C, ...
    require_boxed: if False, a response without a box is compared as a whole.

  Returns:
    Score 1.0 "correct" (details say how it matched), or 0.0 "no_boxed_answer",
    "unparseable: ...", "wrong_choice", "numbers_differ" or "not_equivalent".
  """
  references = [reference] if isinstance(reference, str) else reference
  if (not isinstance(references, (list, tuple)) or not references
      or not all(isinstance(r, str) and r.strip() for r in references)):
    raise ValueError(f"science reference must be a non-empty string or list of them, "
                     f"got {reference!r}")
  answer, status = math_verifier.extract_boxed(response)
  if status == "unclosed":
    return Score.wrong("unparseable: final \\boxed is not closed (truncated)")
  if status == "none":
    if require_boxed:
      return Score.wrong("no_boxed_answer")
    answer = response
  failures = [_match(answer, gold, threshold, rel_tol, choices) for gold in references]
  for result in failures:
    if result.value == 1.0:
      return result
  return failures[0]


def normalize(text: str) -> str:
  """Lower-cased, NFKC, LaTeX wrappers and punctuation (outside numbers) removed."""
  text = unicodedata.normalize("NFKC", text)
  text = re.sub(r"\\(?:text|textbf|textit|mathrm|mathbf|operatorname|mbox)\s*\{([^{}]*)\}",
                r"\1", text)
  text = text.replace("$", " ").replace("\\,", " ").replace("~", " ").lower()
  text = re.sub(r"(?<!\d)[.,](?!\d)|[!?;:\"'`()\[\]{}]", " ", text)
  words = [w for w in text.split() if w not in _ARTICLES]
  return " ".join(words)


def numbers(text: str) -> list[float]:
  """The numbers written in `text`, in order, with scientific notation applied."""
  values = []
  for match in _NUMBER.finditer(unicodedata.normalize("NFKC", text)):
    mantissa = re.match(r"[-−]?[\d,.]+", match.group(0)).group(0)
    value = float(mantissa.replace("−", "-").replace(",", ""))
    exponent = match.group(1) or match.group(2)
    if exponent:
      value *= 10.0 ** int(exponent.replace("−", "-"))
    values.append(value)
  return values


def _match(answer: str, gold: str, threshold: float, rel_tol: float,
           choices: Sequence[str] | None) -> Score:
  letter = _REFERENCE_LETTER.match(gold.strip())
  if letter:
    return _match_choice(answer, letter.group(1), choices)
  answer_norm, gold_norm = normalize(answer), normalize(gold)
  if not answer_norm:
    return Score.wrong("unparseable: empty answer")
  if answer_norm == gold_norm:
    return Score.correct(match="exact")
  gold_numbers = numbers(gold)
  if gold_numbers:
    answer_numbers = numbers(answer)
    if len(answer_numbers) != len(gold_numbers) or not all(
        math.isclose(a, g, rel_tol=rel_tol, abs_tol=0.0)
        for a, g in zip(answer_numbers, gold_numbers)):
      return Score.wrong("numbers_differ", answer_numbers=answer_numbers[:10],
                         gold_numbers=gold_numbers)
    answer_words, gold_words = _without_numbers(answer), _without_numbers(gold)
    if not answer_words or answer_words == gold_words:
      return Score.correct(match="numbers")
    similarity = fuzz.ratio(answer_words, gold_words)
    if similarity >= threshold:
      return Score.correct(match="numbers_fuzzy_units", similarity=similarity)
    return Score.wrong("not_equivalent", similarity=similarity)
  if numbers(answer):
    return Score.wrong("numbers_differ", answer_numbers=numbers(answer)[:10], gold_numbers=[])
  similarity = fuzz.ratio(answer_norm, gold_norm)
  if similarity >= threshold:
    return Score.correct(match="fuzzy", similarity=similarity)
  return Score.wrong("not_equivalent", similarity=similarity)


def _without_numbers(text: str) -> str:
  return normalize(_NUMBER.sub(" ", unicodedata.normalize("NFKC", text)))


def _match_choice(answer: str, gold_letter: str, choices: Sequence[str] | None) -> Score:
  stripped = re.sub(r"\\(?:text|textbf|mathrm)\s*\{([^{}]*)\}", r"\1", answer).strip()
  found = _ANSWER_LETTER.match(stripped)
  if found:
    chosen = (found.group(1) or found.group(2)).upper()
    if chosen == gold_letter:
      return Score.correct(match="choice")
    return Score.wrong("wrong_choice", chosen=chosen, gold=gold_letter)
  stated = re.findall(r"\banswer(?:\s+is)?\s*:?\s*\(?([A-J])\)?(?![A-Za-z])", stripped)
  if stated:  # "... so the answer is (B)." in an unboxed response: the last statement counts
    chosen = stated[-1]
    return (Score.correct(match="choice") if chosen == gold_letter
            else Score.wrong("wrong_choice", chosen=chosen, gold=gold_letter))
  if choices:
    by_text = {normalize(c): _LETTERS[i] for i, c in enumerate(choices)}
    chosen = by_text.get(normalize(answer))
    if chosen is not None:
      return (Score.correct(match="choice_text") if chosen == gold_letter
              else Score.wrong("wrong_choice", chosen=chosen, gold=gold_letter))
  return Score.wrong("unparseable: no option letter in the answer", gold=gold_letter)
