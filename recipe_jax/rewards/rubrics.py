"""Rubric rewards: every check must pass (binary, no optional rubrics).

A rubric (the `reference` of `score`) is a list of checks. Each check is one of:

- a callable `check(response) -> bool` (or `(bool, detail)`),
- a mapping `{"check": name, **kwargs}` naming a registered Python check (see `CHECKS`:
  "regex", "contains", "not_contains", "max_words", "min_words", "max_chars", "starts_with",
  "ends_with", "json_object", "lowercase"); register more with `register_check`,
- a mapping `{"judge": question}`: a judge model (judges.py, `CRITERION_TEMPLATE`) answers with a
  JSON score; the check passes when the score is at least `judge_pass_score` (0.5).

The reward is 1.0 "correct" when all pass, else 0.0 with reason
"failed_check: #<index> <description>" naming the first failing check. Checks run in order and
stop at the first failure, so a judge is not asked once a cheap Python check has failed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Sequence

from recipe_jax.rewards import judges
from recipe_jax.rewards.score import Score

CheckFn = Callable[..., Any]
CHECKS: dict[str, CheckFn] = {}


def register_check(name: str) -> Callable[[CheckFn], CheckFn]:
  """Decorator registering `fn(response, **kwargs) -> bool | (bool, detail)` under `name`."""
  def decorate(fn: CheckFn) -> CheckFn:
    if name in CHECKS:
      raise ValueError(f"rubric check {name!r} is already registered")
    CHECKS[name] = fn
    return fn
  return decorate


@register_check("regex")
def _regex(response: str, *, pattern: str, flags: str = "") -> bool:
  """`pattern` matches somewhere (re.search); flags from "i", "m", "s"."""
  value = 0
  for letter in flags:
    value |= {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}[letter]
  return re.search(pattern, response, value) is not None


@register_check("contains")
def _contains(response: str, *, text: str, case_sensitive: bool = False) -> bool:
  if case_sensitive:
    return text in response
  return text.lower() in response.lower()


@register_check("not_contains")
def _not_contains(response: str, *, text: str, case_sensitive: bool = False) -> bool:
  return not _contains(response, text=text, case_sensitive=case_sensitive)


@register_check("max_words")
def _max_words(response: str, *, limit: int) -> tuple[bool, str]:
  words = len(response.split())
  return words <= limit, f"{words} words"


@register_check("min_words")
def _min_words(response: str, *, limit: int) -> tuple[bool, str]:
  words = len(response.split())
  return words >= limit, f"{words} words"


@register_check("max_chars")
def _max_chars(response: str, *, limit: int) -> tuple[bool, str]:
  return len(response) <= limit, f"{len(response)} characters"


@register_check("starts_with")
def _starts_with(response: str, *, text: str) -> bool:
  return response.lstrip().startswith(text)


@register_check("ends_with")
def _ends_with(response: str, *, text: str) -> bool:
  return response.rstrip().endswith(text)


@register_check("json_object")
def _json_object(response: str) -> bool:
  """The whole response (code fences allowed) is one JSON object."""
  text = re.sub(r"^```(?:json)?\s*|\s*```$", "", response.strip())
  try:
    return isinstance(json.loads(text), dict)
  except ValueError:
    return False


@register_check("lowercase")
def _lowercase(response: str) -> bool:
  return response == response.lower()


def describe(check: Any) -> str:
  """A short name of a check for reasons: "max_words(limit=50)", "judge: <question>"."""
  if callable(check):
    return getattr(check, "__name__", type(check).__name__)
  if isinstance(check, Mapping) and "judge" in check:
    return f"judge: {str(check['judge'])[:80]}"
  if isinstance(check, Mapping) and "check" in check:
    arguments = ", ".join(f"{k}={v!r}" for k, v in check.items() if k != "check")
    return f"{check['check']}({arguments})"
  return repr(check)[:80]


def validate(rubric: Sequence[Any]) -> None:
  """Raises ValueError naming the first malformed check of `rubric`."""
  if isinstance(rubric, (str, bytes)) or not isinstance(rubric, Sequence) or not rubric:
    raise ValueError(f"a rubric must be a non-empty list of checks, got {rubric!r}")
  for index, check in enumerate(rubric):
    if callable(check):
      continue
    if not isinstance(check, Mapping):
      raise ValueError(f"rubric check #{index} must be a callable or a mapping, got {check!r}")
    if "judge" in check:
      if set(check) != {"judge"} or not isinstance(check["judge"], str) or not check["judge"]:
        raise ValueError(f"rubric check #{index}: a judge check is {{'judge': question}}, "
                         f"got {check!r}")
    elif check.get("check") not in CHECKS:
      raise ValueError(f"rubric check #{index}: unknown check {check.get('check')!r}; "
                       f"registered: {sorted(CHECKS)}")


def score(response: str, reference: Sequence[Any], *, judge: judges.Generate | None = None,
          judge_pass_score: float = 0.5) -> Score:
  """1.0 when `response` passes every check of the rubric `reference`, else 0.0.

  Args:
    response: the model's response.
    reference: the rubric, a list of checks (see the module docstring).
    judge: the judge model for judge checks (`generate(prompt) -> text`); required when the
      rubric has any.
    judge_pass_score: a judge check passes when the judge's score is at least this.

  Returns:
    Score 1.0 "correct", or 0.0 "failed_check: #i description[: detail]".
  """
  validate(reference)
  if judge is None and any(isinstance(c, Mapping) and "judge" in c for c in reference):
    raise ValueError("the rubric has judge checks but no judge was given (judge=generate)")
  for index, check in enumerate(reference):
    passed, detail = _run_check(check, response, judge, judge_pass_score)
    if not passed:
      reason = f"failed_check: #{index} {describe(check)}"
      return Score.wrong(reason + (f": {detail}" if detail else ""), failed_index=index)
  return Score.correct(checks=len(reference))


def _run_check(check: Any, response: str, judge: judges.Generate | None,
               judge_pass_score: float) -> tuple[bool, str]:
  if isinstance(check, Mapping) and "judge" in check:
    verdict = judges.Judge(judge, template=judges.CRITERION_TEMPLATE)(response,
                                                                      question=check["judge"])
    if verdict.reason == "judge_parse_error":
      return False, "judge_parse_error"
    return verdict.value >= judge_pass_score, f"judge score {verdict.value:g}"
  if callable(check):
    result = check(response)
  else:
    kwargs = {k: v for k, v in check.items() if k != "check"}
    result = CHECKS[check["check"]](response, **kwargs)
  if isinstance(result, tuple):
    passed, detail = result
    return bool(passed), str(detail)
  return bool(result), ""
