"""Tiny GLM-4.5-style model (sigmoid router with selection bias, expert groups, shared
expert, first layer dense, half-rotary attention), one forward pass.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 recipe-jax models --config configs/models/tiny_glm.py
Hardware: CPU with eight simulated devices, mesh data=1 fsdp=2 expert=2 tensor=2; seconds.
"""

from recipe_jax.cli import ForwardDemoConfig
from recipe_jax.models.presets import get_preset
from recipe_jax.parallel.mesh import MeshConfig


def get_config() -> ForwardDemoConfig:
  return ForwardDemoConfig(model=get_preset("tiny-glm"), mesh=MeshConfig(data=1, fsdp=2, expert=2, tensor=2),
                           batch_size=8, seq_len=64)
