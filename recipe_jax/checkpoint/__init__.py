"""Checkpoint import and export (Hugging Face safetensors: `checkpoint.hf`)."""

from recipe_jax.checkpoint.hf import CheckpointError, config_from_hf, config_to_hf, load, save

__all__ = ["CheckpointError", "config_from_hf", "config_to_hf", "load", "save"]
