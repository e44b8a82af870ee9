"""Readers: turn one raw record of a public chat data set into a `Conversation`.

Three layouts are recognised, by their keys:

- OpenAI `messages`: `{"messages": [{"role", "content", "reasoning_content"?,
  "tool_calls"?, "tool_call_id"?, "trainable"?}], "tools"?}`. Content may be a
  string, null, or a list of `{"type": "text", "text": ...}` parts. Tool-call
  arguments may be a dict or a JSON string; `developer` is read as `system`.
- ShareGPT `conversations`: `{"conversations": [{"from", "value"}], "system"?,
  "tools"?}` with `from` in human/gpt/system/function_call/observation/tool.
  A `function_call` turn holds `{"name", "arguments"}` (or a list of them) as
  JSON and becomes an assistant turn with tool calls and no text.
- Prompt/response pairs: `{"prompt", "response", "system"?, "reasoning"?}`.

Assistant text that opens with a `<think>...</think>` block and has no
separate reasoning is split into reasoning and content (see
`split_inline_reasoning`). A per-message `trainable` (bool) or `weight` (0 or
1) sets the message's loss flag.

A record that cannot be read raises `RecordError`, which names the source,
the index and the offending field. Semantic problems (bad role order, stray
reasoning tags, unanswered tool calls) are not the reader's business: they are
left for `recipe_jax.data.validate`.
"""

from __future__ import annotations

import json
from typing import Any

from recipe_jax.data.schema import Conversation, Message, ToolCall, split_inline_reasoning

_OPENAI_ROLES = {"system": "system", "developer": "system", "user": "user",
                 "assistant": "assistant", "tool": "tool", "function": "tool"}
_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                   "assistant": "assistant", "function_call": "assistant",
                   "observation": "tool", "tool": "tool"}


class RecordError(ValueError):
  """A record that cannot be normalized: names its source, index and field."""

  def __init__(self, source: str, index: int, field: str, problem: str):
    self.source, self.index, self.field, self.problem = source, index, field, problem
    super().__init__(f"{source}[{index}] {field}: {problem}")


def normalize(record: Any, *, source: str, index: int) -> Conversation:
  """Reads one raw record (OpenAI, ShareGPT or prompt/response layout)."""
  r = _Reader(source, index)
  if not isinstance(record, dict):
    raise r.error("record", f"expected a JSON object, got {type(record).__name__}")
  if "messages" in record:
    messages = r.openai(record["messages"])
  elif "conversations" in record:
    messages = r.sharegpt(record["conversations"], record.get("system"))
  elif "prompt" in record and "response" in record:
    messages = r.prompt_response(record)
  else:
    raise r.error("record", "no 'messages', 'conversations' or 'prompt'/'response' keys")
  if not messages:
    raise r.error("messages", "no messages")
  return Conversation(messages=tuple(messages), tools=r.tools(record.get("tools")),
                      source=source, index=index)


class _Reader:
  """Field parsing for one record; every failure names the field path."""

  def __init__(self, source: str, index: int):
    self.source, self.index = source, index

  def error(self, field: str, problem: str) -> RecordError:
    return RecordError(self.source, self.index, field, problem)

  # --- layouts ---------------------------------------------------------------

  def openai(self, raw: Any) -> list[Message]:
    if not isinstance(raw, list):
      raise self.error("messages", f"expected a list, got {type(raw).__name__}")
    out = []
    for i, m in enumerate(raw):
      f = f"messages[{i}]"
      if not isinstance(m, dict):
        raise self.error(f, "expected an object")
      role = _OPENAI_ROLES.get(m.get("role"))
      if role is None:
        raise self.error(f"{f}.role", f"unknown role {m.get('role')!r}")
      content = self.text(m.get("content"), f"{f}.content")
      reasoning = m.get("reasoning_content", m.get("reasoning"))
      if reasoning is not None and not isinstance(reasoning, str):
        raise self.error(f"{f}.reasoning_content", "expected a string")
      calls = m.get("tool_calls") or []
      if not isinstance(calls, list):
        raise self.error(f"{f}.tool_calls", "expected a list")
      tool_calls = tuple(self.tool_call(c, f"{f}.tool_calls[{j}]") for j, c in enumerate(calls))
      out.append(self.message(role, content, reasoning, tool_calls, m, f,
                              tool_call_id=self.opt_str(m.get("tool_call_id"), f"{f}.tool_call_id"),
                              name=self.opt_str(m.get("name"), f"{f}.name")))
    return out

  def sharegpt(self, raw: Any, system: Any) -> list[Message]:
    if not isinstance(raw, list):
      raise self.error("conversations", f"expected a list, got {type(raw).__name__}")
    out = []
    if system is not None:
      if not isinstance(system, str):
        raise self.error("system", "expected a string")
      if system:
        out.append(Message("system", system))
    for i, turn in enumerate(raw):
      f = f"conversations[{i}]"
      if not isinstance(turn, dict):
        raise self.error(f, "expected an object")
      kind = turn.get("from")
      role = _SHAREGPT_ROLES.get(kind)
      if role is None:
        raise self.error(f"{f}.from", f"unknown speaker {kind!r}")
      value = turn.get("value")
      if not isinstance(value, str):
        raise self.error(f"{f}.value", "expected a string")
      if kind == "function_call":
        calls = self.json(value, f"{f}.value")
        calls = calls if isinstance(calls, list) else [calls]
        tool_calls = tuple(self.tool_call(c, f"{f}.value[{j}]") for j, c in enumerate(calls))
        out.append(self.message(role, "", None, tool_calls, turn, f))
      else:
        out.append(self.message(role, value, None, (), turn, f))
    return out

  def prompt_response(self, record: dict) -> list[Message]:
    out = []
    for key in ("prompt", "response"):
      if not isinstance(record[key], str):
        raise self.error(key, "expected a string")
    for key in ("system", "reasoning"):
      if record.get(key) is not None and not isinstance(record[key], str):
        raise self.error(key, "expected a string")
    if record.get("system"):
      out.append(Message("system", record["system"]))
    out.append(Message("user", record["prompt"]))
    out.append(self.message("assistant", record["response"], record.get("reasoning"), (), {}, "response"))
    return out

  # --- fields ----------------------------------------------------------------

  def message(self, role, content, reasoning, tool_calls, raw, field, **extra) -> Message:
    trainable = self.trainable(raw, field)
    if role != "assistant":
      if reasoning is not None:
        raise self.error(f"{field}.reasoning_content", f"a {role} message cannot carry reasoning")
      if tool_calls:
        raise self.error(f"{field}.tool_calls", f"a {role} message cannot carry tool calls")
    elif reasoning is None:
      reasoning, content = split_inline_reasoning(content)
    return Message(role, content, reasoning, tool_calls, trainable, **extra)

  def text(self, content: Any, field: str) -> str:
    if content is None:
      return ""
    if isinstance(content, str):
      return content
    if isinstance(content, list):
      parts = []
      for j, part in enumerate(content):
        if isinstance(part, str):
          parts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
          parts.append(part["text"])
        else:
          raise self.error(f"{field}[{j}]", "only text parts are supported")
      return "".join(parts)
    raise self.error(field, f"expected a string, null or a list of text parts, got {type(content).__name__}")

  def tool_call(self, raw: Any, field: str) -> ToolCall:
    if not isinstance(raw, dict):
      raise self.error(field, "expected an object")
    fn = raw.get("function", raw)
    if not isinstance(fn, dict):
      raise self.error(f"{field}.function", "expected an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
      raise self.error(f"{field}.name", "expected a non-empty string")
    args = fn.get("arguments", {})
    if isinstance(args, str):
      args = self.json(args, f"{field}.arguments") if args.strip() else {}
    if not isinstance(args, dict):
      raise self.error(f"{field}.arguments", f"expected a JSON object, got {type(args).__name__}")
    return ToolCall(name, args, self.opt_str(raw.get("id"), f"{field}.id"))

  def tools(self, raw: Any) -> tuple[dict, ...]:
    if raw is None or raw == "":
      return ()
    if isinstance(raw, str):
      raw = self.json(raw, "tools")
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
      raise self.error("tools", "expected a list of tool schemas (objects)")
    return tuple(raw)

  def trainable(self, raw: dict, field: str) -> bool:
    if "trainable" in raw:
      if not isinstance(raw["trainable"], bool):
        raise self.error(f"{field}.trainable", "expected true or false")
      return raw["trainable"]
    if "weight" in raw:
      if raw["weight"] not in (0, 1) or isinstance(raw["weight"], bool):
        raise self.error(f"{field}.weight", "expected 0 or 1")
      return raw["weight"] == 1
    return True

  def json(self, text: str, field: str) -> Any:
    try:
      return json.loads(text)
    except json.JSONDecodeError as e:
      raise self.error(field, f"invalid JSON ({e.msg} at position {e.pos})") from None

  def opt_str(self, value: Any, field: str) -> str | None:
    if value is not None and not isinstance(value, str):
      raise self.error(field, "expected a string")
    return value
