"""Counting and ratio instructions of the open multi-constraint sets (IFBench, Pyatkin et al. 2025).

Ids and argument names follow IFBench's registry (arXiv 2507.02833); the meaning of each is
stated in its checker's docstring and in docs/rewards_ifeval.md.
"""

from __future__ import annotations

import re

from recipe_jax.rewards.ifeval import text
from recipe_jax.rewards.ifeval.lexicon import STOP_WORDS
from recipe_jax.rewards.ifeval.spec import Arg, Outcome, instruction

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _range_is_ordered(kwargs: dict) -> str | None:
  if kwargs["min_words"] > kwargs["max_words"]:
    return f"min_words {kwargs['min_words']} > max_words {kwargs['max_words']}"
  return None


def _percentage_in_range(kwargs: dict) -> str | None:
  return None if kwargs["percentage"] <= 100 else f"percentage {kwargs['percentage']} > 100"


@instruction(
  "count:word_count_range", check_args=_range_is_ordered, min_words=Arg("int"), max_words=Arg("int")
)
def word_count_range(response: str, *, min_words: int, max_words: int) -> Outcome:
  """Between `min_words` and `max_words` words inclusive (`\\w+` runs, as length_constraints:number_words)."""
  count = text.count_words(response)
  return Outcome(min_words <= count <= max_words, f"{count} words, need {min_words}..{max_words}")


@instruction("count:unique_word_count", N=Arg("int"))
def unique_word_count(response: str, *, N: int) -> Outcome:  # noqa: N803 (the dataset's argument name)
  """At least `N` distinct words (`text.words`, compared lowercased)."""
  count = len({word.lower() for word in text.words(response)})
  return Outcome(count >= N, f"{count} unique words, need at least {N}")


@instruction("count:numbers", N=Arg("int"))
def numbers(response: str, *, N: int) -> Outcome:  # noqa: N803
  """Exactly `N` numbers: maximal digit runs, where "3.14", "1,000" and "2,5" are one number each."""
  count = len(_NUMBER.findall(response))
  return Outcome(count == N, f"{count} numbers, need exactly {N}")


@instruction("ratio:stop_words", check_args=_percentage_in_range, percentage=Arg("int"))
def stop_words(response: str, *, percentage: int) -> Outcome:
  """English stop words (`lexicon.STOP_WORDS`) are at most `percentage`% of the words; an empty response fails.

  Words are `text.words`, lowercased, with curly apostrophes made straight.
  """
  tokens = [word.lower().replace("\u2019", "'") for word in text.words(response)]
  if not tokens:
    return Outcome(False, "no words")
  share = 100.0 * sum(token in STOP_WORDS for token in tokens) / len(tokens)
  return Outcome(share <= percentage, f"stop words are {share:.1f}% of {len(tokens)} words, need <= {percentage}%")


def _final_mark(sentence: str) -> str:
  """The sentence's last character once closing quotes and brackets are removed, if it is . ? or !"""
  stripped = re.sub(r"[\s\"'\u201d\u2019)\]]+$", "", sentence)
  return stripped[-1] if stripped and stripped[-1] in ".?!" else ""


@instruction("ratio:sentence_type")
def sentence_type(response: str) -> Outcome:
  """Sentences ending in "." are exactly twice those ending in "?", and there is at least one "?".

  Sentences are `text.split_sentences`; the ending is the last character after closing quotes
  and brackets are removed. Exclamations and unterminated lines count as neither.
  """
  endings = [_final_mark(sentence) for sentence in text.split_sentences(response)]
  declarative, interrogative = endings.count("."), endings.count("?")
  ok = interrogative >= 1 and declarative == 2 * interrogative
  return Outcome(ok, f"{declarative} declarative, {interrogative} interrogative; need 2:1")
