"""Judges: a local model asked for a JSON score, and the search agent's partial-credit reward.

A judge is any `generate: Callable[[str], str]` (prompt text -> completion text), so a local
engine, an HTTP client of a served model or a test double all plug in the same way; verifiers
know nothing of models. The judge must answer with a JSON object holding a numeric score field,
e.g. `{"score": 0.5, "reason": "..."}`; text around it and Markdown code fences are tolerated.
An answer without such an object, or with a score outside the declared scale, scores 0 with
reason "judge_parse_error", logged through `logging`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any, Callable, Mapping, Sequence

from recipe_jax.rewards.score import Score

logger = logging.getLogger(__name__)

Generate = Callable[[str], str]

ANSWER_TEMPLATE = """You are grading an answer against a reference answer.

Question:
<<question>>

Reference answer:
<<reference>>

Answer to grade:
<<response>>

Give partial credit between 0 and 1: 1 when the answer is fully correct and agrees with the \
reference, 0 when it is wrong or missing, values in between for partly correct answers.
Reply with one JSON object and nothing else: {"score": <number from 0 to 1>, "reason": "<short>"}
"""

CRITERION_TEMPLATE = """You are checking whether a response satisfies one requirement.

Requirement:
<<question>>

Response:
<<response>>

Reply with one JSON object and nothing else: {"score": 1, "reason": "<short>"} if the \
response satisfies the requirement, {"score": 0, "reason": "<short>"} if it does not.
"""


@dataclasses.dataclass(frozen=True)
class Judge:
  """A local model asked for a JSON score.

  generate: prompt text -> completion text.
  template: prompt with the placeholders <<question>>, <<reference>> and <<response>>.
  score_field: the key of the score in the judge's JSON object.
  scale: (low, high) of the judge's scores; they are mapped linearly to [0, 1]. A score
    outside the scale is a parse error, not clipped.
  """

  generate: Generate
  template: str = ANSWER_TEMPLATE
  score_field: str = "score"
  scale: tuple[float, float] = (0.0, 1.0)

  def __call__(self, response: str, reference: str = "", question: str = "") -> Score:
    prompt = (self.template.replace("<<question>>", question)
              .replace("<<reference>>", reference).replace("<<response>>", response))
    answer = self.generate(prompt)
    if not isinstance(answer, str):
      raise TypeError(f"judge generate() must return str, got {type(answer).__name__}")
    raw = parse_judge_score(answer, score_field=self.score_field)
    low, high = self.scale
    if raw is None or not low <= raw <= high:
      logger.warning("judge_parse_error: no %r in [%g, %g] in judge answer %r",
                     self.score_field, low, high, answer[:300])
      return Score.wrong("judge_parse_error", judge_answer=answer[:300])
    value = (raw - low) / (high - low)
    return Score(value, "judge", {"judge_score": raw})


def parse_judge_score(answer: str, *, score_field: str = "score") -> float | None:
  """The numeric `score_field` of the last JSON object in `answer` that has one, or None.

  Every '{' is tried as the start of a JSON object, so code fences and prose around the
  object do not matter. Booleans, strings, NaN and infinities are not scores.
  """
  decoder = json.JSONDecoder()
  found = None
  position = answer.find("{")
  while position >= 0:
    try:
      obj, end = decoder.raw_decode(answer, position)
    except ValueError:
      position = answer.find("{", position + 1)
      continue
    if isinstance(obj, dict) and score_field in obj:
      value = obj[score_field]
      if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        found = float(value)
    position = answer.find("{", end)
  return found


def score(response: str, reference: str, *, generate: Generate, question: str = "",
          template: str = ANSWER_TEMPLATE, score_field: str = "score",
          scale: tuple[float, float] = (0.0, 1.0)) -> Score:
  """A judge's partial-credit score of `response` against the reference answer `reference`."""
  judge = Judge(generate, template=template, score_field=score_field, scale=scale)
  return judge(response, reference=reference, question=question)


def successful_tool_calls(tool_results: Sequence[Any]) -> int:
  """Counts successes; each item is a bool or a mapping with a bool "ok" field."""
  count = 0
  for index, result in enumerate(tool_results):
    if isinstance(result, Mapping):
      ok = result.get("ok")
    else:
      ok = result
    if not isinstance(ok, bool):
      raise ValueError(f"tool_results[{index}] must be a bool or a mapping with a bool 'ok', "
                       f"got {result!r}")
    count += ok
  return count


def search_agent_reward(response: str, reference: str, *, generate: Generate,
                        tool_results: Sequence[Any], question: str = "",
                        min_successful_tool_calls: int = 2, template: str = ANSWER_TEMPLATE,
                        scale: tuple[float, float] = (0.0, 1.0)) -> Score:
  """The search agent's reward: 0 unless enough tool calls succeeded, otherwise the judge's score.

  Args:
    response: the trajectory's final answer text.
    reference: the gold answer.
    generate: the judge model.
    tool_results: one entry per tool call of the trajectory (bool, or mapping with "ok").
    question: the question, shown to the judge.
    min_successful_tool_calls: successful tool calls needed for any positive reward (2).

  Returns:
    Score 0.0 "too_few_successful_tool_calls: k < n" without calling the judge, or the judge's
    partial-credit Score (reason "judge" or "judge_parse_error").
  """
  successes = successful_tool_calls(tool_results)
  if successes < min_successful_tool_calls:
    return Score.wrong(f"too_few_successful_tool_calls: {successes} < {min_successful_tool_calls}",
                       successful_tool_calls=successes)
  result = score(response, reference, generate=generate, question=question, template=template,
                 scale=scale)
  return Score(result.value, result.reason, {**result.details, "successful_tool_calls": successes})
