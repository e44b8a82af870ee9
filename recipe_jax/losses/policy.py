"""Policy-gradient losses for group RL: PPO/GRPO clipping, GSPO sequence ratios, KL, mismatch correction.

Notation. A response y_i (a sequence: a row, or a segment of a packed row) has
loss tokens t with mask m_t in {0, 1} and |y_i| = sum_t m_t. Per token:
log pi_theta(y_t) = `logprobs` (the only input that receives gradient),
log pi_old(y_t) = `old_logprobs` (the policy that the rollouts are credited to;
None means pi_old = sg(pi_theta), the on-policy single-update case),
log pi_samp(y_t) = `sampler_logprobs` (what the rollout engine reported),
log pi_ref(y_t) = `ref_logprobs`, and the advantage A_t (a sequence's
advantage broadcast over its tokens, or any per-token advantage). sg is
`stop_gradient`; all log-prob inputs other than `logprobs` are constants.

Importance ratio rho_t, by `ratio_level`:

  token           rho_t = exp(log pi_theta(y_t) - log pi_old(y_t))                 (PPO, GRPO)
  sequence        rho_t = s_i = exp((1/|y_i|) sum_{u in i} [log pi_theta(y_u) - log pi_old(y_u)])   (GSPO)
  sequence_token  rho_t = sg(s_i) * pi_theta(y_t) / sg(pi_theta(y_t))                (GSPO-token)

GSPO-token has the value of s_i but sends each token's gradient through its own
log-prob only, so per-token advantages make sense; with an advantage that is
constant over each sequence it has the same loss and gradient as `sequence`.
GSPO clips far tighter than PPO (the paper uses 3e-4 below and 4e-4 above).

Per-token clipped surrogate (PPO eq. 7; asymmetric "clip-higher" bounds from DAPO):

  l_t = max(-rho_t A_t, -clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
  dual clip (c > 1, only where A_t < 0):  l_t = min(l_t, -c A_t)             (dual-clip PPO, Ye et al. 2020)

Worked example, eps_low = eps_high = 0.2, c = 1.5: (rho, A) = (2, 2), (2, -2),
(0.5, 2) give l = -2.4 (clipped above), 3.0 (dual clip caps 4.0), -1.0 (no clip).

Sampler/trainer mismatch correction (truncated importance sampling, Yao et al.
2025) multiplies l_t by a constant weight c_t built from
w_t = pi_old(y_t) / pi_samp(y_t) and the sequence weight W_i = prod_{t in i} w_t:

  none               c_t = 1
  truncate_token     c_t = min(w_t, cap)
  truncate_sequence  c_t = min(W_i, cap)
  mask_token         c_t = 1 if lo <= w_t <= hi else 0
  mask_sequence      c_t = 1 if lo <= W_i <= hi else 0

The weight touches the surrogate only, not the KL term, and a masked token still
counts in the step-global denominators below.

KL to the reference, an estimator of KL(pi_theta || pi_ref) on the policy's own
samples (Schulman 2020), with d_t = log pi_theta(y_t) - log pi_ref(y_t):

  k1 = d_t        k2 = d_t^2 / 2        k3 = exp(-d_t) + d_t - 1  (>= 0)

Aggregation of per-token values v_t (both the surrogate c_t l_t and the KL
term) into a scalar, with step-global M = `num_tokens` (loss tokens in the whole
optimizer step), N = `num_sequences` (sequences with a loss token in the step)
and C = `sum_constant`:

  token_mean                 (1/M) sum_i sum_t v_t                     (DAPO, token-level loss)
  sequence_mean_token_mean   (1/N) sum_i (1/|y_i|) sum_t v_t           (original GRPO, eq. 3)
  sequence_mean_token_sum    (1/N) sum_i sum_t v_t
  constant_sum               (1/C) sum_i sum_t v_t                     (Dr. GRPO; C e.g. the max response length)

The loss is L = agg(c_t l_t) + beta * agg(k_t) with beta = `kl_coef`. Because M
and N are counted once per optimizer step and passed in, L and every metric
summed over micro-batches (and devices) equal their full-batch values, and so
does the gradient, however the step's batch is split.

References:
  Schulman et al. (2017). Proximal Policy Optimization Algorithms. arXiv:1707.06347, eq. 7.
  Ye et al. (2020). Mastering Complex Control in MOBA Games with Deep Reinforcement
  Learning (dual-clip PPO). arXiv:1912.09729.
  Schulman (2020). Approximating KL Divergence. http://joschu.net/blog/kl-approx.html
  Shao et al. (2024). DeepSeekMath (GRPO). arXiv:2402.03300, eq. 3.
  Yu et al. (2025). DAPO: An Open-Source LLM Reinforcement Learning System at Scale.
  arXiv:2503.14476 (clip-higher; token-level policy-gradient loss).
  Liu et al. (2025). Understanding R1-Zero-Like Training: A Critical Perspective
  (Dr. GRPO). arXiv:2503.20783.
  Zheng et al. (2025). Group Sequence Policy Optimization (GSPO, GSPO-token). arXiv:2507.18071.
  Yao et al. (2025). Your Efficient RL Framework Secretly Brings You Off-Policy RL
  Training (truncated importance sampling). https://fengyao.notion.site/off-policy-rl
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

RatioLevel = Literal["token", "sequence", "sequence_token"]
Aggregation = Literal["token_mean", "sequence_mean_token_mean", "sequence_mean_token_sum", "constant_sum"]
KlEstimator = Literal["k1", "k2", "k3"]
Correction = Literal["none", "truncate_token", "truncate_sequence", "mask_token", "mask_sequence"]
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence", "sequence_token")
AGGREGATIONS: tuple[str, ...] = ("token_mean", "sequence_mean_token_mean", "sequence_mean_token_sum",
                                 "constant_sum")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
CORRECTIONS: tuple[str, ...] = ("none", "truncate_token", "truncate_sequence", "mask_token", "mask_sequence")


class PolicyMetrics(NamedTuple):
  """Step metrics, already divided by the step-global denominators, so they add up across micro-batches.

  `pg_loss` and `kl_loss` use the loss's aggregation; every other field is a mean over the
  step's loss tokens (a sum over this call's loss tokens divided by `num_tokens`).
  """

  pg_loss: jax.Array                 # agg(c_t l_t), the surrogate term
  kl_loss: jax.Array                 # agg(k_t), before the kl_coef factor; 0 when kl_coef == 0
  clip_frac_low: jax.Array           # rho < 1 - eps_low with A < 0: the lower clip is active
  clip_frac_high: jax.Array          # rho > 1 + eps_high with A > 0: the upper clip is active
  dual_clip_frac: jax.Array          # A < 0 and the dual-clip cap -c A is active
  approx_kl: jax.Array               # k3 estimate of KL(pi_old || pi_theta) from the token ratios
  entropy: jax.Array                 # mean of the given per-token entropy; 0 without one
  ratio_mean: jax.Array              # mean of rho_t (the ratio the surrogate used)
  ratio_sq_mean: jax.Array           # mean of rho_t^2: std = sqrt(ratio_sq_mean - ratio_mean^2)
  sampler_abs_diff: jax.Array        # mean |log pi_old - log pi_samp|; 0 without sampler log-probs
  correction_masked_frac: jax.Array  # loss tokens whose weight the masking corrections set to 0
  correction_weight_mean: jax.Array  # mean of c_t (1 without a correction)


class _Sequences(NamedTuple):
  """Where each token's sequence lives: `index[b, t]` in 1..S, 0 for tokens of no sequence."""

  index: jax.Array   # [B, T] int32
  count: int         # S, sequences per row at most

  def sums(self, values: jax.Array) -> jax.Array:
    """`[B, S + 1]` per-sequence sums of `values` (already masked); column 0 collects padding."""
    rows = jnp.arange(values.shape[0])[:, None]
    return jnp.zeros((values.shape[0], self.count + 1), values.dtype).at[rows, self.index].add(values)

  def to_tokens(self, per_sequence: jax.Array) -> jax.Array:
    """Broadcast `[B, S + 1]` per-sequence values back over each sequence's tokens."""
    return per_sequence[jnp.arange(per_sequence.shape[0])[:, None], self.index]


def _sequences(segment_ids: jax.Array | None, shape: tuple[int, ...], max_segments: int) -> _Sequences:
  if segment_ids is None:
    return _Sequences(jnp.ones(shape, jnp.int32), 1)
  if not isinstance(segment_ids, jax.core.Tracer):  # concrete ids can be checked; traced ones cannot
    ids = np.asarray(segment_ids)
    if ids.size and (ids.min() < 0 or ids.max() > max_segments):
      raise ValueError(f"segment_ids must lie in [0, max_segments = {max_segments}], "
                       f"got values in [{ids.min()}, {ids.max()}]")
  seg = jnp.asarray(segment_ids).astype(jnp.int32)
  return _Sequences(jnp.where((seg >= 1) & (seg <= max_segments), seg, 0), max_segments)


def sequence_sums(values: Float[Array, "B T"], mask: Float[Array, "B T"], *,
                  segment_ids: Int[Array, "B T"] | None = None, max_segments: int = 1) -> Float[Array, "B S"]:
  """`[B, S]` masked sums of `values` per sequence: column s - 1 is segment id s (a whole row if no ids).

  Turns per-token quantities (a KL reward penalty, log-probs) into per-sequence ones.
  """
  if max_segments < 1:
    raise ValueError(f"max_segments must be >= 1, got {max_segments}")
  seq = _sequences(segment_ids, values.shape, max_segments)
  return seq.sums(jnp.where(mask > 0, values.astype(jnp.float32), 0.0))[:, 1:]


def token_kl(logprobs: Float[Array, "B T"], ref_logprobs: Float[Array, "B T"],
             estimator: KlEstimator = "k3") -> Float[Array, "B T"]:
  """Per-token estimate of KL(pi_theta || pi_ref) on samples of pi_theta: k1, k2 or k3 (module docstring).

  Gradient flows through both arguments; `policy_loss` passes the reference as a constant.
  """
  d = logprobs.astype(jnp.float32) - ref_logprobs.astype(jnp.float32)
  if estimator == "k1":
    return d
  if estimator == "k2":
    return 0.5 * jnp.square(d)
  if estimator == "k3":
    return jnp.exp(-d) + d - 1.0
  raise ValueError(f"kl_estimator {estimator!r} is not one of {KL_ESTIMATORS}")


def kl_reward_penalty(logprobs: Float[Array, "B T"], ref_logprobs: Float[Array, "B T"],
                      mask: Float[Array, "B T"], coef: float) -> Float[Array, "B T"]:
  """Per-token reward penalty for "KL in the reward" mode: -coef * (log pi_theta - log pi_ref), k1.

  Returns a `[B, T]` constant (no gradient), zero off the mask. Add it to per-token rewards, or
  sum it per sequence with `sequence_sums` to penalize a sequence-level reward.
  """
  if coef < 0:
    raise ValueError(f"KL penalty coef must be >= 0, got {coef}")
  if logprobs.shape != ref_logprobs.shape or logprobs.shape != mask.shape:
    raise ValueError(f"logprobs {logprobs.shape}, ref_logprobs {ref_logprobs.shape} and mask {mask.shape} "
                     "must have the same [B, T] shape")
  k1 = jnp.where(mask > 0, logprobs.astype(jnp.float32) - ref_logprobs.astype(jnp.float32), 0.0)
  return jax.lax.stop_gradient(-coef * k1)


def _check_arguments(arrays: dict, ratio_level, aggregation, kl_estimator, correction, clip_low, clip_high,
                     dual_clip, sum_constant, kl_coef, correction_cap, correction_bounds, max_segments):
  for name, value, allowed in (("ratio_level", ratio_level, RATIO_LEVELS),
                               ("aggregation", aggregation, AGGREGATIONS),
                               ("kl_estimator", kl_estimator, KL_ESTIMATORS),
                               ("correction", correction, CORRECTIONS)):
    if value not in allowed:
      raise ValueError(f"{name} {value!r} is not one of {allowed}")
  if not 0 <= clip_low <= 1:
    raise ValueError(f"clip_low must be in [0, 1], got {clip_low}")
  if clip_high < 0:
    raise ValueError(f"clip_high must be >= 0, got {clip_high}")
  if dual_clip is not None and not dual_clip > 1:
    raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip}")
  if not sum_constant > 0:
    raise ValueError(f"sum_constant must be > 0, got {sum_constant}")
  if kl_coef < 0:
    raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
  if not correction_cap > 0:
    raise ValueError(f"correction_cap must be > 0, got {correction_cap}")
  low, high = correction_bounds
  if not 0 <= low < high:
    raise ValueError(f"correction_bounds must satisfy 0 <= low < high, got {correction_bounds}")
  if not isinstance(max_segments, (int, np.integer)) or max_segments < 1:
    raise ValueError(f"max_segments must be an integer >= 1, got {max_segments!r}")
  shape = arrays["logprobs"].shape
  if len(shape) != 2:
    raise ValueError(f"logprobs must be [B, T], got shape {shape}")
  for name, value in arrays.items():
    if value is not None and value.shape != shape:
      raise ValueError(f"{name} has shape {value.shape}, expected {shape} like logprobs")
  if kl_coef > 0 and arrays["ref_logprobs"] is None:
    raise ValueError(f"kl_coef = {kl_coef} needs ref_logprobs")
  if correction != "none" and arrays["sampler_logprobs"] is None:
    raise ValueError(f"correction {correction!r} needs sampler_logprobs")


def _importance_ratio(logprobs, old, m, seq: _Sequences, ratio_level):
  """rho_t by ratio level (module docstring), as a log; 0 off the mask."""
  token = jnp.where(m > 0, logprobs - old, 0.0)
  if ratio_level == "token":
    return token
  seq_mean = seq.to_tokens(seq.sums(token) / jnp.maximum(seq.sums(m), 1.0))
  if ratio_level == "sequence":
    return jnp.where(m > 0, seq_mean, 0.0)
  sg = jax.lax.stop_gradient
  return jnp.where(m > 0, sg(seq_mean) + logprobs - sg(logprobs), 0.0)


def _correction_weight(old, sampler, m, seq: _Sequences, correction, cap, bounds):
  """c_t, a constant; 1 for `none`."""
  if correction == "none":
    return jnp.ones_like(m)
  log_w = jnp.where(m > 0, old - sampler, 0.0)
  sequence_level = correction.endswith("_sequence")
  w = jnp.exp(seq.to_tokens(seq.sums(log_w)) if sequence_level else log_w)
  if correction.startswith("truncate"):
    return jnp.minimum(w, cap)
  return ((w >= bounds[0]) & (w <= bounds[1])).astype(jnp.float32)


def _aggregation_weight(m, seq: _Sequences, aggregation, num_tokens, num_sequences, sum_constant):
  """Per-token weight of v_t in the aggregation: the loss is sum_t weight_t v_t."""
  if aggregation == "token_mean":
    return m / num_tokens
  if aggregation == "sequence_mean_token_mean":
    return m / (num_sequences * jnp.maximum(seq.to_tokens(seq.sums(m)), 1.0))
  if aggregation == "sequence_mean_token_sum":
    return m / num_sequences
  return m / sum_constant


def policy_loss(logprobs: Float[Array, "B T"], old_logprobs: Float[Array, "B T"] | None,
                advantages: Float[Array, "B T"], mask: Float[Array, "B T"], *,
                num_tokens: jax.Array | float, num_sequences: jax.Array | float,
                segment_ids: Int[Array, "B T"] | None = None, max_segments: int = 1,
                sampler_logprobs: Float[Array, "B T"] | None = None,
                ref_logprobs: Float[Array, "B T"] | None = None, entropy: Float[Array, "B T"] | None = None,
                ratio_level: RatioLevel = "token", clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: float | None = None, aggregation: Aggregation = "token_mean",
                sum_constant: float = 1.0, kl_coef: float = 0.0, kl_estimator: KlEstimator = "k3",
                correction: Correction = "none", correction_cap: float = 2.0,
                correction_bounds: tuple[float, float] = (0.5, 2.0)) -> tuple[jax.Array, PolicyMetrics]:
  """Clipped policy-gradient loss with optional KL term and mismatch correction (module docstring).

  Args:
    logprobs: `[B, T]` log pi_theta of the sampled tokens; the only input with gradient.
    old_logprobs: `[B, T]` log pi_old (constant), or None for pi_old = sg(pi_theta).
    advantages: `[B, T]` A_t per token (constant).
    mask: `[B, T]` m_t in {0, 1}, 1 on response tokens that carry loss.
    num_tokens: M, loss tokens in the whole optimizer step (clamped to >= 1).
    num_sequences: N, sequences with a loss token in the whole step (clamped to >= 1); see
      `losses.count_sequences`.
    segment_ids: `[B, T]` packed rows: segment id 1..max_segments of each token, 0 = padding (no
      loss); a sequence is a (row, segment id) pair. None: every row is one sequence.
    max_segments: S, the largest segment id (with `segment_ids` only).
    sampler_logprobs: `[B, T]` log pi_samp from the rollout engine (constant); needed by corrections.
    ref_logprobs: `[B, T]` log pi_ref (constant); needed when kl_coef > 0, never read otherwise.
    entropy: `[B, T]` per-token policy entropy, for the `entropy` metric only.
    ratio_level: `token` (PPO/GRPO), `sequence` (GSPO) or `sequence_token` (GSPO-token).
    clip_low, clip_high: eps_low in [0, 1] and eps_high >= 0; rho is clipped to [1 - eps_low, 1 + eps_high].
    dual_clip: c > 1 caps the loss of tokens with A < 0 at -c A; None disables it.
    aggregation: `token_mean`, `sequence_mean_token_mean`, `sequence_mean_token_sum` or `constant_sum`.
    sum_constant: C of `constant_sum`.
    kl_coef: beta >= 0 of the KL term; 0 leaves `ref_logprobs` untouched (it may be None).
    kl_estimator: `k1`, `k2` or `k3`.
    correction: `none`, `truncate_token`, `truncate_sequence`, `mask_token` or `mask_sequence`.
    correction_cap: the truncation cap of the importance weight.
    correction_bounds: `(lo, hi)`; the masking corrections drop weights outside [lo, hi].

  Returns:
    `(loss, PolicyMetrics)`, float32 scalars that add up across micro-batches.

  Example:
    >>> lp = jnp.log(jnp.array([[0.5, 0.25]])); m = jnp.ones((1, 2))
    >>> loss, _ = policy_loss(lp, None, jnp.array([[1.0, 1.0]]), m, num_tokens=2.0, num_sequences=1.0)
    >>> float(loss)  # on-policy: rho = 1, so the loss is -mean(A)
    -1.0
  """
  arrays = dict(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages, mask=mask,
                segment_ids=segment_ids, sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs,
                entropy=entropy)
  _check_arguments(arrays, ratio_level, aggregation, kl_estimator, correction, clip_low, clip_high, dual_clip,
                   sum_constant, kl_coef, correction_cap, correction_bounds, max_segments)
  sg, f32 = jax.lax.stop_gradient, jnp.float32
  seq = _sequences(segment_ids, logprobs.shape, max_segments)
  m = jnp.where((mask > 0) & (seq.index > 0), 1.0, 0.0).astype(f32)
  lp = logprobs.astype(f32)
  old = sg(lp) if old_logprobs is None else sg(old_logprobs.astype(f32))
  adv = jnp.where(m > 0, sg(advantages.astype(f32)), 0.0)
  num_tokens = jnp.maximum(jnp.asarray(num_tokens, f32), 1.0)
  num_sequences = jnp.maximum(jnp.asarray(num_sequences, f32), 1.0)
  token_mean = lambda x: jnp.sum(jnp.where(m > 0, x, 0.0)) / num_tokens  # noqa: E731

  # Clipped surrogate l_t, with the dual clip for negative advantages.
  ratio = jnp.exp(_importance_ratio(lp, old, m, seq, ratio_level))
  surrogate = jnp.maximum(-ratio * adv, -jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv)
  dual_active = jnp.zeros_like(m, dtype=bool)
  if dual_clip is not None:
    dual_active = (adv < 0) & (surrogate > -dual_clip * adv)
    surrogate = jnp.where(dual_active, -dual_clip * adv, surrogate)

  # Mismatch correction c_t and the aggregation weights (shared by the KL term).
  sampler = None if sampler_logprobs is None else sg(sampler_logprobs.astype(f32))
  weight = _correction_weight(old, sampler, m, seq, correction, correction_cap, correction_bounds)
  agg = _aggregation_weight(m, seq, aggregation, num_tokens, num_sequences, sum_constant)
  pg_loss = jnp.sum(agg * weight * surrogate)

  kl_loss = jnp.zeros((), f32)
  if kl_coef > 0:
    ref = sg(ref_logprobs.astype(f32))
    kl_loss = jnp.sum(agg * token_kl(jnp.where(m > 0, lp, 0.0), jnp.where(m > 0, ref, 0.0), kl_estimator))
  loss = pg_loss + kl_coef * kl_loss

  token_log_ratio = jnp.where(m > 0, lp - old, 0.0)
  r = sg(ratio)
  masked_out = (weight == 0) if correction.startswith("mask") else jnp.zeros_like(m, dtype=bool)
  metrics = PolicyMetrics(
      pg_loss=sg(pg_loss), kl_loss=sg(kl_loss),
      clip_frac_low=token_mean((r < 1.0 - clip_low) & (adv < 0)),
      clip_frac_high=token_mean((r > 1.0 + clip_high) & (adv > 0)),
      dual_clip_frac=token_mean(dual_active),
      approx_kl=token_mean(sg(jnp.exp(token_log_ratio) - 1.0 - token_log_ratio)),
      entropy=jnp.zeros((), f32) if entropy is None else token_mean(sg(entropy.astype(f32))),
      ratio_mean=token_mean(r), ratio_sq_mean=token_mean(jnp.square(r)),
      sampler_abs_diff=jnp.zeros((), f32) if sampler is None else token_mean(jnp.abs(sg(old) - sampler)),
      correction_masked_frac=token_mean(masked_out), correction_weight_mean=token_mean(weight))
  return loss, metrics
