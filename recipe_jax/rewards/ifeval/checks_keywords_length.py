"""IFEval's keyword, language and length instructions (Zhou et al. 2023, arXiv 2311.07911).

Argument names and meanings follow the IFEval instruction registry; where this package's
text units differ from NLTK's, the rule is stated in the checker and in `text`.
"""

from __future__ import annotations

import re

from recipe_jax.rewards.ifeval import text
from recipe_jax.rewards.ifeval.language import SUPPORTED_LANGUAGES, detect_language, normalize_language_code
from recipe_jax.rewards.ifeval.spec import Arg, Outcome, compare, instruction


def _single_letter(value: str) -> str:
  letter = value.strip().lower()
  if len(letter) != 1 or not letter.isalpha():
    raise ValueError(f"must be a single letter, got {value!r}")
  return letter


@instruction("keywords:existence", keywords=Arg("str_list"))
def keywords_existence(response: str, *, keywords: list[str]) -> Outcome:
  """Every keyword occurs in the response (case-insensitive substring match)."""
  missing = [word for word in keywords if not re.search(re.escape(word), response, re.IGNORECASE)]
  return Outcome(not missing, f"missing {missing}" if missing else "all keywords present")


@instruction("keywords:frequency", keyword=Arg("str"), frequency=Arg("int"), relation=Arg("relation"))
def keywords_frequency(response: str, *, keyword: str, frequency: int, relation: str) -> Outcome:
  """The keyword occurs `relation` `frequency` times (case-insensitive substring occurrences)."""
  count = len(re.findall(re.escape(keyword), response, re.IGNORECASE))
  return Outcome(compare(count, relation, frequency), f"{keyword!r} occurs {count} times, need {relation} {frequency}")


@instruction("keywords:forbidden_words", forbidden_words=Arg("str_list"))
def keywords_forbidden_words(response: str, *, forbidden_words: list[str]) -> Outcome:
  """None of the forbidden words occurs as a whole word (case-insensitive)."""
  found = [
    word for word in forbidden_words if re.search(rf"\b{re.escape(word)}\b", response, re.IGNORECASE)
  ]
  return Outcome(not found, f"found {found}" if found else "no forbidden word")


@instruction(
  "keywords:letter_frequency",
  letter=Arg("str", normalize=_single_letter),
  let_frequency=Arg("int"),
  let_relation=Arg("relation"),
)
def keywords_letter_frequency(response: str, *, letter: str, let_frequency: int, let_relation: str) -> Outcome:
  """The letter occurs `let_relation` `let_frequency` times (case-insensitive character count)."""
  count = response.lower().count(letter)
  return Outcome(
    compare(count, let_relation, let_frequency), f"{letter!r} occurs {count} times, need {let_relation} {let_frequency}"
  )


@instruction(
  "language:response_language",
  language=Arg("str", normalize=normalize_language_code, choices=SUPPORTED_LANGUAGES),
)
def response_language(response: str, *, language: str) -> Outcome:
  """The whole response is in `language` (ISO 639-1 code), by `language.detect_language`."""
  detected = detect_language(response)
  return Outcome(detected == language, f"detected {detected!r}, need {language!r}")


@instruction("length_constraints:number_sentences", num_sentences=Arg("int"), relation=Arg("relation"))
def number_sentences(response: str, *, num_sentences: int, relation: str) -> Outcome:
  """The number of sentences (`text.split_sentences`) is `relation` `num_sentences`."""
  count = len(text.split_sentences(response))
  return Outcome(compare(count, relation, num_sentences), f"{count} sentences, need {relation} {num_sentences}")


@instruction("length_constraints:number_paragraphs", num_paragraphs=Arg("int", minimum=1))
def number_paragraphs(response: str, *, num_paragraphs: int) -> Outcome:
  """Exactly `num_paragraphs` paragraphs separated by the markdown divider `***`.

  The response is split at `***` (with at most one whitespace character on each side); an
  empty piece at the start or end is ignored, an empty piece in the middle fails.
  """
  pieces = re.split(r"\s?\*\*\*\s?", response)
  count = len(pieces)
  for index, piece in enumerate(pieces):
    if not piece.strip():
      if index in (0, len(pieces) - 1):
        count -= 1
      else:
        return Outcome(False, f"empty paragraph {index + 1} between dividers")
  return Outcome(count == num_paragraphs, f"{count} paragraphs, need {num_paragraphs}")


@instruction("length_constraints:number_words", num_words=Arg("int"), relation=Arg("relation"))
def number_words(response: str, *, num_words: int, relation: str) -> Outcome:
  """The number of words (`\\w+` runs, `text.count_words`) is `relation` `num_words`."""
  count = text.count_words(response)
  return Outcome(compare(count, relation, num_words), f"{count} words, need {relation} {num_words}")


def _first_word(paragraph: str) -> str:
  """The paragraph's first whitespace token, leading quotes removed, cut at . , ? ! ' or \", lowercased."""
  token = paragraph.split()[0].lstrip("'\"\u201c\u2018")
  return re.split(r"[.,?!'\"\u201d\u2019]", token, maxsplit=1)[0].lower()


@instruction(
  "length_constraints:nth_paragraph_first_word",
  num_paragraphs=Arg("int", minimum=1),
  nth_paragraph=Arg("int", minimum=1),
  first_word=Arg("str"),
)
def nth_paragraph_first_word(response: str, *, num_paragraphs: int, nth_paragraph: int, first_word: str) -> Outcome:
  """Exactly `num_paragraphs` blank-line paragraphs; paragraph `nth_paragraph` (1-based) starts with `first_word`.

  Paragraphs are `text.split_paragraphs` blocks; the first word is compared lowercased, after
  leading quotes are removed and the token is cut at its first . , ? ! or quote.
  """
  paragraphs = text.split_paragraphs(response)
  if len(paragraphs) != num_paragraphs:
    return Outcome(False, f"{len(paragraphs)} paragraphs, need {num_paragraphs}")
  if nth_paragraph > len(paragraphs):
    return Outcome(False, f"no paragraph {nth_paragraph}: only {len(paragraphs)}")
  found = _first_word(paragraphs[nth_paragraph - 1])
  wanted = first_word.strip().lower()
  return Outcome(found == wanted, f"paragraph {nth_paragraph} starts with {found!r}, need {wanted!r}")
