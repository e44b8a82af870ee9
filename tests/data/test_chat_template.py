"""Renderers: token-for-token parity with `apply_chat_template`, and the loss masks."""

from __future__ import annotations

import numpy as np
import pytest

from recipe_jax.data import (
    POLICIES,
    Conversation,
    Message,
    ToolCall,
    normalize,
    render_glm45,
    render_qwen3,
    template_text,
)

N_RANDOM = 150
RENDER = {"qwen3": render_qwen3, "glm45": lambda c, t, **kw: render_glm45(c, t, close_final_turn=False, **kw)}


def _reference_ids(conv: Conversation, tok) -> list[int]:
  return list(tok.apply_chat_template(conv.to_template_messages(), tools=list(conv.tools) or None,
                                      tokenize=True)["input_ids"])


def _reference_text(conv: Conversation, tok) -> str:
  return tok.apply_chat_template(conv.to_template_messages(), tools=list(conv.tools) or None, tokenize=False)


@pytest.fixture
def tokenizers(qwen_tok, glm_tok):
  return {"qwen3": qwen_tok, "glm45": glm_tok}


# --- parity ---------------------------------------------------------------------

@pytest.mark.parametrize("family", ["qwen3", "glm45"])
@pytest.mark.parametrize("specials", [False, True])
def test_ids_equal_apply_chat_template(family, specials, tokenizers, make_conversation):
  tok = tokenizers[family]
  for seed in range(N_RANDOM):
    conv = make_conversation(seed, specials=specials)
    out = RENDER[family](conv, tok)
    assert out.ids.dtype == np.int32 and out.loss_mask.dtype == bool
    assert out.ids.shape == out.loss_mask.shape
    assert out.ids.tolist() == _reference_ids(conv, tok), f"seed {seed}: {_reference_text(conv, tok)!r}"


def test_reader_round_trip_renders_the_same_ids(tokenizers, make_conversation):
  """OpenAI dicts read back (inline <think> blocks now split off) render to the same ids."""
  for seed in range(40):
    conv = make_conversation(seed)
    record = {"messages": conv.to_template_messages(), "tools": list(conv.tools)}
    again = normalize(record, source="rt", index=seed)
    for family, tok in tokenizers.items():
      assert RENDER[family](again, tok).ids.tolist() == RENDER[family](conv, tok).ids.tolist(), seed


def test_ids_do_not_depend_on_policy(tokenizers, make_conversation):
  for family, tok in tokenizers.items():
    for seed in range(20):
      conv = make_conversation(seed)
      a, b = (RENDER[family](conv, tok, policy=p) for p in POLICIES)
      np.testing.assert_array_equal(a.ids, b.ids)


def test_glm_closes_final_turn_with_user_token(glm_tok, make_conversation):
  user = glm_tok.convert_tokens_to_ids("<|user|>")
  for seed in range(20):
    conv = make_conversation(seed)
    closed = render_glm45(conv, glm_tok, policy="final_response")
    open_ = render_glm45(conv, glm_tok, policy="final_response", close_final_turn=False)
    assert closed.ids.tolist() == open_.ids.tolist() + [user]
    assert closed.loss_mask[-1] == conv.messages[-1].trainable


def test_qwen_boundary_token_across_header_and_answer(qwen_tok):
  """An earlier answer starting with newlines: its first token also holds the header's newline."""
  conv = Conversation((Message("user", "hi"), Message("assistant", "\n\nanswer"),
                       Message("user", "more"), Message("assistant", "done")))
  out = render_qwen3(conv, qwen_tok, policy="all_assistant")
  assert out.ids.tolist() == _reference_ids(conv, qwen_tok)
  text = _reference_text(conv, qwen_tok)
  offsets = qwen_tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
  answer = text.index("\n\nanswer")
  assert any(s < answer < e for s, e in offsets), "no token straddles the header/answer boundary"
  spans = _turn_spans_qwen(text)
  # the straddling token starts in the header, so it carries no loss; the rest of the turn does
  assert out.loss_mask.tolist() == [any(a <= s < b for a, b in spans) for s, _ in offsets]
  assert out.loss_mask.sum() > 0


# --- loss masks, hand-written -------------------------------------------------

def _supervised_text(out, tok) -> list[str]:
  """Decoded runs of consecutive supervised tokens."""
  runs, cur = [], []
  for i, m in zip(out.ids.tolist(), out.loss_mask.tolist()):
    if m:
      cur.append(i)
    elif cur:
      runs.append(tok.decode(cur))
      cur = []
  if cur:
    runs.append(tok.decode(cur))
  return runs


AGENT = Conversation((
    Message("system", "SYS"),
    Message("user", "U1"),
    Message("assistant", "A1", reasoning="R1"),
    Message("user", "U2"),
    Message("assistant", "A2"),
    Message("user", "U3"),
    Message("assistant", "", reasoning="R3", tool_calls=(ToolCall("f", {"x": 1, "y": "s"}),)),
    Message("tool", "T1"),
    Message("assistant", "A4", reasoning="R4"),
))


@pytest.mark.parametrize("policy, expected", [
    ("all_assistant", ["A2<|im_end|>",
                       '<think>\nR3\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1, "y": "s"}}\n'
                       "</tool_call><|im_end|>",
                       "<think>\nR4\n</think>\n\nA4<|im_end|>"]),
    ("final_response", ['<think>\nR3\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"x": 1, "y": "s"}}\n'
                        "</tool_call><|im_end|>",
                        "<think>\nR4\n</think>\n\nA4<|im_end|>"]),
])
def test_qwen_supervised_text(policy, expected, qwen_tok):
  out = render_qwen3(AGENT, qwen_tok, policy=policy)
  assert _supervised_text(out, qwen_tok) == expected
  assert "R1" not in qwen_tok.decode(out.ids.tolist())   # earlier reasoning is stripped by the template


@pytest.mark.parametrize("policy, expected", [
    ("all_assistant", ["\n<think></think>\nA2<|user|>",
                       "\n<think>R3</think>\n<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n"
                       "<arg_key>y</arg_key>\n<arg_value>s</arg_value>\n</tool_call><|observation|>",
                       "\n<think>R4</think>\nA4<|user|>"]),
    ("final_response", ["\n<think>R3</think>\n<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n"
                        "<arg_key>y</arg_key>\n<arg_value>s</arg_value>\n</tool_call><|observation|>",
                        "\n<think>R4</think>\nA4<|user|>"]),
])
def test_glm_supervised_text(policy, expected, glm_tok):
  out = render_glm45(AGENT, glm_tok, policy=policy)
  assert _supervised_text(out, glm_tok) == expected
  assert "R1" not in glm_tok.decode(out.ids.tolist())


@pytest.mark.parametrize("family", ["qwen3", "glm45"])
def test_trainable_false_turn_carries_no_loss(family, tokenizers):
  tok = tokenizers[family]
  msgs = list(AGENT.messages)
  msgs[-1] = Message("assistant", "A4", reasoning="R4", trainable=False)
  out = RENDER[family](Conversation(tuple(msgs)), tok, policy="final_response")
  runs = _supervised_text(out, tok)
  assert len(runs) == 1 and "R3" in runs[0] and not any("A4" in r for r in runs)
  closed = render_glm45(Conversation(tuple(msgs)), tokenizers["glm45"], policy="final_response")
  assert not closed.loss_mask[-1]


def test_unknown_policy_raises(qwen_tok):
  with pytest.raises(ValueError, match="policy"):
    render_qwen3(AGENT, qwen_tok, policy="everything")


# --- loss masks against an independent oracle -----------------------------------
# The oracle finds each assistant turn in the rendered string by searching for the
# role tokens, and maps characters to tokens with the whole string's offsets.

def _turn_spans_qwen(text: str) -> list[tuple[int, int]]:
  spans, pos = [], 0
  while (pos := text.find("<|im_start|>assistant\n", pos)) >= 0:
    start = pos + len("<|im_start|>assistant\n")
    end = text.index("<|im_end|>", start) + len("<|im_end|>")
    spans.append((start, end))
    pos = end
  return spans


def _turn_spans_glm(text: str) -> list[tuple[int, int]]:
  spans, pos = [], 0
  while (pos := text.find("<|assistant|>", pos)) >= 0:
    start = pos + len("<|assistant|>")
    ends = [text.find(t, start) for t in ("<|user|>", "<|observation|>", "<|assistant|>", "<|system|>")]
    ends = [e for e in ends if e >= 0]
    end = min(ends) if ends else len(text)
    if text.startswith(("<|user|>", "<|observation|>"), end):
      end = text.index("|>", end) + 2
    spans.append((start, end))
    pos = start
  return spans


def _oracle_supervised(conv: Conversation, policy: str, boundary: int) -> list[bool]:
  out = []
  for i, m in enumerate(conv.messages):
    if m.role != "assistant":
      continue
    reasoning = m.reasoning if m.reasoning is not None else (
        m.content.split("</think>")[0] if "</think>" in m.content else "")
    reasoning = reasoning.replace("<think>", "")
    if not m.trainable:
      out.append(False)
    elif policy == "final_response":
      out.append(i > boundary)
    else:
      out.append(i > boundary or not reasoning.strip())
  return out


@pytest.mark.parametrize("family", ["qwen3", "glm45"])
@pytest.mark.parametrize("policy", POLICIES)
def test_mask_matches_string_search_oracle(family, policy, tokenizers, make_conversation):
  tok = tokenizers[family]
  spans_of = _turn_spans_qwen if family == "qwen3" else _turn_spans_glm
  for seed in range(N_RANDOM):
    conv = make_conversation(seed)
    text = _reference_text(conv, tok)
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    boundary = max(i for i, m in enumerate(conv.messages) if m.role == "user")
    spans = spans_of(text)
    sup = _oracle_supervised(conv, policy, boundary)
    assert len(spans) == len(sup)
    live = [s for s, ok in zip(spans, sup) if ok]
    expected = [any(a <= s < b for a, b in live) for s, _ in offsets]
    got = RENDER[family](conv, tok, policy=policy).loss_mask.tolist()
    assert got == expected, f"seed {seed}"


def test_no_loss_on_system_user_or_tool_text(tokenizers, make_conversation):
  """Sentinel text in system, user and tool turns never lands in a supervised token."""
  for family, tok in tokenizers.items():
    for seed in range(40):
      base = make_conversation(seed)
      msgs = tuple(m if m.role == "assistant" else Message(m.role, f"{m.content} SENTINEL {m.content}")
                   for m in base.messages)
      conv = Conversation(msgs, tools=base.tools)
      for policy in POLICIES:
        out = RENDER[family](conv, tok, policy=policy)
        assert all("SENTINEL" not in r for r in _supervised_text(out, tok))


# --- the template files -----------------------------------------------------------

def test_template_files_are_the_tokenizer_templates(qwen_tok, glm_tok):
  assert qwen_tok.chat_template == template_text("qwen3")
  assert glm_tok.chat_template == template_text("glm45")
  assert template_text("glm45").startswith("[gMASK]<sop>")


def test_published_layouts(qwen_tok, glm_tok):
  """Golden strings in the models' documented layouts, guarding the template files."""
  conv = Conversation((Message("system", "You are helpful."), Message("user", "Weather?"),
                       Message("assistant", "", tool_calls=(ToolCall("get_weather", {"city": "Paris"}),)),
                       Message("tool", "sunny"), Message("assistant", "It is sunny.", reasoning="Easy.")))
  assert _reference_text(conv, qwen_tok) == (
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
      "<|im_start|>assistant\n<think>\nEasy.\n</think>\n\nIt is sunny.<|im_end|>\n")
  assert _reference_text(conv, glm_tok) == (
      "[gMASK]<sop><|system|>\nYou are helpful.<|user|>\nWeather?<|assistant|>\n<think></think>\n"
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
      "<|observation|>\n<tool_response>\nsunny\n</tool_response><|assistant|>\n<think>Easy.</think>\n"
      "It is sunny.")
