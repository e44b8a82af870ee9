"""Distillation demo: the addition teacher (the SFT demo's model, 1000 steps on addition), on CPU.

Run first: python -m recipe_jax.demo.distill_domains --out runs/distill_demo
Then:      recipe-jax sft --config configs/distill/demo_teacher_addition.py
Hardware: 2 CPU cores, about 16 minutes. Writes runs/distill_demo/teacher_addition/hf.
"""

from recipe_jax.demo.distill_domains import demo_sft_config
from recipe_jax.stages.sft import SftConfig


def get_config() -> SftConfig:
  return demo_sft_config("teacher_addition", ("addition",), student=False)
