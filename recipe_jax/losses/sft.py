"""Supervised fine-tuning loss: masked next-token cross-entropy with a global normalizer.

With l_t = -log pi(y_t | y_<t) and m_t in {0, 1} the loss mask,

  sum:            L = (1 / c) * sum_t m_t l_t
  token_mean:     L = (1 / N_tok) * sum_t m_t l_t
  sequence_mean:  L = (1 / N_seq) * sum_s (1 / n_s) * sum_{t in s} m_t l_t

where c is a constant, N_tok the loss tokens and N_seq the sequences with at
least one loss token in the whole optimizer step, and n_s the loss tokens of
sequence s. N_tok and N_seq are computed once per optimizer step, outside the
micro-batch loop, and passed in: then summing this loss over micro-batches (and
devices) gives the same value and gradient however the step's batch is split.
A sequence is a segment of a packed row (`segment_ids`), or a whole row.

References:
  Lambert et al. (2024). Tülu 3: Pushing Frontiers in Open Language Model
  Post-Training. arXiv:2411.15124, section 4.1 ("sum" loss aggregation).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

Normalization = Literal["sum", "token_mean", "sequence_mean"]


class SftMetrics(NamedTuple):
  loss_sum: jax.Array      # sum of m_t l_t in this call
  loss_tokens: jax.Array   # sum of m_t in this call


def _check(logprobs, mask):
  if logprobs.shape != mask.shape or logprobs.ndim != 2:
    raise ValueError(f"logprobs {logprobs.shape} and mask {mask.shape} must both be [B, T]")


def segment_token_counts(mask: Float[Array, "B T"], segment_ids: Int[Array, "B T"]) -> Float[Array, "B T"]:
  """n_s for every token: the loss tokens in the token's own segment (same row). O(B*T) memory."""
  b, t = mask.shape
  # Segment ids are < T + 1 within a row; give every (row, segment) pair its own bucket.
  bucket = (jnp.arange(b)[:, None] * (t + 1) + segment_ids).reshape(-1)
  counts = jax.ops.segment_sum(mask.astype(jnp.float32).reshape(-1), bucket, num_segments=b * (t + 1))
  return counts[bucket].reshape(b, t)


def count_sequences(mask: Float[Array, "B T"], segment_ids: Int[Array, "B T"] | None = None) -> jax.Array:
  """N_seq: sequences (segments, or rows) with at least one loss token."""
  mask = mask.astype(jnp.float32)
  if segment_ids is None:
    return jnp.sum(mask.sum(-1) > 0).astype(jnp.float32)
  b, t = mask.shape
  bucket = (jnp.arange(b)[:, None] * (t + 1) + segment_ids).reshape(-1)
  counts = jax.ops.segment_sum(mask.reshape(-1), bucket, num_segments=b * (t + 1))
  return jnp.sum(counts > 0).astype(jnp.float32)


def sft_loss(logprobs: Float[Array, "B T"], mask: Float[Array, "B T"], *,
             normalization: Normalization = "sum", num_tokens: jax.Array | float | None = None,
             num_sequences: jax.Array | float | None = None, sum_constant: float = 1.0,
             segment_ids: Int[Array, "B T"] | None = None) -> tuple[jax.Array, SftMetrics]:
  """Masked next-token cross-entropy (see the module docstring for the three normalizations).

  Args:
    logprobs: `[B, T]` log pi(y_t | y_<t) of the target tokens (float32).
    mask: `[B, T]` 1 where the target carries loss, else 0.
    normalization: `sum`, `token_mean` or `sequence_mean`.
    num_tokens: N_tok over the whole optimizer step (required for `token_mean`).
    num_sequences: N_seq over the whole optimizer step (required for `sequence_mean`).
    sum_constant: c for `sum` (Tülu 3 uses 1, i.e. the plain sum).
    segment_ids: `[B, T]` segment of each token in packed rows; rows are sequences if None.

  Returns:
    `(loss, SftMetrics)`. The metrics are sums over this call, to be added across micro-batches.

  Example:
    >>> lp = jnp.log(jnp.full((1, 3), 0.5)); m = jnp.array([[0., 1., 1.]])
    >>> float(sft_loss(lp, m, normalization="token_mean", num_tokens=2.)[0])  # ln 2
    0.6931...
  """
  _check(logprobs, mask)
  mask = mask.astype(jnp.float32)
  token_loss = -logprobs.astype(jnp.float32) * mask
  loss_sum = token_loss.sum()
  if normalization == "sum":
    loss = loss_sum / sum_constant
  elif normalization == "token_mean":
    if num_tokens is None:
      raise ValueError("token_mean needs num_tokens, counted over the whole optimizer step")
    loss = loss_sum / jnp.maximum(jnp.asarray(num_tokens, jnp.float32), 1.0)
  elif normalization == "sequence_mean":
    if num_sequences is None:
      raise ValueError("sequence_mean needs num_sequences, counted over the whole optimizer step")
    if segment_ids is None:
      n_s = jnp.broadcast_to(mask.sum(-1, keepdims=True), mask.shape)
    else:
      n_s = segment_token_counts(mask, segment_ids)
    per_seq = jnp.sum(token_loss / jnp.maximum(n_s, 1.0))
    loss = per_seq / jnp.maximum(jnp.asarray(num_sequences, jnp.float32), 1.0)
  else:
    raise ValueError(f"normalization {normalization!r} is not sum, token_mean or sequence_mean")
  return loss, SftMetrics(loss_sum, mask.sum())
