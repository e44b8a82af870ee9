"""RL demo on the tiny Mixture-of-Experts model with routing replay, on CPU.

The starting point is the MoE SFT demo stopped early, so that it solves the task only sometimes:
  recipe-jax sft --config configs/sft/demo_addition_moe.py --set steps=450 --set optimizer.schedule=constant \\
      --set model.moe_impl=dense --set output_dir=runs/sft_demo_addition_moe_450
  recipe-jax rl --config configs/rl/demo_addition_moe.py
Routing replay is on (the MoE default): the trainer's forward uses the experts the engine
chose for every prompt and response token, and the metrics report the trainer/sampler
log-prob gap with it (`rl/sampler_abs_diff`) and without it (`..._without_replay`).
"""

import dataclasses
import pathlib

from recipe_jax.config import load_config_file
from recipe_jax.stages.rl import RlConfig


def get_config() -> RlConfig:
  dense = load_config_file(pathlib.Path(__file__).parent / "demo_addition.py")
  return dataclasses.replace(dense, output_dir="runs/rl_demo_addition_moe",
                             init_from="runs/sft_demo_addition_moe_450/hf", routing_replay=True,
                             moe_impl="dense")  # on CPU the dense expert loop beats ragged_dot for 8 tiny experts
