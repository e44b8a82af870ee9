"""Layout instructions of the open multi-constraint sets (IFBench): format:* and custom:csv_city.

Ids and argument names follow IFBench's registry (Pyatkin et al. 2025, arXiv 2507.02833);
each checker's docstring states exactly what it accepts.
"""

from __future__ import annotations

import csv
import io
import re
import string

from recipe_jax.rewards.ifeval import text
from recipe_jax.rewards.ifeval.spec import Arg, Outcome, instruction

_STAR_BULLET = re.compile(r"^\s*\*\s+\S")
_DASH_BULLET = re.compile(r"^\s*-\s+\S")
_LETTER_CHOICES = re.compile(r"^\W*[aA]\W*[bB]\W*[cC]")
_EDGE = string.punctuation + string.whitespace
CSV_CITY_HEADER = ["ID", "Country", "City", "Year", "Count"]


def parse_options(options: str) -> list[str]:
  """The options in an options string: split at "/", else at the word "or", else at ","."""
  if "/" in options:
    parts = options.split("/")
  elif re.search(r"\bor\b", options):
    parts = re.split(r"\bor\b", options)
  else:
    parts = options.split(",")
  return [part.strip() for part in parts if part.strip()]


@instruction("format:options", options=Arg("str"))
def options_response(response: str, *, options: str) -> Outcome:
  """The response is exactly one of the options, with no explanation.

  Letter choices ("a), b), c)") must match one option character for character (outer whitespace
  ignored); other options ("yes/no/maybe", "I know or I don't know") match case-insensitively
  once punctuation and whitespace at both ends are removed.
  """
  choices = parse_options(options)
  if _LETTER_CHOICES.match(options):
    ok = response.strip() in choices
  else:
    answer = response.strip(_EDGE).lower()
    ok = any(answer == choice.strip(_EDGE).lower() for choice in choices)
  return Outcome(ok, f"answer {response.strip()[:40]!r}, options {choices}")


@instruction("format:newline")
def newline(response: str) -> Outcome:
  """Every word is on its own line: each line holding a word holds exactly one."""
  counts = [len(text.words(line)) for line in response.splitlines()]
  counts = [count for count in counts if count]
  if not counts:
    return Outcome(False, "no words")
  crowded = sum(count > 1 for count in counts)
  return Outcome(crowded == 0, f"{crowded} lines hold more than one word")


def _ends_with_emoji(sentence: str) -> bool:
  stripped = sentence.rstrip(_EDGE + "".join(text.EMOJI_COMPONENTS))
  return bool(stripped) and text.is_emoji(stripped[-1])


def _starts_with_emoji(sentence: str) -> bool:
  stripped = sentence.lstrip(_EDGE)
  return bool(stripped) and text.is_emoji(stripped[0])


@instruction("format:emoji")
def emoji_sentences(response: str) -> Outcome:
  """Every sentence ends with an emoji (before or after its final punctuation).

  An emoji opening the next sentence is read as closing the previous one ("Done. 🎉 Next...").
  """
  sentences = text.split_sentences(response)
  if not sentences:
    return Outcome(False, "no sentences")
  for index, sentence in enumerate(sentences):
    following = sentences[index + 1] if index + 1 < len(sentences) else ""
    if not (_ends_with_emoji(sentence) or _starts_with_emoji(following)):
      return Outcome(False, f"sentence {index + 1} does not end with an emoji: {sentence[-40:]!r}")
  return Outcome(True, f"{len(sentences)} sentences end with an emoji")


@instruction("format:line_indent")
def line_indent(response: str) -> Outcome:
  """Stairs: at least two non-empty lines, each indented strictly more than the previous (tab = 4 spaces)."""
  lines = [line.expandtabs(4) for line in response.splitlines() if line.strip()]
  if len(lines) < 2:
    return Outcome(False, f"{len(lines)} lines, need at least 2")
  indents = [len(line) - len(line.lstrip(" ")) for line in lines]
  ok = all(later > earlier for earlier, later in zip(indents, indents[1:]))
  return Outcome(ok, f"indents {indents[:12]}")


@instruction("format:quote_unquote")
def quote_unquote(response: str) -> Outcome:
  """At least one double-quoted phrase, each followed by a word before the next quote or the end."""
  spans = list(re.finditer(r"\"[^\"]*\"|\u201c[^\u201d]*\u201d", response))
  if not spans:
    return Outcome(False, "no quoted phrase")
  for index, span in enumerate(spans):
    stop = spans[index + 1].start() if index + 1 < len(spans) else len(response)
    if not re.search(r"\w", response[span.end():stop]):
      return Outcome(False, f"quote {span.group()[:40]!r} has no explanation after it")
  return Outcome(True, f"{len(spans)} quotes, each explained")


@instruction("format:list", sep=Arg("str"))
def special_list(response: str, *, sep: str) -> Outcome:
  """A list of at least two items, each a line that starts with the marker `sep` instead of a bullet."""
  marker = sep.strip()
  count = sum(line.strip().startswith(marker) for line in response.splitlines())
  return Outcome(count >= 2, f"{count} lines start with {marker!r}, need at least 2")


@instruction("format:sub-bullets")
def sub_bullets(response: str) -> Outcome:
  """At least one "* " bullet line, and under every one (before the next) at least one "- " sub-bullet line."""
  bullets = 0
  waiting = False
  for line in response.splitlines():
    if _STAR_BULLET.match(line):
      if waiting:
        return Outcome(False, f"bullet {bullets} has no sub-bullet")
      bullets, waiting = bullets + 1, True
    elif _DASH_BULLET.match(line):
      waiting = False
  if not bullets:
    return Outcome(False, "no * bullet")
  note = f"bullet {bullets} has no sub-bullet" if waiting else f"{bullets} bullets, all with sub-bullets"
  return Outcome(not waiting, note)


@instruction("format:no_bullets_bullets")
def no_bullets_bullets(response: str) -> Outcome:
  """At least two sentences ending in "." first, then at least two "* " bullet lines and nothing else.

  Blank lines are allowed anywhere; any other non-bullet line after the first bullet fails.
  """
  lines = response.splitlines()
  first = next((index for index, line in enumerate(lines) if _STAR_BULLET.match(line)), None)
  if first is None:
    return Outcome(False, "no * bullet")
  periods = sum(sentence.rstrip().endswith(".") for sentence in text.split_sentences("\n".join(lines[:first])))
  bullets = [line for line in lines[first:] if line.strip()]
  stray = [line for line in bullets if not _STAR_BULLET.match(line)]
  ok = periods >= 2 and len(bullets) >= 2 and not stray
  return Outcome(ok, f"{periods} sentences before, {len(bullets) - len(stray)} bullets, {len(stray)} stray lines after")


def _deepest_closed_nesting(response: str, pairs: dict[str, str], is_quote: bool = False) -> int:
  """The depth of the deepest properly closed nest of the given opening/closing pairs.

  For brackets, a mismatched closer clears the stack. For quotes (`is_quote`), a quote equal to
  the innermost open quote closes it and any other quote opens a new level.
  """
  stack: list[list] = []  # [closing char, deepest child depth]
  best = 0
  for char in response:
    if stack and char == stack[-1][0]:
      _, child = stack.pop()
      depth = child + 1
      best = max(best, depth)
      if stack:
        stack[-1][1] = max(stack[-1][1], depth)
    elif char in pairs:
      stack.append([pairs[char], 0])
    elif not is_quote and char in pairs.values():
      stack = []
  return best


@instruction("format:parentheses")
def parentheses(response: str) -> Outcome:
  """Brackets ( [ { nested at least 5 levels deep, every level properly closed."""
  depth = _deepest_closed_nesting(response, {"(": ")", "[": "]", "{": "}"})
  return Outcome(depth >= 5, f"deepest closed nesting {depth}, need 5")


_APOSTROPHE = re.compile(r"(?<=[^\W\d_])['\u2019](?=[^\W\d_])")


@instruction("format:quotes")
def nested_quotes(response: str) -> Outcome:
  """Quotes within quotes at least 3 levels deep, alternating double and single quotes, all closed.

  Curly quotes count as straight ones; an apostrophe between two letters ("don't") is not a quote.
  """
  plain = _APOSTROPHE.sub("", response)
  plain = plain.translate(str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"}))
  quotes = "".join(ch for ch in plain if ch in "\"'")
  depth = _deepest_closed_nesting(quotes, {'"': '"', "'": "'"}, is_quote=True)
  return Outcome(depth >= 3, f"deepest closed quote nesting {depth}, need 3")


@instruction("custom:csv_city")
def csv_city(response: str) -> Outcome:
  """Comma-separated CSV: header ID,Country,City,Year,Count and exactly 7 data rows of 5 fields.

  One surrounding ``` or ```csv code fence is allowed; blank lines are ignored; fields may be quoted.
  """
  body = re.sub(r"^```(?:csv)?\s*|\s*```$", "", response.strip(), flags=re.IGNORECASE)
  rows = [row for row in csv.reader(io.StringIO(body), skipinitialspace=True) if any(field.strip() for field in row)]
  if not rows or [field.strip() for field in rows[0]] != CSV_CITY_HEADER:
    return Outcome(False, f"header {rows[0] if rows else None}, need {CSV_CITY_HEADER}")
  widths = [len(row) for row in rows[1:]]
  ok = len(widths) == 7 and all(width == 5 for width in widths)
  return Outcome(ok, f"{len(widths)} data rows with field counts {widths}, need 7 rows of 5")
