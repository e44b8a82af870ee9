"""Word-level and sentence-level instructions of the open multi-constraint sets (IFBench).

Ids and argument names follow IFBench's registry (Pyatkin et al. 2025, arXiv 2507.02833).
Shared rules: words are `text.words` (letters/digits with inner apostrophes or hyphens),
compared lowercased; sentences are `text.split_sentences`; a response with no words fails
every check here (an empty answer never satisfies a word constraint vacuously).
"""

from __future__ import annotations

import collections
import re
import string

from recipe_jax.rewards.ifeval import text
from recipe_jax.rewards.ifeval.lexicon import is_verb
from recipe_jax.rewards.ifeval.spec import Arg, Outcome, instruction

_VOWELS = frozenset("aeiou")


def _lower_words(response: str) -> list[str]:
  return [word.lower() for word in text.words(response)]


def _letters(word: str) -> str:
  word = word.lower()
  return word if word.isalpha() else "".join(ch for ch in word if ch.isalpha())


@instruction("words:alphabet")
def alphabet(response: str) -> Outcome:
  """Each word starts with the letter after the previous word's first letter (a-z), wrapping from z to a."""
  tokens = _lower_words(response)
  if not tokens:
    return Outcome(False, "no words")
  for index, word in enumerate(tokens):
    if word[0] not in string.ascii_lowercase:
      return Outcome(False, f"word {index + 1} {word!r} does not start with a letter a-z")
    if index and ord(word[0]) != (ord(tokens[index - 1][0]) - ord("a") + 1) % 26 + ord("a"):
      return Outcome(False, f"word {index + 1} {word!r} breaks the sequence after {tokens[index - 1]!r}")
  return Outcome(True, f"{len(tokens)} words in alphabetical sequence")


@instruction("words:vowel")
def vowel(response: str) -> Outcome:
  """One paragraph (no line break) whose words together use at most three of the vowels a, e, i, o, u."""
  body = response.strip()
  if not text.words(body):
    return Outcome(False, "no words")
  if "\n" in body:
    return Outcome(False, "more than one paragraph (line break found)")
  used = sorted(_VOWELS & set(body.lower()))
  return Outcome(len(used) <= 3, f"vowels used: {''.join(used)}")


@instruction("words:consonants")
def consonants(response: str) -> Outcome:
  """Every word with a letter contains a consonant cluster: two adjacent consonant letters (y counts as a consonant)."""
  tokens = [(word, _letters(word)) for word in text.words(response)]
  tokens = [(word, letters) for word, letters in tokens if letters]
  if not tokens:
    return Outcome(False, "no words")
  for word, letters in tokens:
    if not any(a not in _VOWELS and b not in _VOWELS for a, b in zip(letters, letters[1:])):
      return Outcome(False, f"{word!r} has no consonant cluster")
  return Outcome(True, f"all {len(tokens)} words have a cluster")


@instruction("words:palindrome")
def palindrome(response: str) -> Outcome:
  """At least 10 distinct words of 5 or more letters/digits that read the same backwards (case-insensitive)."""
  found = sorted({word for word in _lower_words(response) if len(word) >= 5 and word == word[::-1]})
  return Outcome(len(found) >= 10, f"{len(found)} distinct palindromes {found[:12]}, need 10")


@instruction("words:last_first")
def last_first(response: str) -> Outcome:
  """At least two sentences, and each sentence's first word equals the previous sentence's last word."""
  sentences = [_lower_words(sentence) for sentence in text.split_sentences(response)]
  sentences = [tokens for tokens in sentences if tokens]
  if len(sentences) < 2:
    return Outcome(False, f"{len(sentences)} sentences with words, need at least 2")
  for index in range(1, len(sentences)):
    if sentences[index][0] != sentences[index - 1][-1]:
      return Outcome(
        False, f"sentence {index + 1} starts with {sentences[index][0]!r}, not {sentences[index - 1][-1]!r}"
      )
  return Outcome(True, f"{len(sentences)} sentences chained")


@instruction("words:paragraph_last_first")
def paragraph_last_first(response: str) -> Outcome:
  """Each paragraph (non-empty line) ends with the word it starts with (case-insensitive)."""
  paragraphs = [tokens for tokens in (_lower_words(line) for line in text.split_lines(response)) if tokens]
  if not paragraphs:
    return Outcome(False, "no words")
  for index, tokens in enumerate(paragraphs):
    if tokens[0] != tokens[-1]:
      return Outcome(False, f"paragraph {index + 1} starts with {tokens[0]!r} but ends with {tokens[-1]!r}")
  return Outcome(True, f"{len(paragraphs)} paragraphs match")


@instruction("words:odd_even_syllables")
def odd_even_syllables(response: str) -> Outcome:
  """At least two words, alternating odd and even syllable counts (`text.count_syllables`)."""
  tokens = [word for word in text.words(response) if _letters(word)]
  if len(tokens) < 2:
    return Outcome(False, f"{len(tokens)} words, need at least 2")
  parities = [text.count_syllables(word) % 2 for word in tokens]
  for index in range(1, len(tokens)):
    if parities[index] == parities[index - 1]:
      return Outcome(False, f"{tokens[index - 1]!r} and {tokens[index]!r} have the same syllable parity")
  return Outcome(True, f"{len(tokens)} words alternate")


@instruction("words:no_consecutive")
def no_consecutive(response: str) -> Outcome:
  """No two consecutive words start with the same letter or digit (case-insensitive)."""
  tokens = _lower_words(response)
  if not tokens:
    return Outcome(False, "no words")
  for index in range(1, len(tokens)):
    if tokens[index][0] == tokens[index - 1][0]:
      return Outcome(False, f"{tokens[index - 1]!r} and {tokens[index]!r} share a first letter")
  return Outcome(True, f"{len(tokens)} words, no repeats of a first letter")


@instruction("words:start_verb")
def start_verb(response: str) -> Outcome:
  """The first word is an English verb form by `lexicon.is_verb` (a listed verb or its regular inflection)."""
  tokens = text.words(response)
  if not tokens:
    return Outcome(False, "no words")
  return Outcome(is_verb(tokens[0]), f"first word {tokens[0]!r}")


@instruction("words:repeats", small_n=Arg("int", minimum=1))
def repeats(response: str, *, small_n: int) -> Outcome:
  """No word occurs more than `small_n` times (case-insensitive)."""
  counts = collections.Counter(_lower_words(response))
  if not counts:
    return Outcome(False, "no words")
  word, count = counts.most_common(1)[0]
  return Outcome(count <= small_n, f"most repeated: {word!r} x{count}, allowed {small_n}")


def _longest_alliteration(tokens: list[str]) -> int:
  """The longest run of consecutive words with the same first character; a lone word is 0."""
  best, run = 0, 1
  for index in range(1, len(tokens)):
    run = run + 1 if tokens[index][0] == tokens[index - 1][0] else 1
    if run >= 2:
      best = max(best, run)
  return best


@instruction("sentence:alliteration_increment")
def alliteration_increment(response: str) -> Outcome:
  """At least two sentences, each with a longer run of consecutive same-initial words than the one before.

  A sentence's run is its longest stretch of consecutive words starting with the same letter
  (0 when no two neighbours share one); runs must strictly increase sentence by sentence.
  """
  runs = [_longest_alliteration(_lower_words(sentence)) for sentence in text.split_sentences(response)]
  if len(runs) < 2:
    return Outcome(False, f"{len(runs)} sentences, need at least 2")
  ok = all(later > earlier for earlier, later in zip(runs, runs[1:]))
  return Outcome(ok, f"alliteration runs per sentence {runs}")


@instruction("sentence:increment", small_n=Arg("int", minimum=1))
def increment(response: str, *, small_n: int) -> Outcome:
  """At least two sentences, each with exactly `small_n` more words than the one before."""
  counts = [len(text.words(sentence)) for sentence in text.split_sentences(response)]
  if len(counts) < 2:
    return Outcome(False, f"{len(counts)} sentences, need at least 2")
  ok = all(later == earlier + small_n for earlier, later in zip(counts, counts[1:]))
  return Outcome(ok, f"words per sentence {counts}, step must be {small_n}")


@instruction("sentence:keyword", word=Arg("str"), N=Arg("int", minimum=1))
def keyword(response: str, *, word: str, N: int) -> Outcome:  # noqa: N803 (the dataset's argument name)
  """The `N`-th sentence (1-based) contains `word` as a whole word (case-insensitive)."""
  sentences = text.split_sentences(response)
  if len(sentences) < N:
    return Outcome(False, f"{len(sentences)} sentences, need at least {N}")
  found = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", sentences[N - 1], re.IGNORECASE) is not None
  return Outcome(found, f"sentence {N} {'contains' if found else 'lacks'} {word!r}")
