"""Preference records -> rendered pairs (same templates and masks as SFT) -> batches of whole pairs."""

import numpy as np
import pytest

from recipe_jax.data.pipeline import Source
from recipe_jax.data.preference import (PreferenceDataConfig, PreferencePipeline, pair_rows,
                                        preference_example_fn)
from recipe_jax.data.validate import InvalidRecordError, sft_example_fn
from recipe_jax.demo.preference import corrupt, make_pairs, writes_fixed_width

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}]


def _sft_render(tok, template, messages, policy):
  return sft_example_fn(tok, template=template, policy=policy)({"messages": messages}, "s", 0)


@pytest.mark.parametrize("template", ["qwen3", "glm45"])
@pytest.mark.parametrize("policy", ["final_response", "all_assistant"])
def test_halves_render_exactly_as_sft_would(template, policy, qwen_tok, glm_tok):
  tok = qwen_tok if template == "qwen3" else glm_tok
  chosen = [{"role": "assistant", "content": "6", "reasoning_content": "3 and 3 make 6."}]
  rejected = [{"role": "assistant", "content": "7"}]
  layouts = [
      {"prompt": PROMPT, "chosen": chosen, "rejected": rejected},
      {"prompt": PROMPT, "chosen": chosen[0], "rejected": rejected[0]},
      {"prompt": "ignored, the halves are full", "chosen": PROMPT + chosen, "rejected": PROMPT + rejected},
      {"chosen": PROMPT + chosen, "rejected": PROMPT + rejected},
  ]
  fn = preference_example_fn(tok, template=template, policy=policy)
  for record in layouts:
    out = fn(record, "s", 0)
    for name, response in (("chosen", chosen), ("rejected", rejected)):
      want = _sft_render(tok, template, PROMPT + response, policy)
      np.testing.assert_array_equal(out[name]["ids"], want["ids"])
      np.testing.assert_array_equal(out[name]["loss_mask"], want["loss_mask"])


def test_string_prompt_and_responses(qwen_tok):
  out = preference_example_fn(qwen_tok, template="qwen3")({"prompt": "hi", "chosen": "a", "rejected": "b"}, "s", 0)
  want = _sft_render(qwen_tok, "qwen3", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}],
                     "final_response")
  np.testing.assert_array_equal(out["chosen"]["ids"], want["ids"])


@pytest.mark.parametrize("record,reason", [
    ({"prompt": "q", "chosen": "a"}, "malformed_record"),
    ({"prompt": "q", "chosen": 3, "rejected": "b"}, "malformed_record"),
    ({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
      "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}]}, "prompt_mismatch"),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "identical_responses"),
    ({"prompt": "q", "chosen": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
      "rejected": "c"}, "invalid_role_transition"),
    ({"prompt": "q", "chosen": [], "rejected": "c"}, "no_response"),
])
def test_bad_records_are_counted_by_reason_or_fatal_when_strict(record, reason, qwen_tok):
  good = make_pairs(3, seed=1)
  data = good[:1] + [record] + good[1:]
  cfg = PreferenceDataConfig(seq_len=64, batch_size=8, shuffle=False, read_threads=1)
  pipe = PreferencePipeline(Source("d", data), preference_example_fn(qwen_tok, template="qwen3"), cfg)
  batch = next(pipe)
  assert pipe.report().dropped == {"d": {reason: 1}}
  assert pipe.report().examples[f"d/{reason}"][0][0] == 1
  assert int((batch["loss_mask"].sum(-1) > 0).all(-1).sum()) == 3
  strict = preference_example_fn(qwen_tok, template="qwen3", strict=True)
  with pytest.raises(InvalidRecordError, match=f"d\\[1\\]: {reason}"):
    strict(record, "d", 1)


def test_pair_rows_shift_and_pad(qwen_tok):
  pair = preference_example_fn(qwen_tok, template="qwen3")(make_pairs(1)[0], "s", 0)
  rows = pair_rows(pair, 48)
  for p, name in enumerate(("chosen", "rejected")):
    ids, mask = pair[name]["ids"], pair[name]["loss_mask"]
    n = len(ids)
    np.testing.assert_array_equal(rows["tokens"][p, :n], ids)
    np.testing.assert_array_equal(rows["targets"][p, :n - 1], ids[1:])
    np.testing.assert_array_equal(rows["loss_mask"][p, :n - 1], mask[1:])
    assert not rows["loss_mask"][p, n - 1:].any() and not rows["tokens"][p, n:].any()
    np.testing.assert_array_equal(rows["segment_ids"][p], np.arange(48) < n)
    np.testing.assert_array_equal(rows["positions"][p, :n], np.arange(n))


def test_over_length_pairs_are_dropped_and_halves_stay_together(qwen_tok):
  records = make_pairs(10, seed=2)
  records[4] = dict(records[4], rejected=[{"role": "assistant", "content": "long " * 40}])  # only one half long
  ref = np.arange(20, dtype=np.float32).reshape(10, 2)
  cfg = PreferenceDataConfig(seq_len=40, batch_size=4, shuffle=False, read_threads=1)
  pipe = PreferencePipeline(Source("d", records), preference_example_fn(qwen_tok, template="qwen3"), cfg,
                            reference={"d": ref})
  batches = list(pipe)
  assert [b["tokens"].shape for b in batches] == [(4, 2, 40)] * 3
  assert pipe.report().dropped == {"d": {"over_length": 1}} and pipe.report().num_kept == 9
  refs = np.concatenate([b["reference_logps"] for b in batches])
  np.testing.assert_array_equal(refs[:9], np.delete(ref, 4, axis=0))   # each pair keeps its own reference
  assert not batches[-1]["loss_mask"][1:].any()                         # the short last batch is padded
  fn = preference_example_fn(qwen_tok, template="qwen3")
  kept = [r for i, r in enumerate(records) if i != 4]
  for j, record in enumerate(kept):
    rows = pair_rows(fn(record, "d", 0), 40)
    for k in rows:
      np.testing.assert_array_equal(batches[j // 4][k][j % 4], rows[k])


def test_state_restores_the_position_and_the_report(qwen_tok):
  records = make_pairs(30, seed=3)
  records[7] = {"prompt": "q", "chosen": "x", "rejected": "x"}
  fn = preference_example_fn(qwen_tok, template="qwen3")
  cfg = PreferenceDataConfig(seq_len=40, batch_size=4, num_epochs=None, seed=5, read_threads=2)
  a = PreferencePipeline(Source("d", records), fn, cfg)
  for _ in range(3):
    next(a)
  state = a.get_state()
  want = [next(a) for _ in range(10)]
  b = PreferencePipeline(Source("d", records), fn, cfg)
  b.set_state(state)
  assert b.report().to_state() == state["report"]
  got = [next(b) for _ in range(10)]
  for x, y in zip(want, got):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert a.report().to_state() == b.report().to_state()
  assert a.report().dropped_by_reason()["identical_responses"] >= 1  # record 7, once per epoch read
  other = PreferencePipeline(Source("d", records), fn, PreferenceDataConfig(seq_len=48, batch_size=4))
  with pytest.raises(ValueError, match="seq_len: saved 40, now 48"):
    other.set_state(state)


def test_corruptions_are_wrong_non_negative_integers():
  import random
  rng = random.Random(0)
  for answer in ["0", "7", "10", "99", "100", "198"]:
    for _ in range(50):
      wrong = corrupt(answer, rng)
      assert wrong != answer and wrong.isdigit() and str(int(wrong)) == wrong
  pairs = make_pairs(200, digits=2, seed=4, exclude={"What is 1 + 2?"})
  questions = [p["prompt"][0]["content"] for p in pairs]
  assert len(set(questions)) == 200 and "What is 1 + 2?" not in questions
  assert not writes_fixed_width(questions, 2)
  assert writes_fixed_width(["What is 07 + 45?"], 2) and not writes_fixed_width(["What is 7 + 45?"], 2)
  padded = [p["prompt"][0]["content"] for p in make_pairs(50, digits=2, seed=4, fixed_width=True)]
  assert writes_fixed_width(padded, 2)
