"""Group-relative advantages: score each of a prompt's G responses against its siblings.

Group-based RL (GRPO, GSPO, RLOO, Dr. GRPO) draws G responses y_1..y_G for one
prompt, rewards each with a scalar r_i, and uses the group itself as the
baseline instead of a learned value function. With the group mean
mu = (1/G) sum_j r_j:

  normalized     A_i = (r_i - mu) / (sigma + eps)                  (GRPO, Shao et al. 2024, sec. 4.1.2)
                 sigma = sqrt(sum_j (r_j - mu)^2 / (G - ddof))
  mean_only      A_i = r_i - mu                                    (Dr. GRPO, Liu et al. 2025)
  leave_one_out  A_i = r_i - (1/(G-1)) sum_{j != i} r_j            (RLOO, Ahmadian et al. 2024)
                     = (G / (G-1)) (r_i - mu)

Projects differ on the normalized form's constants: verl divides by the sample
standard deviation (ddof = 1) plus eps = 1e-6; open-instruct by the population
one (ddof = 0) plus eps = 1e-8. Both are reachable through `std_ddof` and
`eps`; the defaults follow verl. A group whose rewards are all equal gets
A_i = 0 in every mode (it carries no learning signal; dynamic sampling drops
such groups before they get here).

Dr. GRPO drops the division by sigma because it up-weights prompts that are
too easy or too hard (small sigma); Rufus-Air's search-agent stage
(stage 7) uses the same mean-only advantages.

The result is one advantage per response, `[num_groups, G]`; broadcasting it
over the response's tokens is the stage's job.

References:
  Shao et al. (2024). DeepSeekMath: Pushing the Limits of Mathematical Reasoning
  in Open Language Models (GRPO). arXiv:2402.03300, section 4.1.2.
  Liu et al. (2025). Understanding R1-Zero-Like Training: A Critical Perspective
  (Dr. GRPO). arXiv:2503.20783.
  Ahmadian et al. (2024). Back to Basics: Revisiting REINFORCE Style Optimization
  for Learning from Human Feedback in LLMs (RLOO). arXiv:2402.14740.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

AdvantageMode = Literal["normalized", "mean_only", "leave_one_out"]
ADVANTAGE_MODES: tuple[str, ...] = ("normalized", "mean_only", "leave_one_out")


def group_advantages(rewards: Float[ArrayLike, "B G"], *, mode: AdvantageMode = "normalized",
                     std_ddof: int = 1, eps: float = 1e-6) -> Float[Array, "B G"]:
  """Advantages of G responses per prompt from their rewards (formulas in the module docstring).

  Args:
    rewards: `[num_groups, G]` scalar reward of each response, one row per prompt (NumPy or JAX).
    mode: `normalized` (GRPO), `mean_only` (Dr. GRPO) or `leave_one_out` (RLOO).
    std_ddof: delta degrees of freedom of sigma in `normalized`: 1 (verl) or 0 (open-instruct).
    eps: added to sigma in `normalized` (verl 1e-6, open-instruct 1e-8).

  Returns:
    `[num_groups, G]` float32 advantages; constants (no gradient flows back to the rewards).

  Example:
    >>> group_advantages([[1.0, 0.0, 0.0, 1.0]], mode="mean_only").tolist()
    [[0.5, -0.5, -0.5, 0.5]]
  """
  if mode not in ADVANTAGE_MODES:
    raise ValueError(f"advantage mode {mode!r} is not one of {ADVANTAGE_MODES}")
  r = jnp.asarray(rewards, jnp.float32)
  if r.ndim != 2:
    raise ValueError(f"rewards must be [num_groups, G], got shape {tuple(np.shape(rewards))}")
  group_size = r.shape[1]
  if group_size < 1:
    raise ValueError(f"rewards {r.shape} has groups of size 0")
  if eps < 0:
    raise ValueError(f"eps must be >= 0, got {eps}")
  if mode == "normalized" and not 0 <= std_ddof < group_size:
    raise ValueError(f"std_ddof {std_ddof} needs 0 <= std_ddof < G = {group_size} "
                     "(a group of one response has no sample standard deviation)")
  if mode == "leave_one_out" and group_size < 2:
    raise ValueError(f"leave_one_out needs at least 2 responses per group, got G = {group_size}")

  r = jax.lax.stop_gradient(r)
  mu = jnp.mean(r, axis=1, keepdims=True)
  if mode == "normalized":
    sigma = jnp.std(r, axis=1, ddof=std_ddof, keepdims=True)
    return (r - mu) / (sigma + eps)
  if mode == "mean_only":
    return r - mu
  others_mean = (jnp.sum(r, axis=1, keepdims=True) - r) / (group_size - 1)
  return r - others_mean
