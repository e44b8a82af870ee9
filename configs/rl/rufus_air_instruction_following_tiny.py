"""Rufus-Air instruction-following RL (rufus_air_instruction_following.py) on CPU: same GRPO settings, other data.

Run first the MoE SFT demo stopped early, as for configs/rl/demo_addition_moe.py (a model that solves
the task only sometimes, so groups fall inside the band; routing replay needs an MoE model):
  recipe-jax sft --config configs/sft/demo_addition_moe.py --set steps=450 --set optimizer.schedule=constant \\
      --set model.moe_impl=dense --set output_dir=runs/sft_demo_addition_moe_450
  recipe-jax rl --config configs/rl/rufus_air_instruction_following_tiny.py
The data differs: a config file cannot make a local instruction-following prompt file, so this
runs on the addition demo's prompts (`demo`); the math verifier's reward is binary all-or-nothing
like the recipe's all-rubrics-must-pass reward (one check: the boxed sum). Kept: GRPO (token-level
ratio, clip 0.2, sequence-mean token-mean loss), groups above a 0.8 pass rate dropped, dynamic
sampling, 4 mini-batches, routing replay. Changed for CPU: 8 prompts x 8 responses of at most 16
tokens, float32 on one device with the dense expert loop, learning rate 1e-4, 20 steps.
"""

import pathlib

from recipe_jax.config import load_config_file
from recipe_jax.stages.rl import RlConfig, cpu_variant


def get_config() -> RlConfig:
  full = load_config_file(pathlib.Path(__file__).parent / "rufus_air_instruction_following.py")
  return cpu_variant(full, output_dir="runs/rufus_air_instruction_following_tiny",
                     init_from="runs/sft_demo_addition_moe_450/hf", prompts_per_step=8, group_size=8, moe=True)
