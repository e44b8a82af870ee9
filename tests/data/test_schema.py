"""Schema dataclasses and the readers that normalize OpenAI, ShareGPT and prompt/response records."""

from __future__ import annotations

import dataclasses
import json

import pytest

from recipe_jax.data import Conversation, Message, RecordError, ToolCall, normalize, split_inline_reasoning
from recipe_jax.data.schema import last_user_index

# --- schema ---------------------------------------------------------------------


def test_message_rejects_bad_fields():
  with pytest.raises(ValueError, match="role"):
    Message("robot", "x")
  with pytest.raises(ValueError, match="content"):
    Message("user", None)
  with pytest.raises(ValueError, match="only assistant"):
    Message("user", "x", reasoning="r")
  with pytest.raises(ValueError, match="only assistant"):
    Message("tool", "x", tool_calls=(ToolCall("f"),))
  with pytest.raises(ValueError, match="tuple of ToolCall"):
    Message("assistant", "x", tool_calls=[ToolCall("f")])
  with pytest.raises(ValueError, match="trainable"):
    Message("assistant", "x", trainable=1)
  with pytest.raises(ValueError, match="arguments"):
    ToolCall("f", '{"a": 1}')
  with pytest.raises(ValueError, match="name"):
    ToolCall("", {})


def test_dataclasses_are_frozen_and_hashable():
  call = ToolCall("f", {"a": [1]})
  m = Message("assistant", "x", tool_calls=(call,))
  with pytest.raises(dataclasses.FrozenInstanceError):
    m.content = "y"
  assert hash(m) == hash(Message("assistant", "x", tool_calls=(ToolCall("f", {"a": [1]}),)))
  conv = Conversation((Message("user", "q"), m), tools=({"type": "function"},))
  assert hash(conv) and conv == Conversation((Message("user", "q"), m), tools=({"type": "function"},))


def test_template_messages_layout():
  conv = Conversation((Message("user", "q"),
                       Message("assistant", "a", reasoning="r", tool_calls=(ToolCall("f", {"x": 1}, id="c1"),)),
                       Message("tool", "out", tool_call_id="c1")))
  assert conv.to_template_messages() == [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": "a", "reasoning_content": "r",
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "content": "out", "tool_call_id": "c1"}]


@pytest.mark.parametrize("content, expected", [
    ("<think>\nwhy\n</think>\n\nanswer", ("why", "answer")),
    ("  <think>why</think>answer", ("why", "answer")),
    ("<think></think>answer", ("", "answer")),
    ("plain answer", (None, "plain answer")),
    ("answer <think>late</think>", (None, "answer <think>late</think>")),
    ("<think>a</think>b</think>c", (None, "<think>a</think>b</think>c")),
    ("<think>open only", (None, "<think>open only")),
    ("</think>close only", (None, "</think>close only")),
])
def test_split_inline_reasoning(content, expected):
  assert split_inline_reasoning(content) == expected


def test_last_user_index():
  msgs = (Message("system", "s"), Message("user", "u"), Message("assistant", "a"), Message("user", "u2"),
          Message("assistant", "b"))
  assert last_user_index(msgs) == 3
  assert last_user_index(msgs[:1]) == -1


# --- readers: the three layouts ---------------------------------------------------


def test_openai_messages():
  record = {
      "tools": [{"type": "function", "function": {"name": "get_weather"}}],
      "messages": [
          {"role": "developer", "content": "sys"},
          {"role": "user", "content": [{"type": "text", "text": "weather "},
                                       {"type": "text", "text": "in Paris?"}]},
          {"role": "assistant", "content": None, "reasoning_content": "look it up",
           "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                          {"id": "c2", "type": "function",
                           "function": {"name": "get_weather", "arguments": {"city": "Lyon", "days": 2}}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
          {"role": "tool", "tool_call_id": "c2", "content": "rain"},
          {"role": "assistant", "content": "<think>\ncompare\n</think>\n\nSunny in Paris.", "trainable": True},
      ]}
  conv = normalize(record, source="oa", index=7)
  assert (conv.source, conv.index) == ("oa", 7)
  assert conv.tools == ({"type": "function", "function": {"name": "get_weather"}},)
  roles = [m.role for m in conv.messages]
  assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]
  assert conv.messages[1].content == "weather in Paris?"
  call_turn = conv.messages[2]
  assert call_turn.content == "" and call_turn.reasoning == "look it up"
  assert call_turn.tool_calls == (ToolCall("get_weather", {"city": "Paris"}, id="c1"),
                                  ToolCall("get_weather", {"city": "Lyon", "days": 2}, id="c2"))
  assert conv.messages[3].tool_call_id == "c1"
  assert conv.messages[5].reasoning == "compare" and conv.messages[5].content == "Sunny in Paris."


def test_openai_trainable_and_weight():
  record = {"messages": [{"role": "user", "content": "q"},
                         {"role": "assistant", "content": "a", "weight": 0},
                         {"role": "user", "content": "q2"},
                         {"role": "assistant", "content": "b", "trainable": False},
                         {"role": "user", "content": "q3"},
                         {"role": "assistant", "content": "c", "weight": 1}]}
  conv = normalize(record, source="s", index=0)
  assert [m.trainable for m in conv.messages if m.role == "assistant"] == [False, False, True]


def test_sharegpt_conversations():
  record = {
      "system": "be brief",
      "tools": json.dumps([{"name": "search", "parameters": {}}]),
      "conversations": [
          {"from": "human", "value": "find x"},
          {"from": "function_call", "value": json.dumps({"name": "search", "arguments": {"q": "x"}})},
          {"from": "observation", "value": "x is 3"},
          {"from": "function_call", "value": json.dumps([{"name": "search", "arguments": '{"q": "y"}'},
                                                         {"name": "search", "arguments": {"q": "z"}}])},
          {"from": "tool", "value": "y is 4"},
          {"from": "gpt", "value": "<think>sum</think>x is 3."},
      ]}
  conv = normalize(record, source="sg", index=1)
  assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                             "assistant"]
  assert conv.messages[0].content == "be brief"
  assert conv.messages[2].tool_calls == (ToolCall("search", {"q": "x"}),) and conv.messages[2].content == ""
  assert [c.arguments for c in conv.messages[4].tool_calls] == [{"q": "y"}, {"q": "z"}]
  assert conv.messages[6].reasoning == "sum" and conv.messages[6].content == "x is 3."
  assert conv.tools == ({"name": "search", "parameters": {}},)


def test_prompt_response():
  conv = normalize({"system": "s", "prompt": "2+2?", "response": "4", "reasoning": "add"}, source="pr", index=3)
  assert conv.messages == (Message("system", "s"), Message("user", "2+2?"), Message("assistant", "4", "add"))
  inline = normalize({"prompt": "2+2?", "response": "<think>add</think>\n4"}, source="pr", index=4)
  assert inline.messages == (Message("user", "2+2?"), Message("assistant", "4", "add"))


def test_explicit_reasoning_leaves_content_tags_alone():
  """With reasoning given separately, tags left in the content are for the validator to reject."""
  conv = normalize({"prompt": "q", "response": "<think>x</think>a", "reasoning": "r"}, source="pr", index=0)
  assert conv.messages[-1] == Message("assistant", "<think>x</think>a", "r")


# --- readers: malformed records -----------------------------------------------------

MALFORMED = [
    ("not a dict", ["record"], "record"),
    ({"text": "hello"}, ["record"], "record"),
    ({"messages": "hi"}, ["messages"], "messages"),
    ({"messages": []}, ["messages"], "messages"),
    ({"messages": ["hi"]}, ["messages[0]"], "messages[0]"),
    ({"messages": [{"role": "robot", "content": "x"}]}, ["unknown role"], "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, ["content"], "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]},
     ["text parts"], "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "content": "", "reasoning_content": 3}]},
     ["string"], "messages[0].reasoning_content"),
    ({"messages": [{"role": "user", "content": "q", "reasoning_content": "r"}]},
     ["cannot carry reasoning"], "messages[0].reasoning_content"),
    ({"messages": [{"role": "user", "content": "q", "tool_calls": [{"function": {"name": "f"}}]}]},
     ["cannot carry tool calls"], "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": {"name": "f"}}]}, ["list"], "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
     ["non-empty"], "messages[0].tool_calls[0].name"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]},
     ["invalid JSON"], "messages[0].tool_calls[0].arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1, 2]"}}]}]},
     ["JSON object"], "messages[0].tool_calls[0].arguments"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": 3, "function": {"name": "f"}}]}]},
     ["string"], "messages[0].tool_calls[0].id"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 4}]}, ["string"],
     "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "trainable": "yes"}]}, ["true or false"],
     "messages[0].trainable"),
    ({"messages": [{"role": "user", "content": "x", "weight": 0.5}]}, ["0 or 1"], "messages[0].weight"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "{not json"}, ["invalid JSON"], "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [1, 2]}, ["tool schemas"], "tools"),
    ({"conversations": {"from": "human"}}, ["list"], "conversations"),
    ({"conversations": [{"from": "alien", "value": "x"}]}, ["unknown speaker"], "conversations[0].from"),
    ({"conversations": [{"from": "human", "value": None}]}, ["string"], "conversations[0].value"),
    ({"conversations": [{"from": "function_call", "value": "call f"}]}, ["invalid JSON"],
     "conversations[0].value"),
    ({"conversations": [{"from": "function_call", "value": '{"arguments": {}}'}]}, ["non-empty"],
     "conversations[0].value[0].name"),
    ({"conversations": [{"from": "human", "value": "x"}], "system": 1}, ["string"], "system"),
    ({"prompt": None, "response": "r"}, ["string"], "prompt"),
    ({"prompt": "p", "response": ["r"]}, ["string"], "response"),
    ({"prompt": "p", "response": "r", "reasoning": 1}, ["string"], "reasoning"),
]


@pytest.mark.parametrize("record, words, field", MALFORMED)
def test_malformed_record_names_source_index_and_field(record, words, field):
  with pytest.raises(RecordError) as info:
    normalize(record, source="bad.jsonl", index=12)
  err = info.value
  assert (err.source, err.index, err.field) == ("bad.jsonl", 12, field)
  assert str(err).startswith(f"bad.jsonl[12] {field}: ")
  for w in words:
    assert w in err.problem or w in err.field
