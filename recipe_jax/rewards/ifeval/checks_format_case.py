"""IFEval's content, format, combination, start/end, case and punctuation instructions.

Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models", arXiv 2311.07911:
argument names and meanings follow its instruction registry.
"""

from __future__ import annotations

import json
import re

from recipe_jax.rewards.ifeval import text
from recipe_jax.rewards.ifeval.language import detect_language
from recipe_jax.rewards.ifeval.spec import Arg, Outcome, compare, instruction

CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
TWO_RESPONSES_SEPARATOR = "******"


def _count_bracket_spans(line: str) -> int:
  """Non-overlapping "[" ... first following "]" spans in one line (IFEval's `\\[.*?\\]`, in linear time)."""
  count, position = 0, 0
  while (start := line.find("[", position)) != -1 and (end := line.find("]", start + 1)) != -1:
    count, position = count + 1, end + 1
  return count


@instruction("detectable_content:number_placeholders", num_placeholders=Arg("int"))
def number_placeholders(response: str, *, num_placeholders: int) -> Outcome:
  """At least `num_placeholders` square-bracket placeholders such as [address] (shortest `[...]` spans)."""
  count = sum(_count_bracket_spans(line) for line in response.split("\n"))
  return Outcome(count >= num_placeholders, f"{count} placeholders, need at least {num_placeholders}")


@instruction("detectable_content:postscript", postscript_marker=Arg("str"))
def postscript(response: str, *, postscript_marker: str) -> Outcome:
  """A line holds the postscript marker followed by text, case-insensitive.

  "P.S." also matches "p. s."; "P.P.S" also matches "p. p. s"; any other marker matches literally.
  """
  marker = postscript_marker.strip()
  if marker == "P.P.S":
    pattern = r"p\.\s?p\.\s?s.*$"
  elif marker == "P.S.":
    pattern = r"p\.\s?s\..*$"
  else:
    pattern = re.escape(marker.lower()) + r".*$"
  found = re.search(pattern, response.lower(), re.MULTILINE) is not None
  return Outcome(found, f"postscript {marker!r} {'found' if found else 'missing'}")


@instruction("detectable_format:number_bullet_lists", num_bullets=Arg("int"))
def number_bullet_lists(response: str, *, num_bullets: int) -> Outcome:
  """Exactly `num_bullets` markdown bullet lines: lines starting with "* " (not "**") or "-"."""
  stars = re.findall(r"^\s*\*[^\*].*$", response, re.MULTILINE)
  dashes = re.findall(r"^\s*-.*$", response, re.MULTILINE)
  count = len(stars) + len(dashes)
  return Outcome(count == num_bullets, f"{count} bullets, need exactly {num_bullets}")


@instruction("detectable_format:constrained_response")
def constrained_response(response: str) -> Outcome:
  """The response contains one of "My answer is yes.", "My answer is no.", "My answer is maybe."."""
  found = [option for option in CONSTRAINED_RESPONSES if option in response.strip()]
  return Outcome(bool(found), f"found {found[0]!r}" if found else "no allowed answer phrase")


@instruction("detectable_format:number_highlighted_sections", num_highlights=Arg("int"))
def number_highlighted_sections(response: str, *, num_highlights: int) -> Outcome:
  """At least `num_highlights` markdown highlights: non-empty *text* or **text** spans within one line."""
  single = [span for span in re.findall(r"\*[^\n\*]*\*", response) if span.strip("*").strip()]
  double = [span for span in re.findall(r"\*\*[^\n\*]*\*\*", response) if span.strip("*").strip()]
  count = len(single) + len(double)
  return Outcome(count >= num_highlights, f"{count} highlighted sections, need at least {num_highlights}")


@instruction("detectable_format:multiple_sections", section_spliter=Arg("str"), num_sections=Arg("int"))
def multiple_sections(response: str, *, section_spliter: str, num_sections: int) -> Outcome:
  """At least `num_sections` sections, each opened by the splitter word and a number ("SECTION 1").

  The splitter is matched case-sensitively, followed by optional whitespace and digits.
  """
  pattern = r"\s?" + re.escape(section_spliter.strip()) + r"\s?\d+\s?"
  count = len(re.split(pattern, response)) - 1
  return Outcome(count >= num_sections, f"{count} sections, need at least {num_sections}")


@instruction("detectable_format:json_format")
def json_format(response: str) -> Outcome:
  """The whole response parses as JSON, optionally inside one ``` or ```json code fence."""
  body = response.strip()
  body = re.sub(r"^```(?:json)?", "", body, flags=re.IGNORECASE)
  body = re.sub(r"```$", "", body).strip()
  try:
    json.loads(body)
  except ValueError as error:
    return Outcome(False, f"not JSON: {error}")
  except RecursionError:
    return Outcome(False, "not JSON: nested too deeply to parse")
  return Outcome(True, "valid JSON")


@instruction("detectable_format:title")
def title(response: str) -> Outcome:
  """A title in double angular brackets, <<like this>>, with non-blank text on one line."""
  titles = [found for found in re.findall(r"<<[^\n]+>>", response) if found.lstrip("<").rstrip(">").strip()]
  return Outcome(bool(titles), f"title {titles[0]!r}" if titles else "no <<title>>")


@instruction("combination:two_responses")
def two_responses(response: str) -> Outcome:
  """Exactly two different non-empty responses separated by six asterisks "******".

  An empty piece before the first or after the last separator is ignored; one in between fails.
  """
  pieces = response.split(TWO_RESPONSES_SEPARATOR)
  kept = []
  for index, piece in enumerate(pieces):
    if piece.strip():
      kept.append(piece.strip())
    elif index not in (0, len(pieces) - 1):
      return Outcome(False, "empty response between separators")
  if len(kept) != 2:
    return Outcome(False, f"{len(kept)} responses, need 2")
  return Outcome(kept[0] != kept[1], "two different responses" if kept[0] != kept[1] else "the two responses are equal")


@instruction("combination:repeat_prompt", prompt_to_repeat=Arg("str"))
def repeat_prompt(response: str, *, prompt_to_repeat: str) -> Outcome:
  """The response starts with the prompt, repeated word for word (case-insensitive, outer whitespace ignored)."""
  ok = response.strip().lower().startswith(prompt_to_repeat.strip().lower())
  return Outcome(ok, "starts with the prompt" if ok else "does not start with the prompt")


@instruction("startend:end_checker", end_phrase=Arg("str"))
def end_checker(response: str, *, end_phrase: str) -> Outcome:
  """The response ends with `end_phrase` (case-insensitive; outer whitespace and double quotes ignored)."""
  ending = response.strip().strip('"').lower()
  ok = ending.endswith(end_phrase.strip().lower())
  return Outcome(ok, f"ends with {ending[-len(end_phrase) - 10:]!r}")


@instruction("startend:quotation")
def quotation(response: str) -> Outcome:
  """The whole response (outer whitespace ignored) is wrapped in double quotation marks."""
  body = response.strip()
  ok = len(body) > 1 and body[0] == '"' and body[-1] == '"'
  return Outcome(ok, "wrapped in double quotes" if ok else "not wrapped in double quotes")


@instruction("change_case:capital_word_frequency", capital_frequency=Arg("int"), capital_relation=Arg("relation"))
def capital_word_frequency(response: str, *, capital_frequency: int, capital_relation: str) -> Outcome:
  """The number of all-uppercase `text.words` is `capital_relation` `capital_frequency`."""
  count = sum(word.isupper() for word in text.words(response))
  return Outcome(
    compare(count, capital_relation, capital_frequency),
    f"{count} capital words, need {capital_relation} {capital_frequency}",
  )


@instruction("change_case:english_capital")
def english_capital(response: str) -> Outcome:
  """The response is in English and has no lowercase letter (and at least one cased letter)."""
  language = detect_language(response.lower())
  ok = response.isupper() and language == "en"
  return Outcome(ok, f"isupper={response.isupper()}, language={language!r}")


@instruction("change_case:english_lowercase")
def english_lowercase(response: str) -> Outcome:
  """The response is in English and has no uppercase letter (and at least one cased letter)."""
  language = detect_language(response)
  ok = response.islower() and language == "en"
  return Outcome(ok, f"islower={response.islower()}, language={language!r}")


@instruction("punctuation:no_comma")
def no_comma(response: str) -> Outcome:
  """The response contains no ASCII comma ","."""
  count = response.count(",")
  return Outcome(count == 0, f"{count} commas")
