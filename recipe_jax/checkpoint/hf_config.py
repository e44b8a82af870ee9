"""Translating between Hugging Face `config.json` dicts and our `ModelConfig`.

Fields missing from a `config.json` take the defaults of the transformers 5.24
config classes (`Qwen3Config`, `Qwen3MoeConfig`, `Glm4MoeConfig`), so a file
reads the way `from_pretrained` would read it. Both spellings of the rotary
settings are accepted: transformers 5 nests `rope_theta` (and GLM's
`partial_rotary_factor`) in `rope_parameters`; hub files keep them top level,
optionally beside a `rope_scaling` dict. Only plain (unscaled) RoPE exists in
our model, so any other rope type is refused.

Anything the target cannot express (sliding-window attention, an `o_proj`
bias, activations other than SiLU, ...) raises `CheckpointError` naming the
field instead of being dropped quietly.
"""

from __future__ import annotations

from typing import Any

from recipe_jax.models.config import ModelConfig

ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
}
_DTYPES = ("float32", "bfloat16", "float16")


class CheckpointError(ValueError):
  """A checkpoint or its config does not fit the model; the message lists every problem."""


def _rope(d: dict, default_partial: float) -> tuple[float, float]:
  """(rope_theta, partial_rotary_factor), with the precedence transformers 5 uses."""
  rope = d.get("rope_scaling") or d.get("rope_parameters") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind != "default":
    raise CheckpointError(f"rope type {kind!r} (rope_scaling / rope_parameters) is not supported; "
                          "only the default unscaled rotary embedding is implemented")
  theta = rope.get("rope_theta", d.get("rope_theta", 10_000.0))
  partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", default_partial))
  return float(theta), float(partial)


def config_from_hf(d: dict[str, Any]) -> ModelConfig:
  """Our `ModelConfig` for a Hugging Face config dict (`model_type` qwen3, qwen3_moe or glm4_moe).

  `param_dtype` and `dtype` follow the file's `dtype` (or older `torch_dtype`),
  float32 when it names something else.
  """
  family = d.get("model_type")
  if family not in ARCHITECTURES:
    raise CheckpointError(f"model_type {family!r} is not supported; expected one of {list(ARCHITECTURES)}")
  absent = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads") if k not in d]
  if absent:
    raise CheckpointError(f"config.json lacks required fields: {', '.join(absent)}")
  if d.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"hidden_act {d['hidden_act']!r} is not supported (only silu)")
  glm = family == "glm4_moe"
  if not glm:
    sliding = [t for t in d.get("layer_types") or () if t != "full_attention"]
    if d.get("use_sliding_window") or sliding:
      raise CheckpointError("use_sliding_window / sliding_attention layers are not supported")
    if d.get("attention_bias"):
      raise CheckpointError(f"attention_bias=True is not supported for {family}: Hugging Face's "
                            "Qwen3 then also biases o_proj, which our model lacks")
  heads = d["num_attention_heads"]
  theta, partial = _rope(d, 0.5 if glm else 1.0)
  dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
  dtype = dtype if dtype in _DTYPES else "float32"
  kw: dict[str, Any] = dict(
      family=family, vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
      intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
      num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads,
      head_dim=d.get("head_dim") or d["hidden_size"] // heads, rope_theta=theta,
      # Qwen3's rotary embedding ignores partial_rotary_factor; so do we.
      partial_rotary_factor=partial if glm else 1.0,
      rms_norm_eps=d.get("rms_norm_eps", 1e-5 if glm else 1e-6),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      attention_bias=bool(d.get("attention_bias", False)),
      qk_norm=bool(d.get("use_qk_norm", False)) if glm else True,
      max_position_embeddings=d.get("max_position_embeddings", 131_072 if glm else 32_768),
      initializer_range=d.get("initializer_range", 0.02), dtype=dtype, param_dtype=dtype)
  if family == "qwen3_moe":
    experts = d.get("num_experts", d.get("num_local_experts", 128))
    if experts:
      kw.update(
          num_experts=experts, num_experts_per_tok=d.get("num_experts_per_tok", 8),
          moe_intermediate_size=d.get("moe_intermediate_size", 768),
          moe_layer_step=d.get("decoder_sparse_step", 1),
          dense_layers=tuple(sorted(d.get("mlp_only_layers") or ())),
          router_score="softmax", router_logits_dtype="model", router_selection_bias=False,
          router_n_group=1, router_topk_group=1,
          router_norm_topk_prob=bool(d.get("norm_topk_prob", False)),
          router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)))
  elif glm:
    kw.update(
        num_experts=d.get("n_routed_experts", d.get("num_local_experts", 128)),
        num_experts_per_tok=d.get("num_experts_per_tok", 8),
        moe_intermediate_size=d.get("moe_intermediate_size", 1408),
        num_shared_experts=d.get("n_shared_experts", 1),
        first_k_dense=d.get("first_k_dense_replace", 1),
        router_score="sigmoid", router_selection_bias=True,
        router_n_group=d.get("n_group", 1), router_topk_group=d.get("topk_group", 1),
        router_norm_topk_prob=bool(d.get("norm_topk_prob", True)),
        router_scaling_factor=float(d.get("routed_scaling_factor", 1.0)))
  return ModelConfig(**kw)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  """A `config.json` dict for `cfg` that transformers loads as the matching `*ForCausalLM`.

  Rotary settings are written both ways (top-level `rope_theta` for older
  readers, `rope_parameters` for transformers 5). GLM files declare no
  multi-token-prediction layer (`num_nextn_predict_layers: 0`).

  Raises:
    CheckpointError: listing each setting the Hugging Face architecture cannot express.
  """
  bad = []
  glm = cfg.family == "glm4_moe"
  if not glm:
    if cfg.partial_rotary_factor != 1.0:
      bad.append("partial_rotary_factor (Qwen3 rotates the whole head)")
    if not cfg.qk_norm:
      bad.append("qk_norm=False (Qwen3 always normalizes q and k)")
    if cfg.attention_bias:
      bad.append("attention_bias (Qwen3 would add an o_proj bias)")
  if cfg.family == "qwen3" and cfg.is_moe:
    bad.append("num_experts (qwen3 is dense; use qwen3_moe)")
  if cfg.family == "qwen3_moe" and cfg.is_moe:
    if cfg.router_score != "softmax" or cfg.router_selection_bias or cfg.router_n_group != 1:
      bad.append("router (Qwen3-MoE routes by softmax without selection bias or groups)")
    if cfg.router_scaling_factor != 1.0 or cfg.num_shared_experts:
      bad.append("router_scaling_factor / num_shared_experts (absent in Qwen3-MoE)")
  if glm:
    if not cfg.is_moe or cfg.router_score != "sigmoid" or not cfg.router_selection_bias:
      bad.append("router (GLM-4.5 routes by sigmoid with a selection bias)")
    if cfg.moe_layer_step != 1 or any(i >= cfg.first_k_dense for i in cfg.dense_layers):
      bad.append("moe_layer_step / dense_layers (GLM-4.5 only has first_k_dense)")
  if bad:
    raise CheckpointError(f"{cfg.family} config cannot be written for Hugging Face: " + "; ".join(bad))
  d: dict[str, Any] = {
      "architectures": [ARCHITECTURES[cfg.family]], "model_type": cfg.family,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
      "max_position_embeddings": cfg.max_position_embeddings,
      "initializer_range": cfg.initializer_range, "tie_word_embeddings": cfg.tie_word_embeddings,
      "attention_bias": cfg.attention_bias, "attention_dropout": 0.0, "use_cache": True,
      "rope_theta": cfg.rope_theta, "rope_scaling": None,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "dtype": cfg.param_dtype,
  }
  if cfg.family == "qwen3":
    d.update(use_sliding_window=False, sliding_window=None)
  elif cfg.family == "qwen3_moe":
    dense = sorted(set(cfg.dense_layers) | set(range(min(cfg.first_k_dense, cfg.num_layers))))
    d.update(use_sliding_window=False, sliding_window=None, num_experts=cfg.num_experts,
             num_experts_per_tok=cfg.num_experts_per_tok,
             moe_intermediate_size=cfg.moe_intermediate_size, decoder_sparse_step=cfg.moe_layer_step,
             mlp_only_layers=dense if cfg.is_moe else [], norm_topk_prob=cfg.router_norm_topk_prob,
             router_aux_loss_coef=cfg.router_aux_loss_coef)
  else:
    d["partial_rotary_factor"] = cfg.partial_rotary_factor
    d["rope_parameters"]["partial_rotary_factor"] = cfg.partial_rotary_factor
    d.update(n_routed_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
             moe_intermediate_size=cfg.moe_intermediate_size, n_shared_experts=cfg.num_shared_experts,
             first_k_dense_replace=cfg.first_k_dense, n_group=cfg.router_n_group,
             topk_group=cfg.router_topk_group, norm_topk_prob=cfg.router_norm_topk_prob,
             routed_scaling_factor=cfg.router_scaling_factor, use_qk_norm=cfg.qk_norm,
             num_nextn_predict_layers=0)
  return d
