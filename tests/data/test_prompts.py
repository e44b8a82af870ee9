"""RL prompts: rendering, and every kind of bad record skipped and counted by reason."""

import json

import pytest

from recipe_jax.data.pipeline import Source
from recipe_jax.data.prompts import PromptDataConfig, PromptPipeline, prompt_example_fn
from recipe_jax.data.sources import JsonlSource
from recipe_jax.data.tokenizer import train_tokenizer
from recipe_jax.demo.addition import make_records


@pytest.fixture(scope="module")
def tokenizer():
  return train_tokenizer([json.dumps(r) for r in make_records(50, digits=2)], vocab_size=300)


def _write(tmp_path, lines):
  path = tmp_path / "prompts.jsonl"
  path.write_text("\n".join(lines) + "\n")
  return JsonlSource(str(path))


def test_bad_prompts_are_skipped_and_counted_by_reason(tmp_path, tokenizer):
  user = {"role": "user", "content": "What is 2 + 3?"}
  good = {"messages": [user, {"role": "assistant", "content": "\\boxed{5}"}],
          "reward": {"verifier": "math", "reference": "5"}}
  lines = [json.dumps(good),
           json.dumps({"messages": [user]}),                                                      # no reward
           json.dumps({"messages": [user], "reward": {"verifier": "math"}}),                      # no reference
           json.dumps({"messages": [user], "reward": {"verifier": "math", "reference": {"a": 1}}}),  # not a label
           json.dumps({"messages": [user], "reward": {"verifier": "no.such.module", "reference": "5"}}),
           json.dumps({"messages": [{"role": "system", "content": "hi"}], "reward": good["reward"]}),  # no user turn
           json.dumps({"messages": [{"role": "user", "content": "1 + " * 200}], "reward": good["reward"]}),
           "{not json",
           json.dumps(dict(good, messages=[{"role": "user", "content": "What is 7 + 1?"}],
                           reward={"verifier": "math", "reference": 8}))]
  fn = prompt_example_fn(tokenizer, max_prompt_len=64)
  pipeline = PromptPipeline(Source("p", _write(tmp_path, lines)), fn,
                            PromptDataConfig(max_prompt_len=64, num_epochs=1, shuffle=False, read_threads=1))
  prompts = pipeline.take(10)
  assert [p.index for p in prompts] == [0, 8]
  # the trailing assistant answer is not part of the prompt, which ends with the generation prompt
  want = tokenizer.apply_chat_template([user], tokenize=True, add_generation_prompt=True, enable_thinking=False,
                                       return_dict=False)
  assert list(prompts[0].ids) == list(want)
  assert prompts[0].reward.verifier == "recipe_jax.rewards.math" and prompts[1].reward.reference == "8"
  dropped = pipeline.report().to_state()["dropped"]["p"]
  assert dropped == {"missing_reward_reference": 2, "malformed_reward_reference": 1, "unknown_verifier": 1,
                     "no_user_turn": 1, "over_length": 1, "invalid_json": 1}, dropped
  assert pipeline.take(1) == []


def test_prompt_position_resumes_from_state(tmp_path, tokenizer):
  records = make_records(12, digits=2, seed=5)
  lines = [json.dumps({"messages": [r["messages"][0]], "reward": {"verifier": "math", "reference": "1"}})
           for r in records]
  cfg = PromptDataConfig(max_prompt_len=64, read_threads=1, seed=3)
  fn = prompt_example_fn(tokenizer, max_prompt_len=64)
  a = PromptPipeline(Source("p", _write(tmp_path, lines)), fn, cfg)
  a.take(5)
  state = json.loads(json.dumps(a.get_state()))
  rest = [p.ids for p in a.take(10)]
  b = PromptPipeline(Source("p", _write(tmp_path, lines)), fn, cfg)
  b.set_state(state)
  assert [p.ids for p in b.take(10)] == rest
  other = PromptPipeline(Source("p", _write(tmp_path, lines)), fn, PromptDataConfig(max_prompt_len=64, seed=4))
  with pytest.raises(ValueError, match="seed"):
    other.set_state(state)
