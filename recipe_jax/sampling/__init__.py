"""Sampling: a KV-cache engine on the JetStream Engine API, a continuous-batching driver, serving.

`Engine` works without google-jetstream installed; only serving through
JetStream's orchestrator needs it (see `jetstream_compat`).
"""

from recipe_jax.sampling.driver import Completion, generate
from recipe_jax.sampling.engine import DecodeState, Engine, Prefix, StepResult
from recipe_jax.sampling.sampler import SamplingParams, sample_tokens

__all__ = ["Completion", "DecodeState", "Engine", "Prefix", "SamplingParams", "StepResult", "generate",
           "sample_tokens"]
