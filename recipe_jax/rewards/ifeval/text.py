"""Splitting text into words, sentences, paragraphs and syllables, without NLTK data.

Every instruction checker measures text through these functions, so their rules are the
package's definition of a "word", a "sentence" and a "paragraph":

- `word_tokens`: maximal runs of word characters (`\\w+`: letters, digits, underscore, any
  script). "don't" is two tokens and "3.5" is two, as in IFEval's word counter.
- `words`: words as a reader sees them: a run of letters/digits that may contain inner
  apostrophes or hyphens ("don't", "well-known" are one word each).
- `split_sentences`: a line break always ends a sentence (markdown items and headings are
  units of their own). Inside a line, a sentence ends after `.`, `!`, `?` or `…` (one or
  more, then any closing quotes or brackets) when whitespace follows and the next
  character is not a lowercase letter. It does not end:
    - after a known abbreviation ("e.g.", "i.e.", "Dr.", "Mr.", "vs.", "approx.", ...; see
      `ABBREVIATIONS`), except "etc." before a capitalised word;
    - after a single capital letter (initials: "J. K. Rowling");
    - after "No." / "no." followed by a digit ("No. 5");
    - inside a number ("3.14") or a web address ("example.com"), since no whitespace follows.
  An ellipsis followed by a lowercase word does not end the sentence. A fragment that holds
  only a list marker ("1.", "b)", "-", "*") joins the sentence after it; a fragment with no
  word character at all ("...", "!!!", "***") joins the one before it.
- `split_paragraphs`: blocks separated by one or more blank lines.
- `count_syllables`: a spelling heuristic for English (see its docstring).
"""

from __future__ import annotations

import functools
import re

ABBREVIATIONS = frozenset(
  """
  mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e a.m p.m cf al approx dept est
  fig figs inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec
  u.s u.k u.n e.u ph.d b.a m.a b.sc m.sc gen col capt lt sgt rev hon gov sen rep
  ave blvd rd no nos vol vols pp ch sec eq eqs viz ca op ed eds
  """.split()
)

_TERMINATOR = re.compile(r"([.!?\u2026]+)([\"'\u201d\u2019)\]]*)(\s+)")
_WORD_TOKEN = re.compile(r"\w+")
# Letters and digits, plus the combining marks of the scripts that write vowels as marks
# (Indic, Thai, Hebrew/Arabic points, Latin/Cyrillic combining accents), so "हिंदी" is one word.
# Underscores are turned into spaces before matching, so `\w` here means letters and digits.
_MARKS = (
  "\u0300-\u036F\u0483-\u0489\u0591-\u05C7\u0610-\u061A\u064B-\u065F\u0670"
  "\u0900-\u0963\u0966-\u0DFF\u0E31-\u0E4E"
)
_WORD = re.compile(rf"[\w{_MARKS}]+(?:['\u2019\-][\w{_MARKS}]+)*")
_BLANK_LINE = re.compile(r"\n[ \t]*\n\s*")
_LIST_MARKER_ONLY = re.compile(r"^(?:\d{1,3}|[A-Za-z]|[ivxlcIVXLC]{1,5})[.)]$|^[-*+\u2022]$")
_LAST_TOKEN = re.compile(r"(\S+)$")


def word_tokens(text: str) -> list[str]:
  """Maximal `\\w+` runs: IFEval's unit for word counts ("don't" -> "don", "t")."""
  return _WORD_TOKEN.findall(text)


def count_words(text: str) -> int:
  """The number of `word_tokens`."""
  return len(word_tokens(text))


def words(text: str) -> list[str]:
  """Words with inner apostrophes and hyphens kept ("don't", "well-known"); no punctuation."""
  return _WORD.findall(text.replace("_", " "))


def split_paragraphs(text: str) -> list[str]:
  """Non-empty blocks separated by blank lines, each stripped."""
  return [block.strip() for block in _BLANK_LINE.split(text) if block.strip()]


def split_lines(text: str) -> list[str]:
  """Non-empty lines, each stripped."""
  return [line.strip() for line in text.splitlines() if line.strip()]


def _ends_sentence(before: str, terminator: str, after: str) -> bool:
  """Whether a terminator between `before` and `after` (the text after the whitespace) ends a sentence."""
  if not after:
    return True
  if after[0].islower():
    return False
  if terminator != ".":
    return True
  match = _LAST_TOKEN.search(before)
  last = match.group(1).lower().lstrip("([\"'\u201c\u2018") if match else ""
  if last == "etc":
    return True
  if last in ABBREVIATIONS:
    return last in ("no", "nos") and not after[0].isdigit()
  if len(last) == 1 and last.isalpha() and before[-1].isupper():
    return False
  return True


def _split_line(line: str) -> list[str]:
  pieces, start = [], 0
  for match in _TERMINATOR.finditer(line):
    after = line[match.end():]
    if _ends_sentence(line[start:match.start()], match.group(1), after):
      pieces.append(line[start:match.end()].strip())
      start = match.end()
  tail = line[start:].strip()
  if tail:
    pieces.append(tail)
  return pieces


def split_sentences(text: str) -> list[str]:
  """Sentences by the rules in the module docstring, each stripped, none empty."""
  raw: list[str] = []
  for line in text.splitlines():
    if line.strip():
      raw.extend(_split_line(line.strip()))
  sentences: list[list[str]] = []
  pending_markers: list[str] = []
  for piece in raw:
    if _LIST_MARKER_ONLY.match(piece):
      pending_markers.append(piece)
      continue
    if not _WORD_TOKEN.search(piece) and sentences and not pending_markers:
      sentences[-1].append(piece)
      continue
    sentences.append(pending_markers + [piece])
    pending_markers = []
  if pending_markers:
    sentences.append(pending_markers)
  return [" ".join(parts) for parts in sentences]


_VOWEL_GROUP = re.compile(r"[aeiouy]+")
_EXTRA_SYLLABLE = re.compile(r"(?<![cstx])i[ao]|[aeiouy]ing$|eo$|(?<![qg])u[ao]")
_SILENT_ENDING = re.compile(r"(?:[^aeiouylt]e|[^aeioucgszxh]es|[^aeioutd]ed)$")


@functools.lru_cache(maxsize=65536)
def count_syllables(word: str) -> int:
  """English syllables by spelling: vowel groups, corrected for common patterns.

  Count groups of consecutive vowels (a, e, i, o, u, y); subtract one for a silent ending
  ("make", "makes", "jumped": a final -e / -es / -ed after a consonant that does not make its
  own syllable; a consonant + "le" ending keeps its syllable: "table"); add one for vowel
  pairs usually spoken as two ("piano", "lion" but not "nation"; "being", "going"; a final
  "eo" as in "video"; "dual", "duo" but not "quality", "guard"). Every word with a letter has
  at least one syllable; a word with no letter has zero. Accuracy is that of a heuristic (most
  common words right; names and loanwords often off by one).
  """
  letters = "".join(ch for ch in word.lower() if ch.isalpha())
  if not letters:
    return 0
  count = len(_VOWEL_GROUP.findall(letters))
  if len(letters) > 3 and _SILENT_ENDING.search(letters):
    count -= 1
  count += len(_EXTRA_SYLLABLE.findall(letters))
  return max(1, count)


# Emoji: the Unicode blocks whose characters are (almost all) emoji with default emoji or
# text presentation; components (variation selector, zero-width joiner, skin tones, keycap)
# are not emoji on their own.
_EMOJI_RANGES = (
  (0x1F000, 0x1F0FF), (0x1F18E, 0x1F1FF), (0x1F200, 0x1F2FF), (0x1F300, 0x1F3FA),
  (0x1F400, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F7E0, 0x1F7FF), (0x1F900, 0x1F9FF),
  (0x1FA70, 0x1FAFF), (0x2600, 0x27BF), (0x2B05, 0x2B07), (0x2B1B, 0x2B1C), (0x2B50, 0x2B55),
  (0x231A, 0x231B), (0x23E9, 0x23FA), (0x2934, 0x2935), (0x3030, 0x3030), (0x303D, 0x303D),
  (0x3297, 0x3299), (0x2194, 0x21AA),
)
EMOJI_COMPONENTS = frozenset(chr(c) for c in (0xFE0F, 0xFE0E, 0x200D, 0x20E3, *range(0x1F3FB, 0x1F400)))


def is_emoji(char: str) -> bool:
  """Whether one character is an emoji (by code point block; see `_EMOJI_RANGES`)."""
  if len(char) != 1:
    return False
  code = ord(char)
  return any(low <= code <= high for low, high in _EMOJI_RANGES)
