"""Rubric rewards: all checks must pass; the reason names the first failing check."""

import pytest

from recipe_jax.rewards import rubrics


class FakeJudge:
  def __init__(self, answers):
    self.answers = list(answers)
    self.prompts = []

  def __call__(self, prompt: str) -> str:
    self.prompts.append(prompt)
    return self.answers.pop(0)


RESPONSE = "Dear team,\nThe launch moved to Friday. Regards"


@pytest.mark.parametrize("check", [
    {"check": "regex", "pattern": r"^Dear"},
    {"check": "regex", "pattern": "friday", "flags": "i"},
    {"check": "contains", "text": "LAUNCH"},
    {"check": "contains", "text": "launch", "case_sensitive": True},
    {"check": "not_contains", "text": "Monday"},
    {"check": "max_words", "limit": 8},
    {"check": "min_words", "limit": 8},
    {"check": "max_chars", "limit": 100},
    {"check": "starts_with", "text": "Dear"},
    {"check": "ends_with", "text": "Regards"},
])
def test_each_registered_check_passes(check):
  assert rubrics.score(RESPONSE, [check]).value == 1.0


@pytest.mark.parametrize("check, reason", [
    ({"check": "regex", "pattern": "friday"}, "failed_check: #0 regex(pattern='friday')"),
    ({"check": "contains", "text": "LAUNCH", "case_sensitive": True},
     "failed_check: #0 contains(text='LAUNCH', case_sensitive=True)"),
    ({"check": "not_contains", "text": "friday"}, "failed_check: #0 not_contains(text='friday')"),
    ({"check": "max_words", "limit": 7}, "failed_check: #0 max_words(limit=7): 8 words"),
    ({"check": "min_words", "limit": 9}, "failed_check: #0 min_words(limit=9): 8 words"),
    ({"check": "max_chars", "limit": 10}, "failed_check: #0 max_chars(limit=10): 46 characters"),
    ({"check": "starts_with", "text": "Hi"}, "failed_check: #0 starts_with(text='Hi')"),
    ({"check": "ends_with", "text": "."}, "failed_check: #0 ends_with(text='.')"),
    ({"check": "json_object"}, "failed_check: #0 json_object()"),
    ({"check": "lowercase"}, "failed_check: #0 lowercase()"),
])
def test_each_registered_check_fails(check, reason):
  result = rubrics.score(RESPONSE, [check])
  assert (result.value, result.reason) == (0.0, reason)


def test_json_and_lowercase_checks():
  assert rubrics.score('```json\n{"a": 1}\n```', [{"check": "json_object"}]).value == 1.0
  assert rubrics.score("[1, 2]", [{"check": "json_object"}]).value == 0.0
  assert rubrics.score("all lower", [{"check": "lowercase"}]).value == 1.0


def test_all_must_pass_and_first_failure_is_named():
  def mentions_friday(response):
    return "Friday" in response

  rubric = [mentions_friday, {"check": "max_words", "limit": 3}, {"check": "contains", "text": "x"}]
  result = rubrics.score(RESPONSE, rubric)
  assert result.reason == "failed_check: #1 max_words(limit=3): 8 words"
  assert result.details == {"failed_index": 1}
  assert rubrics.score(RESPONSE, rubric[:1]).reason == "correct"


def test_callable_may_return_detail():
  rubric = [lambda response: (False, "too cheerful")]
  assert rubrics.score(RESPONSE, rubric).reason == "failed_check: #0 <lambda>: too cheerful"


def test_judge_checks():
  judge = FakeJudge(['{"score": 1}', '{"score": 0, "reason": "rude"}'])
  rubric = [{"judge": "Is the tone polite?"}, {"judge": "Does it apologize?"}]
  result = rubrics.score(RESPONSE, rubric, judge=judge)
  assert result.reason == "failed_check: #1 judge: Does it apologize?: judge score 0"
  assert "Is the tone polite?" in judge.prompts[0] and RESPONSE in judge.prompts[0]


def test_judge_parse_error_fails_the_check():
  result = rubrics.score(RESPONSE, [{"judge": "Polite?"}], judge=FakeJudge(["yes!"]))
  assert result.reason == "failed_check: #0 judge: Polite?: judge_parse_error"


def test_python_check_failure_skips_later_judge():
  judge = FakeJudge([])
  rubric = [{"check": "max_words", "limit": 1}, {"judge": "Polite?"}]
  assert rubrics.score(RESPONSE, rubric, judge=judge).value == 0.0
  assert judge.prompts == []


def test_register_check():
  @rubrics.register_check("test_has_newline")
  def has_newline(response):
    return "\n" in response

  try:
    assert rubrics.score(RESPONSE, [{"check": "test_has_newline"}]).value == 1.0
    with pytest.raises(ValueError, match="already registered"):
      rubrics.register_check("test_has_newline")(has_newline)
  finally:
    del rubrics.CHECKS["test_has_newline"]


@pytest.mark.parametrize("rubric, message", [
    ([], "non-empty list"),
    ("contains", "non-empty list"),
    ([{"check": "nope"}], "#0: unknown check 'nope'"),
    ([{"check": "max_words", "limit": 5}, 42], "#1 must be a callable or a mapping"),
    ([{"judge": ""}], "#0: a judge check"),
    ([{"judge": "q", "extra": 1}], "#0: a judge check"),
])
def test_malformed_rubric(rubric, message):
  with pytest.raises(ValueError, match=message):
    rubrics.score(RESPONSE, rubric)


def test_judge_check_without_judge():
  with pytest.raises(ValueError, match="no judge was given"):
    rubrics.score(RESPONSE, [{"judge": "Polite?"}])
