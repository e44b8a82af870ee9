"""Record validators from the Rufus-Air SFT recipe, and the report that counts what they drop.

Each validator takes a `Conversation` and returns a reason string (one of
`REASONS`) or None. `validate` runs them in a fixed order and returns the first
reason. `valid_conversations` reads raw records, drops every record that fails
to normalize or validate, and counts each drop in a `PipelineReport` (the
pipeline's own report: counts per source and reason, and the first few record
indices of each). A run prints `report.table()`. With `strict=True` the first
invalid record raises `InvalidRecordError` instead. Nothing is dropped without
being counted. `sft_example_fn` packages the same steps as an `example_fn` for
`recipe_jax.data.pipeline`, whose own report then counts the drops.

The rules:

- `unbalanced_reasoning_tags`: assistant text or reasoning still holds a
  `<think>` or `</think>` after the reader split off a leading reasoning block
  (a stray, repeated or misplaced tag); or, in other roles, the tags do not
  pair up in order.
- `invalid_role_transition`: the order of roles is not system? user
  (assistant (user | tool+ assistant)...)...: a system message anywhere but
  first, a conversation not opening with a user turn, two user or two
  assistant turns in a row, a user turn right after tool results, or a
  conversation not ending with an assistant turn.
- `tool_result_without_call`: a tool message that does not answer a tool call
  of the assistant turn before it (more results than calls, or a
  `tool_call_id` that names no call of that turn).
- `unanswered_tool_call`: an assistant turn with tool calls not followed by
  at least one tool result.
- `no_supervised_assistant`: under the chosen loss-mask policy no assistant
  token would carry loss (see `recipe_jax.data.chat_template`).
- `malformed_record` (from `valid_conversations` only): the reader raised
  `RecordError`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from recipe_jax.data.chat_template import RENDERERS, supervised_turns
from recipe_jax.data.errors import DropRecord, PipelineReport
from recipe_jax.data.readers import RecordError, normalize
from recipe_jax.data.schema import THINK_CLOSE, THINK_OPEN, Conversation, last_user_index

REASONS = ("malformed_record", "unbalanced_reasoning_tags", "invalid_role_transition",
           "tool_result_without_call", "unanswered_tool_call", "no_supervised_assistant")


def _tags_paired(text: str) -> bool:
  depth = 0
  for i in range(len(text)):
    if text.startswith(THINK_OPEN, i):
      depth += 1
      if depth > 1:
        return False
    elif text.startswith(THINK_CLOSE, i):
      depth -= 1
      if depth < 0:
        return False
  return depth == 0


def check_reasoning_tags(conv: Conversation) -> str | None:
  for m in conv.messages:
    if m.role == "assistant":
      for text in (m.content, m.reasoning or ""):
        if THINK_OPEN in text or THINK_CLOSE in text:
          return "unbalanced_reasoning_tags"
    elif not _tags_paired(m.content):
      return "unbalanced_reasoning_tags"
  return None


_NEXT = {"start": ("system", "user"), "system": ("user",), "user": ("assistant",),
         "assistant": ("user", "tool"), "tool": ("tool", "assistant")}


def check_role_transitions(conv: Conversation) -> str | None:
  prev = "start"
  for m in conv.messages:
    if m.role not in _NEXT[prev]:
      return "invalid_role_transition"
    prev = m.role
  return None if prev == "assistant" else "invalid_role_transition"


def check_tool_results(conv: Conversation) -> str | None:
  msgs = conv.messages
  calls, ids, answered = 0, set(), 0   # of the latest assistant turn
  for i, m in enumerate(msgs):
    if m.role == "assistant":
      calls, ids, answered = len(m.tool_calls), {c.id for c in m.tool_calls if c.id}, 0
      nxt = msgs[i + 1].role if i + 1 < len(msgs) else None
      if calls and nxt != "tool":
        return "unanswered_tool_call"
    elif m.role == "tool":
      answered += 1
      if answered > calls or (m.tool_call_id and ids and m.tool_call_id not in ids):
        return "tool_result_without_call"
    else:
      calls, ids, answered = 0, set(), 0
  return None


def check_supervised(conv: Conversation, *, policy: str = "all_assistant") -> str | None:
  loss = supervised_turns(conv.messages, policy=policy, boundary=last_user_index(conv.messages))
  return None if any(loss) else "no_supervised_assistant"


VALIDATORS: tuple[Callable[[Conversation], str | None], ...] = (
    check_reasoning_tags, check_role_transitions, check_tool_results)


def validate(conv: Conversation, *, policy: str = "all_assistant") -> str | None:
  """The first reason `conv` is invalid, or None."""
  for check in VALIDATORS:
    reason = check(conv)
    if reason is not None:
      return reason
  return check_supervised(conv, policy=policy)


class InvalidRecordError(ValueError):
  """Raised in strict mode on the first invalid record."""

  def __init__(self, reason: str, source: str, index: int, detail: str = ""):
    self.reason, self.source, self.index, self.detail = reason, source, index, detail
    super().__init__(f"{source}[{index}]: {reason}" + (f" ({detail})" if detail else ""))


def valid_conversations(records: Iterable[Any], *, source: str, report: PipelineReport,
                        policy: str = "all_assistant", strict: bool = False) -> Iterator[Conversation]:
  """Normalizes and validates `records`, yielding the valid ones and counting every drop in
  `report`; with `strict`, the first invalid record raises `InvalidRecordError` instead."""
  for index, record in enumerate(records):
    try:
      conv = normalize(record, source=source, index=index)
    except RecordError as e:
      reason, detail = "malformed_record", f"{e.field}: {e.problem}"
    else:
      reason, detail = validate(conv, policy=policy), ""
      if reason is None:
        report.add_kept(source)
        yield conv
        continue
    if strict:
      raise InvalidRecordError(reason, source, index, detail)
    report.add_dropped(source, index, reason, detail)


def sft_example_fn(tokenizer, *, template: str, policy: str = "all_assistant", strict: bool = False,
                   **render_kwargs) -> Callable[[Any, str, int], dict]:
  """An `example_fn(record, source, index)` for `recipe_jax.data.pipeline`.

  Returns `{"ids", "loss_mask"}` rendered with `RENDERERS[template]`. An
  invalid or malformed record raises the pipeline's `DropRecord` with the
  reason from `REASONS`, so the pipeline counts it; with `strict=True` it
  raises `InvalidRecordError` instead, which a strict pipeline turns into an
  error naming the source and index.
  """
  render = RENDERERS[template]

  def example_fn(record: Any, source: str, index: int) -> dict:
    try:
      conv = normalize(record, source=source, index=index)
    except RecordError as e:
      if strict:
        raise InvalidRecordError("malformed_record", source, index, f"{e.field}: {e.problem}") from e
      raise DropRecord("malformed_record", f"{e.field}: {e.problem}") from e
    reason = validate(conv, policy=policy)
    if reason is not None:
      if strict:
        raise InvalidRecordError(reason, source, index)
      raise DropRecord(reason)
    out = render(conv, tokenizer, policy=policy, **render_kwargs)
    return {"ids": out.ids, "loss_mask": out.loss_mask}

  return example_fn
