"""Pure loss functions: arrays in, `(loss, metrics)` out. The reference modules users read."""

from recipe_jax.losses.dpo import (PREFERENCE_LOSSES, DpoMetrics, count_pairs, dpo_loss, real_pairs,
                                   sequence_logps)
from recipe_jax.losses.logprobs import logprobs_from_logits, token_logprobs
from recipe_jax.losses.sft import SftMetrics, count_sequences, segment_token_counts, sft_loss

__all__ = ["PREFERENCE_LOSSES", "DpoMetrics", "SftMetrics", "count_pairs", "count_sequences", "dpo_loss",
           "logprobs_from_logits", "real_pairs", "segment_token_counts", "sequence_logps", "sft_loss",
           "token_logprobs"]
