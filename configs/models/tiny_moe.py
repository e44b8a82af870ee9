"""Tiny Qwen3-MoE-style model, one forward pass on CPU.

Run: recipe-jax models --config configs/models/tiny_moe.py
Hardware: any CPU; a few seconds. Add --set mesh.expert=2 with two or more devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8 simulates eight).
"""

from recipe_jax.cli import ForwardDemoConfig
from recipe_jax.models.presets import get_preset
from recipe_jax.parallel.mesh import MeshConfig


def get_config() -> ForwardDemoConfig:
  return ForwardDemoConfig(model=get_preset("tiny-moe"), mesh=MeshConfig(fsdp=1), batch_size=8,
                           seq_len=64)
