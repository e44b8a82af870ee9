"""Validators (one test per drop reason), the drop report, and strict mode."""

from __future__ import annotations


import pytest

from recipe_jax.data import (
    PipelineReport,
    REASONS,
    Conversation,
    InvalidRecordError,
    Message,
    ToolCall,
    sft_example_fn,
    valid_conversations,
    validate,
)

U, S = Message("user", "q"), Message("system", "s")
A = Message("assistant", "a")


def call(*ids):
  return Message("assistant", "", tool_calls=tuple(ToolCall("f", {"x": 1}, id=i) for i in ids))


def tool(call_id=None):
  return Message("tool", "out", tool_call_id=call_id)


def conv(*msgs):
  return Conversation(tuple(msgs))


VALID = [
    conv(U, A),
    conv(S, U, A, U, A),
    conv(U, call("c1", "c2"), tool("c1"), tool("c2"), A),
    conv(U, call(None, None), tool(), A),                       # fewer results than parallel calls
    conv(U, call("c1"), tool("c1"), call("c2"), tool("c2"), A),
    conv(U, Message("assistant", "a", reasoning="r")),
    conv(Message("user", "what does <think>x</think> mean?"), A),  # paired tags in a user turn
]


@pytest.mark.parametrize("c", VALID)
def test_valid_conversations_pass(c):
  assert validate(c, policy="all_assistant") is None
  assert validate(c, policy="final_response") is None


INVALID = [
    ("unbalanced_reasoning_tags", conv(U, Message("assistant", "a <think>b</think>"))),
    ("unbalanced_reasoning_tags", conv(U, Message("assistant", "</think>a"))),
    ("unbalanced_reasoning_tags", conv(U, Message("assistant", "a", reasoning="<think>r"))),
    ("unbalanced_reasoning_tags", conv(U, Message("assistant", "<think>x</think>a", reasoning="r"))),
    ("unbalanced_reasoning_tags", conv(Message("user", "</think> then <think>"), A)),
    ("unbalanced_reasoning_tags", conv(Message("system", "<think><think></think></think>"), U, A)),
    ("invalid_role_transition", conv(A)),
    ("invalid_role_transition", conv(U, S, A)),
    ("invalid_role_transition", conv(S, S, U, A)),
    ("invalid_role_transition", conv(U, U, A)),
    ("invalid_role_transition", conv(U, A, A)),
    ("invalid_role_transition", conv(U, A, U)),
    ("invalid_role_transition", conv(U, tool(), A)),
    ("invalid_role_transition", conv(U, call("c"), tool("c"), U, A)),
    ("invalid_role_transition", conv(S)),
    ("invalid_role_transition", conv()),
    ("tool_result_without_call", conv(U, A, tool(), A)),
    ("tool_result_without_call", conv(U, call("c1"), tool("c1"), tool("c1"), A)),
    ("tool_result_without_call", conv(U, call("c1"), tool("zz"), A)),
    ("unanswered_tool_call", conv(U, call("c1"), U, A)),
    ("unanswered_tool_call", conv(U, A, U, call("c1"))),
    ("no_supervised_assistant", conv(U, Message("assistant", "a", trainable=False))),
    ("no_supervised_assistant", conv(U, Message("assistant", "a", reasoning="r"), U,
                                     Message("assistant", "b", trainable=False))),
]


@pytest.mark.parametrize("reason, c", INVALID)
def test_each_invalid_conversation_has_its_reason(reason, c):
  assert reason in REASONS
  assert validate(c) == reason


def test_every_reason_is_exercised():
  assert {r for r, _ in INVALID} | {"malformed_record"} == set(REASONS)


def test_supervision_depends_on_policy():
  earlier_only = conv(U, A, U, Message("assistant", "b", trainable=False))
  assert validate(earlier_only, policy="all_assistant") is None
  assert validate(earlier_only, policy="final_response") == "no_supervised_assistant"
  # An earlier answer whose reasoning the templates strip is not supervised under all_assistant either.
  reasoned = conv(U, Message("assistant", "a", reasoning="r"), U, Message("assistant", "b", trainable=False))
  assert validate(reasoned, policy="all_assistant") == "no_supervised_assistant"


# --- the drop report -----------------------------------------------------------------

RECORDS = [
    {"prompt": "p", "response": "r"},                                                  # 0 ok
    {"messages": [{"role": "assistant", "content": "a"}]},                             # 1 role order
    "garbage",                                                                         # 2 malformed
    {"prompt": "p", "response": "<think>x"},                                           # 3 tags
    {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},  # 4 ok
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a </think>"}]},  # 5 tags
    {"messages": [{"role": "user", "content": "q"},
                  {"role": "assistant", "content": "a", "trainable": False}]},         # 6 no loss
]


def test_report_counts_every_drop_with_examples():
  report = PipelineReport()
  kept = list(valid_conversations(RECORDS, source="mix.jsonl", report=report))
  assert [c.index for c in kept] == [0, 4]
  assert report.num_kept == 2 and report.num_dropped == 5 and report.num_kept + report.num_dropped == len(RECORDS)
  assert report.dropped_by_reason() == {"invalid_role_transition": 1, "malformed_record": 1,
                                        "unbalanced_reasoning_tags": 2, "no_supervised_assistant": 1}
  assert report.examples["mix.jsonl/unbalanced_reasoning_tags"] == [[3, ""], [5, ""]]
  assert report.examples["mix.jsonl/malformed_record"][0][0] == 2
  text = report.table()
  assert text.splitlines()[0] == "records: kept 2 of 7, dropped 5"
  assert "mix.jsonl/unbalanced_reasoning_tags         2  e.g. mix.jsonl[3], mix.jsonl[5]" in text
  assert "mix.jsonl[6]" in text


def test_strict_mode_raises_on_first_invalid_record():
  records = iter(RECORDS)
  with pytest.raises(InvalidRecordError) as info:
    list(valid_conversations(records, source="mix.jsonl", report=PipelineReport(), strict=True))
  err = info.value
  assert (err.reason, err.source, err.index) == ("invalid_role_transition", "mix.jsonl", 1)
  assert "mix.jsonl[1]" in str(err)
  assert next(records) == "garbage"   # stopped at the first invalid record


def test_strict_mode_reports_malformed_field():
  with pytest.raises(InvalidRecordError, match=r"bad\[0\]: malformed_record \(messages\[0\]\.role"):
    list(valid_conversations([{"messages": [{"role": "x"}]}], source="bad", report=PipelineReport(),
                             strict=True))


def test_policy_reaches_validation():
  records = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                           {"role": "user", "content": "q2"},
                           {"role": "assistant", "content": "b", "trainable": False}]}]
  report = PipelineReport()
  assert len(list(valid_conversations(records, source="s", report=report, policy="all_assistant"))) == 1
  report = PipelineReport()
  assert not list(valid_conversations(records, source="s", report=report, policy="final_response"))
  assert report.dropped_by_reason() == {"no_supervised_assistant": 1}


# --- the pipeline's example_fn ---------------------------------------------------------

def test_sft_example_fn_renders_and_signals_drops(qwen_tok):
  from recipe_jax.data import render_qwen3
  from recipe_jax.data.errors import DropRecord

  fn = sft_example_fn(qwen_tok, template="qwen3", policy="final_response")
  out = fn(RECORDS[0], "mix", 0)
  ref = render_qwen3(Conversation((Message("user", "p"), Message("assistant", "r"))), qwen_tok,
                     policy="final_response")
  assert out["ids"].tolist() == ref.ids.tolist() and out["loss_mask"].tolist() == ref.loss_mask.tolist()
  with pytest.raises(DropRecord) as info:
    fn(RECORDS[3], "mix", 3)
  assert info.value.reason == "unbalanced_reasoning_tags"
  with pytest.raises(DropRecord) as info:
    fn(RECORDS[2], "mix", 2)
  assert info.value.reason == "malformed_record" and "record" in info.value.detail
  strict = sft_example_fn(qwen_tok, template="qwen3", strict=True)
  with pytest.raises(InvalidRecordError, match=r"mix\[1\]: invalid_role_transition"):
    strict(RECORDS[1], "mix", 1)
