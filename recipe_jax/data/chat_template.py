"""Chat-template renderers: token ids and a per-token loss mask in one pass.

Each renderer re-states one published chat template (the Jinja files in
`templates/`) in Python, as a sequence of pieces whose role is known: a piece
is a run of text or one control token, and carries the loss flag of the turn it
belongs to. The pieces are then tokenized piece by piece. Control tokens that
the tokenizer knows as added tokens become their ids directly; the text
between two control tokens is tokenized as one run (all runs in one batched
call). Because a tokenizer splits its input at added tokens before anything
else, this gives exactly the ids of tokenizing the whole rendered string, which
is what `tokenizer.apply_chat_template(..., tokenize=True)` returns. (This
assumes added tokens that do not swallow neighbouring spaces, i.e. no
`lstrip`/`rstrip`, as in the Qwen3 and GLM-4.5 tokenizers.) Tests check the
equality on many random conversations.

A text run whose pieces differ in loss (only Qwen3's `assistant\\n` header
followed by answer text with no `<think>` block) takes each token's flag from
the piece holding its first character, using the tokenizer's offsets.

Loss-mask policies (`policy=`), with `i*` the last real user message:

- `"all_assistant"`: every assistant turn, except a turn before `i*` whose
  reasoning the template dropped. Both templates strip the reasoning of turns
  before the last user query (Qwen3 removes the block; GLM-4.5 writes an empty
  `<think></think>`), so such a turn no longer shows what the model produced;
  training on it would teach the model to answer without the reasoning it
  actually used. It is rendered as the template renders it (the ids must
  match) and masked. Earlier turns that never had reasoning are supervised.
- `"final_response"`: only assistant turns after `i*` (the complete final
  response, including its tool-calling steps): the Rufus-Air rule. Earlier
  turns are masked, and the template has already stripped their reasoning.

System, user and tool text never carries loss, and neither does a message
whose `trainable` flag is off.

What an assistant turn supervises:

- Qwen3: everything after `<|im_start|>assistant\\n`: the `<think>` block,
  the answer, the tool calls, and the closing `<|im_end|>`. The `\\n` after
  `<|im_end|>` and the role header are not supervised.
- GLM-4.5: everything after `<|assistant|>`, plus the control token that ends
  the turn. The GLM template writes no end-of-turn token; the turn ends where
  the next one begins, and the model stops by emitting `<|user|>` or
  `<|observation|>` (ids 151336 and 151338, both end-of-sequence ids in
  GLM-4.5's generation config). So the `<|user|>` or `<|observation|>` that follows a supervised
  turn carries its loss; this is what the GLM-4 fine-tuning script
  (THUDM/GLM-4 `finetune_demo`) gets by shifting the assistant mask one token
  right (`loss_masks = [False, *loss_masks]`). When the conversation ends on an assistant turn, the renderer closes
  it with `<|user|>`, as that script appends `<|user|>` as the "EOS for chat";
  this one token is the only departure from `apply_chat_template`, and
  `close_final_turn=False` turns it off.
"""

from __future__ import annotations

import bisect
import functools
import json
from importlib import resources
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from recipe_jax.data.schema import THINK_CLOSE, THINK_OPEN, Conversation, Message, last_user_index

POLICIES = ("all_assistant", "final_response")


class Rendered(NamedTuple):
  ids: np.ndarray        # [T] int32 token ids, equal to apply_chat_template's
  loss_mask: np.ndarray  # [T] bool, True where the token carries loss


@functools.cache
def template_text(name: str) -> str:
  """The published Jinja chat template `name` ("qwen3" or "glm45"), as shipped."""
  return resources.files("recipe_jax.data").joinpath("templates", f"{name}.jinja").read_text("utf-8")


def template_reasoning(m: Message) -> tuple[str, str]:
  """`(reasoning, content)` as both templates read an assistant message."""
  if m.reasoning is not None:
    return m.reasoning, m.content
  if THINK_CLOSE in m.content:
    head = m.content.split(THINK_CLOSE)[0]
    return head.rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n"), m.content.split(THINK_CLOSE)[-1].lstrip("\n")
  return "", m.content


def supervised_turns(messages: Sequence[Message], *, policy: str, boundary: int) -> list[bool]:
  """Per message, whether its assistant tokens carry loss (`boundary` is the last real user index)."""
  if policy not in POLICIES:
    raise ValueError(f"unknown loss-mask policy {policy!r}; expected one of {POLICIES}")
  out = []
  for i, m in enumerate(messages):
    if m.role != "assistant" or not m.trainable:
      out.append(False)
    elif i > boundary:
      out.append(True)
    else:
      out.append(policy == "all_assistant" and not template_reasoning(m)[0].strip())
  return out


class _Pieces:
  """An ordered list of `(text, loss, is_control_token)`."""

  def __init__(self):
    self.items: list[tuple[str, bool, bool]] = []

  def text(self, s: str, loss: bool = False):
    if s:
      self.items.append((s, loss, False))

  def mark(self, token: str, loss: bool = False):
    self.items.append((token, loss, True))


def _tokenize(pieces: _Pieces, tokenizer) -> Rendered:
  """Ids and loss mask of the pieces; see the module docstring for why this is exact."""
  added = tokenizer.get_added_vocab()
  # a run is a control token as `(id, loss)`, or a list of consecutive text pieces
  runs: list[Any] = []
  for text, loss, control in pieces.items:
    if control and text in added:
      runs.append((added[text], loss))
    elif runs and isinstance(runs[-1], list):
      runs[-1].append((text, loss))
    else:
      runs.append([(text, loss)])
  texts = ["".join(t for t, _ in run) for run in runs if isinstance(run, list)]
  enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True) if texts else None
  ids: list[int] = []
  mask: list[bool] = []
  k = 0
  for run in runs:
    if not isinstance(run, list):
      ids.append(run[0])
      mask.append(run[1])
      continue
    run_ids, offsets = enc["input_ids"][k], enc["offset_mapping"][k]
    k += 1
    ids.extend(run_ids)
    losses = [loss for _, loss in run]
    if all(losses) or not any(losses):
      mask.extend([losses[0]] * len(run_ids))
      continue
    starts = np.cumsum([0] + [len(t) for t, _ in run[:-1]]).tolist()
    mask.extend(losses[bisect.bisect_right(starts, s) - 1] for s, _ in offsets)
  return Rendered(np.asarray(ids, np.int32), np.asarray(mask, bool))


def _tools(conversation: Conversation, tools) -> list[dict]:
  return list(conversation.tools if tools is None else tools)


def _json(value: Any) -> str:
  """Both templates' `tojson` filter under transformers: `json.dumps(..., ensure_ascii=False)`."""
  return json.dumps(value, ensure_ascii=False)


# --- Qwen3 -------------------------------------------------------------------

_QWEN_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_QWEN_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")


def qwen3_last_query_index(messages: Sequence[Message]) -> int:
  """The Qwen3 template's last real user query: a user turn not wrapping a tool response."""
  for i in range(len(messages) - 1, -1, -1):
    c = messages[i].content
    wrapped = c.startswith("<tool_response>") and c.endswith("</tool_response>")
    if messages[i].role == "user" and not wrapped:
      return i
  return len(messages) - 1


def render_qwen3(conversation: Conversation, tokenizer, *, policy: str = "all_assistant",
                 tools: Sequence[dict] | None = None) -> Rendered:
  """Qwen3 (Qwen/Qwen3-8B) template: ids and loss mask; `tools` defaults to the conversation's."""
  msgs, tools = conversation.messages, _tools(conversation, tools)
  p = _Pieces()
  head_system = bool(msgs) and msgs[0].role == "system"
  if tools:
    p.mark("<|im_start|>")
    p.text("system\n" + (msgs[0].content + "\n\n" if head_system else "") + _QWEN_TOOLS_HEAD
           + "".join("\n" + _json(t) for t in tools) + _QWEN_TOOLS_TAIL)
    p.mark("<|im_end|>")
    p.text("\n")
  elif head_system:
    p.mark("<|im_start|>")
    p.text("system\n" + msgs[0].content)
    p.mark("<|im_end|>")
    p.text("\n")
  boundary = qwen3_last_query_index(msgs)
  loss = supervised_turns(msgs, policy=policy, boundary=boundary)
  for i, m in enumerate(msgs):
    last = i == len(msgs) - 1
    if m.role == "user" or (m.role == "system" and i > 0):
      p.mark("<|im_start|>")
      p.text(f"{m.role}\n{m.content}")
      p.mark("<|im_end|>")
      p.text("\n")
    elif m.role == "assistant":
      sup = loss[i]
      reasoning, content = template_reasoning(m)
      p.mark("<|im_start|>")
      p.text("assistant\n")
      if i > boundary and (last or reasoning):
        p.mark(THINK_OPEN, sup)
        p.text("\n" + reasoning.strip("\n") + "\n", sup)
        p.mark(THINK_CLOSE, sup)
        p.text("\n\n" + content.lstrip("\n"), sup)
      else:
        p.text(content, sup)
      for j, call in enumerate(m.tool_calls):
        if j > 0 or content:
          p.text("\n", sup)
        p.mark("<tool_call>", sup)
        p.text(f'\n{{"name": "{call.name}", "arguments": {_json(call.arguments)}}}\n', sup)
        p.mark("</tool_call>", sup)
      p.mark("<|im_end|>", sup)
      p.text("\n")
    elif m.role == "tool":
      if i == 0 or msgs[i - 1].role != "tool":
        p.mark("<|im_start|>")
        p.text("user")
      p.text("\n")
      p.mark("<tool_response>")
      p.text("\n" + m.content + "\n")
      p.mark("</tool_response>")
      if last or msgs[i + 1].role != "tool":
        p.mark("<|im_end|>")
        p.text("\n")
  return _tokenize(p, tokenizer)


# --- GLM-4.5 -----------------------------------------------------------------

_GLM_TOOLS_HEAD = ("\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                   "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
_GLM_TOOLS_TAIL = ("</tools>\n\nFor each function call, output the function name and arguments within the "
                   "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
                   "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n"
                   "<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>")


def render_glm45(conversation: Conversation, tokenizer, *, policy: str = "all_assistant",
                 tools: Sequence[dict] | None = None, close_final_turn: bool = True) -> Rendered:
  """GLM-4.5 (zai-org/GLM-4.5-Air) template: ids and loss mask (end of turn: module docstring)."""
  msgs, tools = conversation.messages, _tools(conversation, tools)
  p = _Pieces()
  p.mark("[gMASK]")
  p.mark("<sop>")
  if tools:
    p.mark("<|system|>")
    p.text(_GLM_TOOLS_HEAD + "".join(_json(t) + "\n" for t in tools) + _GLM_TOOLS_TAIL)
  boundary = last_user_index(msgs)
  loss = supervised_turns(msgs, policy=policy, boundary=boundary)
  closing = False  # the next role token ends a supervised assistant turn
  for i, m in enumerate(msgs):
    if m.role == "assistant":
      sup = loss[i]
      reasoning, content = template_reasoning(m)
      p.mark("<|assistant|>")
      p.text("\n", sup)
      p.mark(THINK_OPEN, sup)
      if i > boundary and reasoning:
        p.text(reasoning.strip(), sup)
      p.mark(THINK_CLOSE, sup)
      if content.strip():
        p.text("\n" + content.strip(), sup)
      for call in m.tool_calls:
        p.text("\n", sup)
        p.mark("<tool_call>", sup)
        p.text(call.name + "\n", sup)
        for key, value in call.arguments.items():
          p.mark("<arg_key>", sup)
          p.text(key, sup)
          p.mark("</arg_key>", sup)
          p.text("\n", sup)
          p.mark("<arg_value>", sup)
          p.text(value if isinstance(value, str) else _json(value), sup)
          p.mark("</arg_value>", sup)
          p.text("\n", sup)
        p.mark("</tool_call>", sup)
      closing = sup
      continue
    if m.role == "user":
      p.mark("<|user|>", closing)
      p.text("\n" + m.content)
    elif m.role == "tool":
      if i == 0 or msgs[i - 1].role != "tool":
        p.mark("<|observation|>", closing)
      p.text("\n")
      p.mark("<tool_response>")
      p.text("\n" + m.content + "\n")
      p.mark("</tool_response>")
    elif m.role == "system":
      p.mark("<|system|>")
      p.text("\n" + m.content)
    closing = False
  if close_final_turn and msgs and msgs[-1].role == "assistant":
    p.mark("<|user|>", closing)
  return _tokenize(p, tokenizer)


RENDERERS: dict[str, Callable[..., Rendered]] = {"qwen3": render_qwen3, "glm45": render_glm45}
