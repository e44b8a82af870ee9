"""The RL step benchmark runs both modes (one tiny preset, two steps) and reports every phase."""

import json
import math

import pytest

from recipe_jax.bench import rl


def test_rl_benchmark_reports_every_phase_in_both_modes(tmp_path):
  result = rl.run(presets=("tiny-dense",), steps=2, skip=1, prompts_per_step=2, group_size=2, max_new_tokens=6,
                  reward_workers=1, workdir=tmp_path)
  assert [(c["preset"], c["mode"]) for c in result["columns"]] == [("tiny-dense", "sync"), ("tiny-dense", "async")]
  for column in result["columns"]:
    for label, key, _ in rl.SPLITS:
      assert math.isfinite(column[key]) and column[key] >= 0, (column["mode"], label, column[key])
    assert column["time/generate_s"] > 0 and column["time/train_s"] > 0 and column["time/step_s"] > 0
    assert column["rollout/response_tokens"] <= 2 * 2 * 6
  sync, async_ = result["columns"]
  assert sync["time/weight_push_s"] > 0 and async_["time/weight_push_s"] > 0   # the async extra step is left out
  assert sync["time/rollout_wait_s"] >= sync["time/generate_s"]                  # sync waits for its own rollouts
  report = rl.format_report(result)
  for label, _, _ in rl.SPLITS:
    assert f"| {label} |" in report
  assert "| phase | tiny-dense sync | tiny-dense async |" in report
  # the async run made one step more than it averaged
  rows = (tmp_path / "runs" / "tiny-dense_async" / "metrics" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(r)["step"] for r in rows] == [1, 2, 3]


def test_verifier_rewards_even_length_responses():
  assert rl.score("ab", "-").value == 1.0 and rl.score("abc", "-").value == 0.0
  assert rl.score("abc", "-").reason == "odd_length"


def test_step_means_names_a_step_without_a_phase(tmp_path):
  path = tmp_path / "metrics.jsonl"
  full = {key: 1.0 for _, key, _ in rl.SPLITS}
  empty = {k: v for k, v in full.items() if k != "time/train_s"}
  path.write_text("\n".join(json.dumps(dict(r, step=i)) for i, r in enumerate([full, full, empty], start=1)))
  assert rl.step_means(path, first=2, last=2)["time/train_s"] == 1.0
  with pytest.raises(ValueError, match=r"step\(s\) \[3\] have no 'time/train_s'"):
    rl.step_means(path, first=2, last=3)
  with pytest.raises(ValueError, match="steps 2-4 wanted"):
    rl.step_means(path, first=2, last=4)
