"""Judge JSON parsing, scale mapping, parse failures and the search agent's tool-call gate."""

import logging

import pytest

from recipe_jax.rewards import judges


class FakeJudge:
  """A `generate` test double: returns a fixed answer and records the prompts."""

  def __init__(self, answer: str):
    self.answer = answer
    self.prompts = []

  def __call__(self, prompt: str) -> str:
    self.prompts.append(prompt)
    return self.answer


@pytest.mark.parametrize("answer, expected", [
    ('{"score": 0.7, "reason": "mostly"}', 0.7),
    ('Sure! ```json\n{"score": 1, "reason": "ok"}\n``` hope it helps', 1.0),
    ('I think {"reason": "no score here"} then {"score": 0.25}', 0.25),
    ('{"score": 0.2} ... revised: {"score": 0.9}', 0.9),  # the last object counts
    ('{"outer": {"score": 0.4}}', None),  # only top-level objects
    ('{"score": "high"}', None), ('{"score": true}', None), ('{"score": NaN}', None),
    ("score: 1", None), ('{"score": 1', None), ("", None),
])
def test_parse_judge_score(answer, expected):
  assert judges.parse_judge_score(answer) == expected


def test_judge_prompt_and_score():
  fake = FakeJudge('{"score": 0.5}')
  result = judges.score("Paris, I think", "Paris", generate=fake, question="Capital of France?")
  assert (result.value, result.reason) == (0.5, "judge")
  assert "Capital of France?" in fake.prompts[0] and "Paris, I think" in fake.prompts[0]
  assert "<<" not in fake.prompts[0]


def test_scale_maps_to_unit_interval_and_rejects_outside():
  assert judges.score("r", "g", generate=FakeJudge('{"score": 7}'), scale=(0, 10)).value == 0.7
  assert judges.score("r", "g", generate=FakeJudge('{"score": 1.5}')).reason == "judge_parse_error"


def test_parse_error_logged_and_zero(caplog):
  with caplog.at_level(logging.WARNING, logger="recipe_jax.rewards.judges"):
    result = judges.score("r", "g", generate=FakeJudge("I refuse to answer in JSON."))
  assert (result.value, result.reason) == (0.0, "judge_parse_error")
  assert "judge_parse_error" in caplog.text


def test_custom_score_field():
  fake = FakeJudge('{"rating": 1}')
  assert judges.score("r", "g", generate=fake, score_field="rating").value == 1.0


def test_non_string_generation_is_an_error():
  with pytest.raises(TypeError, match="must return str"):
    judges.score("r", "g", generate=lambda prompt: None)


@pytest.mark.parametrize("tool_results, expected", [
    ([True, True], 0.8),
    ([{"ok": True}, {"ok": False}, {"ok": True, "output": "..."}], 0.8),
    ([True, False, False], 0.0),
    ([], 0.0),
])
def test_search_agent_reward_gate(tool_results, expected):
  fake = FakeJudge('{"score": 0.8}')
  result = judges.search_agent_reward("\\boxed{Paris}", "Paris", generate=fake,
                                      tool_results=tool_results)
  assert result.value == expected
  if expected == 0.0:
    assert result.reason.startswith("too_few_successful_tool_calls")
    assert fake.prompts == []  # the judge is not asked
  else:
    assert result.details["successful_tool_calls"] == 2


def test_search_agent_reward_parse_error_is_zero():
  result = judges.search_agent_reward("a", "b", generate=FakeJudge("??"),
                                      tool_results=[True, True, True])
  assert (result.value, result.reason) == (0.0, "judge_parse_error")


@pytest.mark.parametrize("bad", [[1], [{"ok": "yes"}], [{"error": None}], ["ok"]])
def test_bad_tool_results(bad):
  with pytest.raises(ValueError, match=r"tool_results\[0\]"):
    judges.search_agent_reward("a", "b", generate=FakeJudge("{}"), tool_results=bad)
