"""The RL stage end to end on tiny random models: async resume is exact, routing replay closes the
trainer/sampler gap, bad prompts are counted, and a step whose groups are all filtered out does
not update the model."""

import json

import jax
import numpy as np
import pytest

from recipe_jax.checkpoint import hf
from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.data.tokenizer import train_tokenizer
from recipe_jax.demo.addition import make_records
from recipe_jax.models import get_preset, init_params
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages import rl
from recipe_jax.stages.rl_objective import PolicyLossConfig
from recipe_jax.stages.rollouts import RolloutConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A tokenizer, tiny dense and MoE checkpoints, and a prompt file with two bad records."""
  root = tmp_path_factory.mktemp("rl")
  records = make_records(40, digits=2, seed=3)
  tok = train_tokenizer([json.dumps(r) for r in records], vocab_size=300)
  for name in ("tiny-dense", "tiny-moe"):
    cfg = get_preset(name).replace(vocab_size=320)
    hf.save(root / name, cfg, init_params(cfg, seed=0))
    tok.save_pretrained(root / name)
  lines = [json.dumps({"messages": [r["messages"][0]], "reward": {"verifier": "rl_toy_reward", "reference": "-"}})
           for r in records[:24]]
  lines.insert(3, json.dumps({"messages": [records[30]["messages"][0]]}))                 # no reward reference
  lines.insert(7, json.dumps({"messages": [records[31]["messages"][0]], "reward": {"verifier": "math"}}))
  (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
  math_lines = [json.dumps({"messages": [r["messages"][0]], "reward": {"verifier": "math", "reference": "7"}})
                for r in records[:8]]
  (root / "math_prompts.jsonl").write_text("\n".join(math_lines) + "\n")
  return root


def _config(workdir, out, model, **overrides):
  base = dict(
      output_dir=str(out), init_from=str(workdir / model), steps=2, prompts_per_step=4,
      sources=(DataSourceConfig(str(workdir / "prompts.jsonl"), name="toy"),),
      prompts=PromptDataConfig(max_prompt_len=32, read_threads=1),
      rollout=RolloutConfig(group_size=4, max_new_tokens=6, max_extra_rounds=1, reward_workers=1, truncation="none"),
      loss=PolicyLossConfig(ratio_level="sequence_token", clip_low=0.2, clip_high=0.28, logprob_chunk_size=32,
                            max_segments=8, kl_coef=0.01),
      optimizer=OptimizerConfig(learning_rate=1e-3, schedule="constant", total_steps=100),
      mesh=MeshConfig(fsdp=1), num_mini_batches=2, engine_slots=8, checkpoint_every=1, progress=False,
      export_hf=False)
  base.update(overrides)
  return rl.RlConfig(**base)


def _rows(out):
  return {r["step"]: r for r in map(json.loads, (out / "metrics" / "metrics.jsonl").read_text().splitlines())}


def test_async_moe_run_resumes_exactly_with_routing_replay(workdir, tmp_path):
  import shutil
  cfg = _config(workdir, tmp_path, "tiny-moe", async_generation=True)
  straight = rl.run(cfg)
  a = _rows(tmp_path)
  # as if killed after step 1: step 2's checkpoint is gone; the resumed run must regenerate step 2's
  # in-flight rollouts from the saved engine weights and prompt position, and train identically
  shutil.rmtree(tmp_path / "checkpoints" / "2")
  resumed = rl.run(cfg, resume=True)
  b = _rows(tmp_path)
  for key in ("loss", "rollout/reward_mean", "rollout/response_tokens", "policy/pg_loss", "policy/kl_loss",
              "grad_norm"):
    assert a[2][key] == b[2][key], key
  assert straight["final"] == resumed["final"]
  assert straight["optimizer_steps"] == resumed["optimizer_steps"] == 4
  # a prompt missing its reward reference is skipped and counted, not scored
  assert set(straight["prompts"]["dropped"]["toy"]) == {"missing_reward_reference"}
  # routing replay: the trainer reproduces the engine's log-probs; without it, routing can differ
  assert a[1]["rl/sampler_abs_diff"] < 1e-4
  assert a[1]["rl/sampler_abs_diff_without_replay"] >= a[1]["rl/sampler_abs_diff"]
  assert {"time/generate_s", "time/score_s", "time/logprob_passes_s", "time/train_s", "time/weight_push_s",
          "policy/clip_frac_low", "policy/entropy"} <= set(a[1])


def test_step_with_every_group_filtered_out_is_reported_and_does_not_update(workdir, tmp_path):
  cfg = _config(workdir, tmp_path, "tiny-dense", steps=1, export_hf=True, loss=PolicyLossConfig(),
                sources=(DataSourceConfig(str(workdir / "math_prompts.jsonl"), name="math"),))
  summary = rl.run(cfg)
  row = _rows(tmp_path)[1]
  assert summary["empty_steps"] == 1 and summary["optimizer_steps"] == 0 and row["rl/empty_step"] == 1.0
  assert row["rollout/dropped/all_equal"] >= 4 and row["rollout/batch_incomplete"] == 1.0
  _, before = hf.load(workdir / "tiny-dense")
  _, after = hf.load(tmp_path / "hf")
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
