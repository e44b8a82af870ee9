"""Rufus-Air coding RL (rufus_air_coding.py) on CPU: the same algorithm settings, tiny sizes, other data.

Run first the MoE SFT demo stopped early, as for configs/rl/demo_addition_moe.py (a model that solves
the task only sometimes; routing replay needs an MoE model):
  recipe-jax sft --config configs/sft/demo_addition_moe.py --set steps=450 --set optimizer.schedule=constant \\
      --set model.moe_impl=dense --set output_dir=runs/sft_demo_addition_moe_450
  recipe-jax rl --config configs/rl/rufus_air_coding_tiny.py
The data differs: a config file cannot make a local code-problem file, so this runs on the
addition demo's prompts (`demo`), whose math verifier gives the same kind of reward as the code
verifier, binary (1 only for a correct answer). Kept: many samples per prompt (4 prompts x 16
here, 128 x 64 in the recipe), truncated responses masked out of the loss, groups with equal
rewards dropped, no band, GSPO loss, 4 mini-batches, routing replay. Changed for CPU: responses of
at most 16 tokens, float32 on one device with the dense expert loop, learning rate 1e-4, 20 steps.
"""

import pathlib

from recipe_jax.config import load_config_file
from recipe_jax.stages.rl import RlConfig, cpu_variant


def get_config() -> RlConfig:
  full = load_config_file(pathlib.Path(__file__).parent / "rufus_air_coding.py")
  return cpu_variant(full, output_dir="runs/rufus_air_coding_tiny",
                     init_from="runs/sft_demo_addition_moe_450/hf", prompts_per_step=4, group_size=16, moe=True)
