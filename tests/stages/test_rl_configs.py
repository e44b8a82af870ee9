"""The RL recipe configs carry their recipes' numbers, and each CPU variant keeps its recipe's algorithm.

Building every config file is tests/test_config.py's job; nothing here runs RL.
"""

import dataclasses
import pathlib

import pytest

from recipe_jax.config import load_config_file

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs" / "rl"
RECIPES = ("rufus_air_reasoning", "rufus_air_coding", "rufus_air_instruction_following", "nebulaexp_grpo")
# Sizes the CPU variants may change; every other loss and rollout field is the algorithm.
LOSS_SIZES = {"logprob_chunk_size", "max_segments"}
ROLLOUT_SIZES = {"group_size", "max_new_tokens", "reward_workers", "reward_deadline_s"}


def load(name: str):
  return load_config_file(CONFIGS / f"{name}.py")


def test_rufus_air_reasoning_is_gspo_with_the_learnability_band():
  cfg = load("rufus_air_reasoning")
  assert (cfg.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (256, 16, 30_000)
  assert cfg.loss.ratio_level == "sequence" and cfg.loss.aggregation == "sequence_mean_token_mean"
  assert (cfg.loss.clip_low, cfg.loss.clip_high) == (3e-4, 4e-4)
  assert cfg.rollout.band == (0.0, 0.8) and cfg.rollout.dynamic_sampling and cfg.rollout.max_extra_rounds > 0
  assert cfg.routing_replay is True and cfg.num_mini_batches == 4
  assert {s.name for s in cfg.sources} == {"math", "science", "puzzles"}
  assert dict((s.name, s.weight) for s in cfg.sources)["math"] == 0.835
  assert cfg.loss.kl_coef == 0 and cfg.loss.kl_reward_coef == 0 and cfg.dtype == "bfloat16"


def test_rufus_air_coding_samples_64_per_prompt_and_masks_truncation():
  cfg = load("rufus_air_coding")
  assert (cfg.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (128, 64, 65_536)
  assert cfg.rollout.truncation == "mask" and cfg.rollout.pass_threshold == 1.0 and cfg.rollout.band is None
  assert cfg.routing_replay is True
  assert cfg.row_len >= 65_536 + cfg.prompts.max_prompt_len


def test_rufus_air_instruction_following_is_grpo_dropping_groups_above_80_percent():
  cfg = load("rufus_air_instruction_following")
  assert cfg.loss.ratio_level == "token" and (cfg.loss.clip_low, cfg.loss.clip_high) == (0.2, 0.2)
  assert cfg.rollout.band == (0.0, 0.8) and cfg.rollout.pass_threshold == 1.0
  assert {s.name: s.weight for s in cfg.sources} == {"if_single_turn": 14.0, "if_multi_turn": 13.0}
  assert cfg.routing_replay is True


def test_nebulaexp_grpo_has_group_5_kl_loss_and_four_mini_batches():
  cfg = load("nebulaexp_grpo")
  assert cfg.rollout.group_size == 5 and cfg.prompts_per_step == 256
  assert cfg.prompts_per_step // cfg.num_mini_batches == 64 and cfg.ppo_epochs == 1
  assert cfg.rollout.max_new_tokens == 16_384
  assert cfg.loss.kl_coef == 0.001 and cfg.loss.kl_estimator == "k3" and cfg.loss.kl_reward_coef == 0
  assert cfg.loss.uses_reference and cfg.loss.ratio_level == "token"
  assert not cfg.rollout.dynamic_sampling and cfg.rollout.band is None   # pass-rate 0/1 prompts removed offline
  assert cfg.prompts.num_epochs == 6 and cfg.steps == 6 * 53_000 // 256
  assert cfg.optimizer.total_steps == cfg.steps * cfg.updates_per_step


@pytest.mark.parametrize("name", RECIPES)
def test_tiny_variant_keeps_the_recipe_algorithm_at_cpu_size(name):
  full, tiny = load(name), load(f"{name}_tiny")
  for field in dataclasses.fields(full.loss):
    if field.name not in LOSS_SIZES:
      assert getattr(tiny.loss, field.name) == getattr(full.loss, field.name), field.name
  for field in dataclasses.fields(full.rollout):
    if field.name not in ROLLOUT_SIZES:
      assert getattr(tiny.rollout, field.name) == getattr(full.rollout, field.name), field.name
  assert tiny.num_mini_batches == full.num_mini_batches and tiny.ppo_epochs == full.ppo_epochs
  assert tiny.routing_replay == full.routing_replay and tiny.async_generation == full.async_generation
  # NebulaExp keeps its rollout size of 5; the others shrink the group
  assert tiny.rollout.group_size == full.rollout.group_size if name == "nebulaexp_grpo" else \
      2 <= tiny.rollout.group_size < full.rollout.group_size
  # CPU-sized: one device, float32, the demo task, the RL demos' early-stopped SFT checkpoints
  assert tiny.mesh.shape == (1, 1, 1, 1) and tiny.dtype == "float32" and tiny.demo is not None
  demo = load("demo_addition" if name == "nebulaexp_grpo" else "demo_addition_moe")  # replay needs the MoE one
  assert tiny.init_from == demo.init_from and tiny.moe_impl == demo.moe_impl
  assert tiny.prompts_per_step * tiny.rollout.group_size <= 128 and tiny.row_len <= 64
  assert tiny.prompts_per_step % tiny.num_mini_batches == 0
  assert tiny.output_dir != full.output_dir and tiny.output_dir.startswith("runs/")


def test_every_full_recipe_has_a_tiny_variant_and_no_tiny_is_orphaned():
  names = {p.stem for p in CONFIGS.glob("*.py")}
  tiny = {n.removesuffix("_tiny") for n in names if n.endswith("_tiny")}
  assert set(RECIPES) <= names and tiny <= names
  assert set(RECIPES) <= tiny
