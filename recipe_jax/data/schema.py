"""The role-aware conversation schema that every reader produces and every renderer consumes.

A `Conversation` is an ordered tuple of `Message`s plus the tool schemas offered
to the model. Four roles exist: `system`, `user`, `assistant` and `tool`.
Assistant messages may carry reasoning (rendered inside the template's
`<think>` block) and tool calls; tool messages carry one tool result each.
Every message has a `trainable` flag: a renderer never puts loss on a message
whose flag is off, whatever the loss-mask policy says.

The dataclasses are frozen. `ToolCall.arguments` and `Conversation.tools` are
plain dicts (the chat templates iterate and JSON-encode them), excluded from
hashing; treat them as read-only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One function call made by an assistant turn.

  `arguments` is always a JSON object (a dict), never a JSON string: readers
  decode string arguments, so both templates see the same arguments and GLM's
  template (which iterates over them) can render them.
  """
  name: str
  arguments: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
  id: str | None = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"tool call name must be a non-empty string, got {self.name!r}")
    if not isinstance(self.arguments, dict):
      raise ValueError(f"tool call arguments must be a dict, got {type(self.arguments).__name__}")


@dataclasses.dataclass(frozen=True)
class Message:
  """One turn. `reasoning is None` means the record had no separate reasoning."""
  role: Role
  content: str = ""
  reasoning: str | None = None
  tool_calls: tuple[ToolCall, ...] = ()
  trainable: bool = True
  tool_call_id: str | None = None
  name: str | None = None

  def __post_init__(self):
    if self.role not in ROLES:
      raise ValueError(f"unknown role {self.role!r}; expected one of {ROLES}")
    if not isinstance(self.content, str):
      raise ValueError(f"content must be a string, got {type(self.content).__name__}")
    if self.reasoning is not None and not isinstance(self.reasoning, str):
      raise ValueError(f"reasoning must be a string or None, got {type(self.reasoning).__name__}")
    if not isinstance(self.tool_calls, tuple) or not all(isinstance(c, ToolCall) for c in self.tool_calls):
      raise ValueError("tool_calls must be a tuple of ToolCall")
    if self.role != "assistant" and (self.tool_calls or self.reasoning is not None):
      raise ValueError(f"only assistant messages carry reasoning or tool calls, not {self.role!r}")
    if not isinstance(self.trainable, bool):
      raise ValueError(f"trainable must be a bool, got {self.trainable!r}")


@dataclasses.dataclass(frozen=True)
class Conversation:
  """A normalized record: messages, offered tools, and where it came from."""
  messages: tuple[Message, ...]
  tools: tuple[dict[str, Any], ...] = dataclasses.field(default=(), hash=False)
  source: str = ""
  index: int = -1

  def __post_init__(self):
    if not isinstance(self.messages, tuple) or not all(isinstance(m, Message) for m in self.messages):
      raise ValueError("messages must be a tuple of Message")
    if not isinstance(self.tools, tuple) or not all(isinstance(t, dict) for t in self.tools):
      raise ValueError("tools must be a tuple of dicts")

  def to_template_messages(self) -> list[dict[str, Any]]:
    """The messages as the dicts a Hugging Face chat template reads (OpenAI layout)."""
    out = []
    for m in self.messages:
      d: dict[str, Any] = {"role": m.role, "content": m.content}
      if m.reasoning is not None:
        d["reasoning_content"] = m.reasoning
      if m.tool_calls:
        d["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls]
      if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
      out.append(d)
    return out


def split_inline_reasoning(content: str) -> tuple[str | None, str]:
  """Separates a leading `<think>...</think>` block from assistant text.

  Returns `(reasoning, rest)`. Only the clean form is split: the text starts
  (after whitespace) with one `<think>` and holds exactly one `</think>`. The
  split trims newlines the way the Qwen3 and GLM-4.5 templates do when they
  split inline reasoning themselves, so a template renders the split message
  exactly as it would have rendered the inline one. Anything else (no tags,
  stray or repeated tags) comes back unchanged as `(None, content)`; the
  validator then decides whether the leftover tags are an error.
  """
  if (content.lstrip().startswith(THINK_OPEN) and content.count(THINK_OPEN) == 1
      and content.count(THINK_CLOSE) == 1 and content.index(THINK_OPEN) < content.index(THINK_CLOSE)):
    head, rest = content.split(THINK_CLOSE)
    return head.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n"), rest.lstrip("\n")
  return None, content


def last_user_index(messages: tuple[Message, ...] | list[Message]) -> int:
  """Index of the last `user` message, or -1: the boundary of the final response."""
  for i in range(len(messages) - 1, -1, -1):
    if messages[i].role == "user":
      return i
  return -1
