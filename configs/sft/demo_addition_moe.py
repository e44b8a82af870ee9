"""SFT demo on a tiny Mixture-of-Experts model (Qwen3-MoE layout): the addition task, on CPU.

Run: recipe-jax sft --config configs/sft/demo_addition_moe.py
The starting point of the MoE RL demo with routing replay (configs/rl/demo_addition_moe.py).
Same data, tokenizer and schedule as configs/sft/demo_addition.py; 8 experts, 2 per token.
"""

from recipe_jax.config import load_config_file
from recipe_jax.models.presets import get_preset
from recipe_jax.stages.sft import SftConfig


def get_config() -> SftConfig:
  import dataclasses
  import pathlib

  dense = load_config_file(pathlib.Path(__file__).parent / "demo_addition.py")
  model = get_preset("tiny-moe").replace(vocab_size=384, hidden_size=128, intermediate_size=384,
                                         moe_intermediate_size=192, num_layers=3, num_heads=4, num_kv_heads=2,
                                         head_dim=32, router_aux_loss_coef=0.01)
  return dataclasses.replace(dense, model=model, output_dir="runs/sft_demo_addition_moe")
