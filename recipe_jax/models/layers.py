"""Small building blocks: parameter creation, RMSNorm, rotary embeddings, SwiGLU.

Parameters are `nnx.Param`s holding plain arrays; each module documents the
shape of every parameter with the axis letters of `models.config`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from recipe_jax.models.config import ModelConfig


def dtype_of(name: str) -> jnp.dtype:
  return jnp.dtype(name)


class ParamKeys:
  """Hands out a fresh PRNG key per parameter: fold_in(key, 1), fold_in(key, 2), ...

  (A plain counter rather than `nnx.Rngs`, whose per-call bookkeeping made
  tracing a 92-layer model take most of a minute.)
  """

  def __init__(self, seed_or_key):
    key = seed_or_key
    if isinstance(seed_or_key, int):
      key = jax.random.key(seed_or_key)
    self.key, self.count = key, 0

  def __call__(self) -> jax.Array:
    self.count += 1
    return jax.random.fold_in(self.key, self.count)


def normal_param(keys: ParamKeys, shape, cfg: ModelConfig, dtype=None) -> nnx.Param:
  """A weight drawn from N(0, initializer_range^2), as Hugging Face initializes them."""
  dtype = dtype or dtype_of(cfg.param_dtype)
  w = cfg.initializer_range * jax.random.normal(keys(), shape, jnp.float32)
  return nnx.Param(w.astype(dtype))


def ones_param(shape, dtype) -> nnx.Param:
  return nnx.Param(jnp.ones(shape, dtype))


def zeros_param(shape, dtype) -> nnx.Param:
  return nnx.Param(jnp.zeros(shape, dtype))


# ----------------------------------------------------------------------------
# RMSNorm
# ----------------------------------------------------------------------------


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """y = scale * x / sqrt(mean(x^2) + eps), the mean taken in float32 over the last axis."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale.astype(x.dtype) * normed.astype(x.dtype)


class RMSNorm(nnx.Module):
  """RMSNorm over the last axis; `scale` has the size of that axis."""

  def __init__(self, size: int, cfg: ModelConfig):
    self.scale = ones_param((size,), dtype_of(cfg.param_dtype))
    self.eps = cfg.rms_norm_eps

  def __call__(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.scale[...], self.eps)


# ----------------------------------------------------------------------------
# Rotary embeddings
# ----------------------------------------------------------------------------


def rope_cos_sin(positions: jax.Array, rotary_dim: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
  """cos and sin tables `[B, T, rotary_dim]` for integer `positions` `[B, T]`.

  Frequencies 1 / theta^(2i / rotary_dim), i < rotary_dim / 2, repeated twice
  (the rotate-half layout of Hugging Face's Llama-family models).
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates the first `cos.shape[-1]` channels of `x` `[B, T, heads, H]`; the rest pass through."""
  rot = cos.shape[-1]
  x_rot, x_pass = x[..., :rot], x[..., rot:]
  half = rot // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)


# ----------------------------------------------------------------------------
# SwiGLU MLP
# ----------------------------------------------------------------------------


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
  """down(silu(x @ gate) * (x @ up)) for `x` `[..., D]`, `gate`/`up` `[D, F]`, `down` `[F, D]`."""
  h = jax.nn.silu(x @ gate.astype(x.dtype)) * (x @ up.astype(x.dtype))
  return h @ down.astype(x.dtype)


class MLP(nnx.Module):
  """SwiGLU feed-forward. Params: gate_proj `[D, F]`, up_proj `[D, F]`, down_proj `[F, D]`."""

  def __init__(self, cfg: ModelConfig, hidden: int, keys: ParamKeys):
    d = cfg.hidden_size
    self.gate_proj = normal_param(keys, (d, hidden), cfg)
    self.up_proj = normal_param(keys, (d, hidden), cfg)
    self.down_proj = normal_param(keys, (hidden, d), cfg)

  def __call__(self, x: jax.Array) -> jax.Array:
    return swiglu(x, self.gate_proj[...], self.up_proj[...], self.down_proj[...])
