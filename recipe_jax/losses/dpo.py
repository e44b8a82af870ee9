"""Preference-optimization losses on (chosen, rejected) pairs: DPO, length-normalized DPO, SimPO, IPO.

A pair is a prompt x with a chosen response y_c and a rejected one y_r. They are
stacked on one pair axis `P` of size 2 (index 0 chosen, 1 rejected). With
log pi(y|x) = sum_t m_t log pi(y_t | x, y_<t) over the response tokens (mask m),
|y| = sum_t m_t the response length, and the log-ratio against the frozen
reference model

  rho(y) = log pi_theta(y|x) - log pi_ref(y|x),

each loss scores both responses with an implicit reward r(y) and penalizes
a small margin h = r(y_c) - r(y_r):

  sigmoid            r(y) = beta rho(y)
                     l = -(1 - eps) log sigma(h) - eps log sigma(-h)            (DPO eq. 7; cDPO for eps > 0)
  length_normalized  r(y) = (beta / |y|) rho(y)
                     l = -log sigma(h)                                         (Tülu 3, section 5)
  simpo              r(y) = (beta / |y|) log pi_theta(y|x)       (no reference)
                     l = -log sigma(h - gamma)                                  (SimPO eq. 6)
  ipo                r(y) = rho(y) / |y|
                     l = (h - 1 / (2 tau))^2                                    (IPO eq. 17, averaged)

The batch loss is L = (1 / N) sum_i l_i over the pairs i of this call, where N
is the number of real pairs (both halves with at least one response token) in
the whole optimizer step, passed in as `num_pairs`; padding pairs contribute
nothing. Summing L over micro-batches therefore gives the step's mean loss and
its exact gradient however the step is split. Reference log-probs are constants
(`stop_gradient`): only the policy log-probs receive gradient.

References:
  Rafailov et al. (2023). Direct Preference Optimization: Your Language Model is
  Secretly a Reward Model. arXiv:2305.18290, eq. 7.
  Mitchell (2023). A note on DPO with noisy preferences and relationship to IPO
  (conservative DPO, label smoothing eps). https://ericmitchell.ai/cdpo.pdf
  Azar et al. (2023). A General Theoretical Paradigm to Understand Learning from
  Human Preferences (IPO). arXiv:2310.12036, eq. 17.
  Meng, Xia and Chen (2024). SimPO: Simple Preference Optimization with a
  Reference-Free Reward. arXiv:2405.14734, eq. 6.
  Lambert et al. (2024). Tülu 3: Pushing Frontiers in Open Language Model
  Post-Training. arXiv:2411.15124, section 5 (length-normalized DPO, beta = 5).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

PreferenceLoss = Literal["sigmoid", "length_normalized", "simpo", "ipo"]
PREFERENCE_LOSSES: tuple[str, ...] = ("sigmoid", "length_normalized", "simpo", "ipo")
USES_REFERENCE = {"sigmoid": True, "length_normalized": True, "simpo": False, "ipo": True}


class DpoMetrics(NamedTuple):
  """Means over the step's real pairs, each already divided by `num_pairs` (so they add up)."""

  reward_accuracy: jax.Array   # fraction of pairs with margin h > 0
  margin: jax.Array            # h = r(y_c) - r(y_r)
  chosen_reward: jax.Array     # r(y_c)
  rejected_reward: jax.Array   # r(y_r)
  chosen_logratio: jax.Array   # rho(y_c) (summed over tokens; 0 without a reference)
  rejected_logratio: jax.Array
  chosen_logp: jax.Array       # log pi_theta(y_c|x), summed over tokens
  rejected_logp: jax.Array
  num_pairs: jax.Array         # real pairs in this call (a count, not a mean)


def sequence_logps(token_logprobs: Float[Array, "B P T"],
                   loss_mask: Float[Array, "B P T"]) -> tuple[jax.Array, jax.Array]:
  """`(log pi(y|x), |y|)`, both `[B, P]`: masked sums of token log-probs and of the mask."""
  mask = loss_mask.astype(jnp.float32)
  return jnp.sum(token_logprobs.astype(jnp.float32) * mask, axis=-1), jnp.sum(mask, axis=-1)


def real_pairs(lengths: Float[Array, "B P"]) -> jax.Array:
  """`[B]` 1.0 where both halves of the pair have at least one response token, else 0.0."""
  return jnp.all(lengths > 0, axis=-1).astype(jnp.float32)


def count_pairs(loss_mask: Float[Array, "B P T"]) -> jax.Array:
  """N: real pairs in a batch (the step-global normalizer of `dpo_loss`)."""
  return real_pairs(jnp.sum(loss_mask.astype(jnp.float32), axis=-1)).sum()


def _check(policy, mask, reference, needs_reference):
  if policy.ndim != 3 or policy.shape[1] != 2 or mask.shape != policy.shape:
    raise ValueError(f"policy log-probs {policy.shape} and loss mask {mask.shape} must both be [B, 2, T]")
  if needs_reference:
    if reference is None:
      raise ValueError("this loss needs reference log-probs [B, 2]")
    if reference.shape != policy.shape[:2]:
      raise ValueError(f"reference log-probs {reference.shape} must be [B, 2] = {policy.shape[:2]}")


def dpo_loss(policy_logprobs: Float[Array, "B P T"], loss_mask: Float[Array, "B P T"],
             reference_logps: Float[Array, "B P"] | None = None, *, loss_type: PreferenceLoss = "sigmoid",
             beta: float = 0.1, label_smoothing: float = 0.0, gamma: float = 0.0, tau: float = 0.1,
             num_pairs: jax.Array | float | None = None) -> tuple[jax.Array, DpoMetrics]:
  """Preference loss of a batch of pairs (equations in the module docstring).

  Args:
    policy_logprobs: `[B, 2, T]` log pi_theta of each target token; pair axis: chosen, rejected.
    loss_mask: `[B, 2, T]` m_t, 1 on response tokens; a pair with an empty half is padding.
    reference_logps: `[B, 2]` log pi_ref(y|x) summed over the same tokens (computed once
      with the starting model); treated as a constant (`stop_gradient`). Unused by SimPO.
    loss_type: `sigmoid` (DPO), `length_normalized` (Tülu 3), `simpo` or `ipo`.
    beta: inverse temperature of the implicit reward (sigmoid, length_normalized, simpo).
    label_smoothing: eps in [0, 0.5), the assumed probability that a label is flipped (sigmoid).
    gamma: SimPO's target reward margin.
    tau: IPO's regularization strength; the target margin is 1 / (2 tau).
    num_pairs: N, real pairs in the whole optimizer step; defaults to this call's count.

  Returns:
    `(loss, DpoMetrics)`: the loss and the metrics are sums over this call's pairs
    divided by N, so they add up across micro-batches to step means.

  Example:
    >>> lp = jnp.full((1, 2, 3), -1.0); m = jnp.ones((1, 2, 3))
    >>> float(dpo_loss(lp, m, jnp.full((1, 2), -3.0), beta=0.1)[0])  # policy = reference: ln 2
    0.6931...
  """
  if loss_type not in PREFERENCE_LOSSES:
    raise ValueError(f"loss_type {loss_type!r} is not one of {PREFERENCE_LOSSES}")
  if not 0.0 <= label_smoothing < 0.5:
    raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
  if loss_type == "ipo" and tau <= 0:
    raise ValueError(f"IPO needs tau > 0, got {tau}")
  _check(policy_logprobs, loss_mask, reference_logps, USES_REFERENCE[loss_type])

  logp, length = sequence_logps(policy_logprobs, loss_mask)          # [B, 2]
  pair = real_pairs(length)                                           # [B]
  safe_length = jnp.maximum(length, 1.0)
  if USES_REFERENCE[loss_type]:
    ref = jax.lax.stop_gradient(reference_logps.astype(jnp.float32))
    logratio = jnp.where(length > 0, logp - ref, 0.0)
  else:
    logratio = jnp.zeros_like(logp)

  if loss_type == "sigmoid":
    reward = beta * logratio
  elif loss_type == "length_normalized":
    reward = beta * logratio / safe_length
  elif loss_type == "simpo":
    reward = beta * logp / safe_length
  else:  # ipo
    reward = logratio / safe_length
  margin = reward[:, 0] - reward[:, 1]                                # h, [B]

  if loss_type == "sigmoid":
    per_pair = -(1.0 - label_smoothing) * jax.nn.log_sigmoid(margin) \
        - label_smoothing * jax.nn.log_sigmoid(-margin)
  elif loss_type == "length_normalized":
    per_pair = -jax.nn.log_sigmoid(margin)
  elif loss_type == "simpo":
    per_pair = -jax.nn.log_sigmoid(margin - gamma)
  else:
    per_pair = jnp.square(margin - 1.0 / (2.0 * tau))

  n = pair.sum() if num_pairs is None else jnp.asarray(num_pairs, jnp.float32)
  mean = lambda x: jnp.sum(x * pair) / jnp.maximum(n, 1.0)  # noqa: E731
  metrics = DpoMetrics(
      reward_accuracy=mean((margin > 0).astype(jnp.float32)), margin=mean(margin),
      chosen_reward=mean(reward[:, 0]), rejected_reward=mean(reward[:, 1]),
      chosen_logratio=mean(logratio[:, 0]), rejected_logratio=mean(logratio[:, 1]),
      chosen_logp=mean(logp[:, 0]), rejected_logp=mean(logp[:, 1]), num_pairs=pair.sum())
  return mean(per_pair), metrics
