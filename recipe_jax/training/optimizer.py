"""Optimizer: global-norm clipping, then AdamW on a warmup + decay learning-rate schedule."""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import optax

from recipe_jax.config import require


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with decoupled weight decay (not applied to norms and biases) and a schedule.

  The learning rate rises linearly from 0 over `warmup_steps`, then follows
  `schedule` (cosine or linear decay to `end_lr_ratio * learning_rate` at
  `total_steps`, or constant).
  """

  learning_rate: float = 5e-6
  schedule: Literal["cosine", "linear", "constant"] = "cosine"
  warmup_steps: int = 0
  warmup_ratio: float = 0.0
  total_steps: int = 1000
  end_lr_ratio: float = 0.0
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.0
  clip_norm: float = 1.0

  def __post_init__(self):
    require(self.learning_rate > 0, "optimizer.learning_rate", "must be positive")
    require(self.total_steps >= 1, "optimizer.total_steps", "must be >= 1")
    require(0 <= self.warmup_ratio < 1, "optimizer.warmup_ratio", "must be in [0, 1)")
    require(0 <= self.warmup_steps <= self.total_steps, "optimizer.warmup_steps",
            f"must be in [0, total_steps={self.total_steps}]")
    require(0 <= self.end_lr_ratio <= 1, "optimizer.end_lr_ratio", "must be in [0, 1]")
    require(self.clip_norm >= 0, "optimizer.clip_norm", "must be >= 0 (0 disables clipping)")

  @property
  def warmup(self) -> int:
    return self.warmup_steps or int(self.warmup_ratio * self.total_steps)


def learning_rate_schedule(cfg: OptimizerConfig) -> optax.Schedule:
  peak, warmup = cfg.learning_rate, cfg.warmup
  decay_steps = max(cfg.total_steps - warmup, 1)
  end = peak * cfg.end_lr_ratio
  if cfg.schedule == "cosine":
    decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=cfg.end_lr_ratio)
  elif cfg.schedule == "linear":
    decay = optax.linear_schedule(peak, end, decay_steps)
  else:
    decay = optax.constant_schedule(peak)
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def _decay_mask(params):
  """Weight decay on matrices only: norms' scales and biases (1-D) are left alone."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  parts = []
  if cfg.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=_decay_mask))
  return optax.chain(*parts)
