"""NebulaExp GRPO (nebulaexp_grpo.py) on CPU: rollout size 5, KL loss, 4 mini-batches per rollout batch.

Run first the SFT demo stopped early, as for configs/rl/demo_addition.py (a model that solves the
task only sometimes, so groups have a reward spread):
  recipe-jax sft --config configs/sft/demo_addition.py --set steps=400 \\
      --set optimizer.schedule=constant --set output_dir=runs/sft_demo_addition_400
  recipe-jax rl --config configs/rl/nebulaexp_grpo_tiny.py
Kept from the full recipe: 5 responses per prompt, the KL loss (k3, coefficient 0.001), token-
ratio clip 0.2, token-mean loss, each rollout batch split into 4 mini-batches (256 / 64 there,
16 / 4 prompts here), no online group filter. Changed for CPU: the addition demo's prompts
(`demo`, math verifier) instead of the 53K-prompt pool, responses of at most 16 tokens, float32
on one device, learning rate 1e-4 (the tiny model's scale), 20 steps.
"""

import pathlib

from recipe_jax.config import load_config_file
from recipe_jax.stages.rl import RlConfig, cpu_variant


def get_config() -> RlConfig:
  full = load_config_file(pathlib.Path(__file__).parent / "nebulaexp_grpo.py")
  return cpu_variant(full, output_dir="runs/nebulaexp_grpo_tiny", init_from="runs/sft_demo_addition_400/hf",
                     prompts_per_step=16, engine_slots=80)
