"""Decoder-only transformers: Qwen3, Qwen3-MoE and GLM-4.5 from one typed config."""

from recipe_jax.models.config import ModelConfig
from recipe_jax.models.params import ParamCounts, init_params, param_counts
from recipe_jax.models.presets import PRESETS, get_preset
from recipe_jax.models.transformer import (ModelOutput, Transformer, abstract_params, build_model,
                                           forward, positions_from_segments)

__all__ = [
    "ModelConfig", "ModelOutput", "PRESETS", "ParamCounts", "Transformer", "abstract_params",
    "build_model", "forward", "get_preset", "init_params", "param_counts", "positions_from_segments",
]
