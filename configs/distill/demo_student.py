"""Distillation demo: the student (2 layers, width 128, 550 steps of a 700-step schedule on both domains), on CPU.

Run first: python -m recipe_jax.demo.distill_domains --out runs/distill_demo
Then:      recipe-jax sft --config configs/distill/demo_student.py
Hardware: 2 CPU cores, about 6 minutes. Writes runs/distill_demo/student/hf.
"""

from recipe_jax.demo.distill_domains import demo_sft_config
from recipe_jax.stages.sft import SftConfig


def get_config() -> SftConfig:
  return demo_sft_config("student", ("addition", "subtraction"), student=True)
