"""Pure loss functions: arrays in, `(loss, metrics)` out. The reference modules users read."""

from recipe_jax.losses.advantages import ADVANTAGE_MODES, group_advantages
from recipe_jax.losses.distill import (DIVERGENCES, DistillMetrics, SampledKlMetrics, chunked_divergence,
                                       distill_advantages, divergence_from_logits, sampled_kl_loss,
                                       sampled_reverse_kl)
from recipe_jax.losses.dpo import (PREFERENCE_LOSSES, DpoMetrics, count_pairs, dpo_loss, real_pairs,
                                   sequence_logps)
from recipe_jax.losses.logprobs import entropy_from_logits, logprobs_from_logits, token_logprobs
from recipe_jax.losses.policy import (AGGREGATIONS, CORRECTIONS, KL_ESTIMATORS, RATIO_LEVELS, PolicyMetrics,
                                      kl_reward_penalty, policy_loss, sequence_sums, token_kl)
from recipe_jax.losses.sft import SftMetrics, count_sequences, segment_token_counts, sft_loss

__all__ = ["ADVANTAGE_MODES", "AGGREGATIONS", "CORRECTIONS", "DIVERGENCES", "DistillMetrics", "DpoMetrics",
           "KL_ESTIMATORS", "PREFERENCE_LOSSES", "PolicyMetrics", "RATIO_LEVELS", "SampledKlMetrics", "SftMetrics",
           "chunked_divergence", "count_pairs", "count_sequences", "distill_advantages", "divergence_from_logits",
           "dpo_loss", "entropy_from_logits", "group_advantages", "kl_reward_penalty", "logprobs_from_logits",
           "policy_loss", "real_pairs", "segment_token_counts", "sequence_logps", "sequence_sums", "sampled_kl_loss",
           "sampled_reverse_kl", "sft_loss", "token_kl", "token_logprobs"]
