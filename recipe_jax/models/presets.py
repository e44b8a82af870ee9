"""Model presets: the published architectures at real size, and tiny test models.

Real sizes follow each model's released ``config.json``. The multi-token
prediction layer that GLM-4.5 checkpoints carry (``num_nextn_predict_layers``)
is not part of the decoder and is skipped on import (see `checkpoint.hf`).
"""

from __future__ import annotations

from recipe_jax.config import ConfigError
from recipe_jax.models.config import ModelConfig

_QWEN3_VOCAB = 151_936
_GLM_VOCAB = 151_552

PRESETS: dict[str, ModelConfig] = {
    "qwen3-0.6b": ModelConfig(
        family="qwen3", vocab_size=_QWEN3_VOCAB, hidden_size=1024, intermediate_size=3072,
        num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": ModelConfig(
        family="qwen3", vocab_size=_QWEN3_VOCAB, hidden_size=4096, intermediate_size=12288,
        num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128),
    "qwen3-30b-a3b": ModelConfig(
        family="qwen3_moe", vocab_size=_QWEN3_VOCAB, hidden_size=2048, intermediate_size=6144,
        num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
        router_score="softmax", router_logits_dtype="model", router_norm_topk_prob=True,
        router_aux_loss_coef=0.001),
    "glm-4.5-air": ModelConfig(
        family="glm4_moe", vocab_size=_GLM_VOCAB, hidden_size=4096, intermediate_size=10944,
        num_layers=46, num_heads=96, num_kv_heads=8, head_dim=128, partial_rotary_factor=0.5,
        rms_norm_eps=1e-5, attention_bias=True, qk_norm=False, max_position_embeddings=131_072,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1408, num_shared_experts=1,
        first_k_dense=1, router_score="sigmoid", router_selection_bias=True, router_n_group=1,
        router_topk_group=1, router_norm_topk_prob=True, router_scaling_factor=1.0),
    "glm-4.5": ModelConfig(
        family="glm4_moe", vocab_size=_GLM_VOCAB, hidden_size=5120, intermediate_size=12288,
        num_layers=92, num_heads=96, num_kv_heads=8, head_dim=128, partial_rotary_factor=0.5,
        rms_norm_eps=1e-5, attention_bias=True, qk_norm=True, max_position_embeddings=131_072,
        num_experts=160, num_experts_per_tok=8, moe_intermediate_size=1536, num_shared_experts=1,
        first_k_dense=3, router_score="sigmoid", router_selection_bias=True, router_n_group=1,
        router_topk_group=1, router_norm_topk_prob=True, router_scaling_factor=2.5),
    # Tiny models for tests and CPU runs. Sizes divide a tensor axis of 2 and an
    # expert axis of up to 8.
    "tiny-dense": ModelConfig(
        family="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=2048),
    "tiny-moe": ModelConfig(
        family="qwen3_moe", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=2048,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        router_score="softmax", router_logits_dtype="model", router_norm_topk_prob=True,
        router_aux_loss_coef=0.001),
    "tiny-glm": ModelConfig(
        family="glm4_moe", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=3,
        num_heads=4, num_kv_heads=2, head_dim=16, partial_rotary_factor=0.5, rms_norm_eps=1e-5,
        attention_bias=True, qk_norm=False, max_position_embeddings=2048,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1,
        first_k_dense=1, router_score="sigmoid", router_selection_bias=True, router_n_group=2,
        router_topk_group=1, router_norm_topk_prob=True, router_scaling_factor=1.5),
}

# Published parameter counts (total, active), with where the figure comes from.
PUBLISHED_COUNTS: dict[str, tuple[float, float | None, str]] = {
    "qwen3-0.6b": (0.6e9, None, "Qwen3 model card: 0.6B, 0.44B non-embedding"),
    "qwen3-8b": (8.2e9, None, "Qwen3 model card: 8.2B, 6.95B non-embedding"),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "Qwen3 model card: 30.5B total, 3.3B activated"),
    "glm-4.5-air": (106e9, 12e9, "GLM-4.5 report: 106B total, 12B active"),
    "glm-4.5": (355e9, 32e9, "GLM-4.5 report: 355B total, 32B active"),
}


def get_preset(name: str) -> ModelConfig:
  """Returns the preset named `name`; an unknown name lists the valid ones."""
  try:
    return PRESETS[name]
  except KeyError:
    raise ConfigError(f"model preset {name!r} is unknown; presets: {', '.join(PRESETS)}") from None
