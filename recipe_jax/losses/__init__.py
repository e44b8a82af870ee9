"""Pure loss functions: arrays in, `(loss, metrics)` out. The reference modules users read."""

from recipe_jax.losses.logprobs import logprobs_from_logits, token_logprobs
from recipe_jax.losses.sft import SftMetrics, count_sequences, segment_token_counts, sft_loss

__all__ = ["SftMetrics", "count_sequences", "logprobs_from_logits", "segment_token_counts", "sft_loss",
           "token_logprobs"]
