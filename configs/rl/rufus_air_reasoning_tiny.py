"""Rufus-Air reasoning RL (rufus_air_reasoning.py) on CPU: the same GSPO and filtering settings, tiny sizes.

Run first the MoE SFT demo stopped early, as for configs/rl/demo_addition_moe.py (a model that solves
the task only sometimes, so groups fall inside the band; routing replay needs an MoE model, as
GLM-4.5-Air is):
  recipe-jax sft --config configs/sft/demo_addition_moe.py --set steps=450 --set optimizer.schedule=constant \\
      --set model.moe_impl=dense --set output_dir=runs/sft_demo_addition_moe_450
  recipe-jax rl --config configs/rl/rufus_air_reasoning_tiny.py
Kept from the full recipe: sequence-level ratio clipped to (1 - 3e-4, 1 + 4e-4), sequence-mean
token-mean loss, 4 mini-batches, learnability band (0, 0.8] with dynamic sampling, routing replay,
masked truncation. Changed for CPU: the addition demo's prompts (math verifier, boxed answers;
`demo`) instead of math/science/puzzle files, 8 prompts x 8 responses of at most 16 tokens,
float32 on one device with the dense expert loop, learning rate 1e-4 (the tiny model's scale), 20 steps.
"""

import pathlib

from recipe_jax.config import load_config_file
from recipe_jax.stages.rl import RlConfig, cpu_variant


def get_config() -> RlConfig:
  full = load_config_file(pathlib.Path(__file__).parent / "rufus_air_reasoning.py")
  return cpu_variant(full, output_dir="runs/rufus_air_reasoning_tiny",
                     init_from="runs/sft_demo_addition_moe_450/hf", prompts_per_step=8, group_size=8, moe=True)
