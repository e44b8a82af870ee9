"""The typed model config: one decoder covering Qwen3, Qwen3-MoE and GLM-4.5.

Every behaviour that differs between families is a field here. Nothing is
inferred from a model's name: `family` only chooses the Hugging Face
architecture string and tensor names when importing or exporting.

Axis letters used across the models package (and in the sharding table):
``V`` vocabulary, ``D`` model width, ``N`` query heads, ``K`` key/value heads,
``H`` head dim, ``F`` dense MLP hidden, ``E`` experts, ``M`` expert MLP hidden,
``S`` shared-expert MLP hidden.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from recipe_jax.config import ConfigError, check_choices, require

Family = Literal["qwen3", "qwen3_moe", "glm4_moe"]
RouterScore = Literal["softmax", "sigmoid"]
RouterLogitsDtype = Literal["float32", "model"]
MoeImpl = Literal["dense", "ragged"]
AllToAll = Literal["auto", "padded", "ragged"]
AttentionImpl = Literal["xla", "auto", "pallas_tpu", "pallas_gpu", "pallas_tpu_interpret",
                        "pallas_gpu_interpret"]
Remat = Literal["none", "full", "dots", "dots_no_batch"]
DType = Literal["float32", "bfloat16", "float16"]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture and numerics of one decoder-only transformer.

  Attention: grouped-query with `num_kv_heads` key/value heads, rotary
  embeddings on the first `partial_rotary_factor * head_dim` channels of each
  head (rotate-half layout), optional biases on the q/k/v projections and an
  optional per-head RMSNorm on queries and keys before the rotation.

  Mixture of experts (when `num_experts > 0`): layer `i` is a MoE layer unless
  `i < first_k_dense`, `i in dense_layers`, or `(i + 1) % moe_layer_step != 0`.
  The router computes float32 logits, turns them into scores (`softmax` or
  `sigmoid`), adds an optional selection-only bias, limits the choice to the
  best `router_topk_group` of `router_n_group` expert groups (a group's score
  is the sum of its two best scores), takes the top `num_experts_per_tok`, gates
  each chosen expert by its (bias-free) score, optionally renormalizes the gates
  to sum to one, and multiplies them by `router_scaling_factor`.
  `num_shared_experts` always-on experts form one SwiGLU of width
  `num_shared_experts * moe_intermediate_size`.
  """

  family: Family
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1_000_000.0
  partial_rotary_factor: float = 1.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  qk_norm: bool = True
  max_position_embeddings: int = 40_960
  initializer_range: float = 0.02

  # Mixture of experts.
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  num_shared_experts: int = 0
  first_k_dense: int = 0
  moe_layer_step: int = 1
  dense_layers: tuple[int, ...] = ()
  router_score: RouterScore = "softmax"
  # Router logits in float32 (GLM-4.5), or in the model dtype then scores in float32
  # (Hugging Face's Qwen3-MoE; differs from float32 only when the model runs in bf16).
  router_logits_dtype: RouterLogitsDtype = "float32"
  router_selection_bias: bool = False
  router_n_group: int = 1
  router_topk_group: int = 1
  router_norm_topk_prob: bool = True
  router_scaling_factor: float = 1.0
  router_aux_loss_coef: float = 0.0

  # Numerics and implementation choices (results agree across choices).
  dtype: DType = "float32"
  param_dtype: DType = "float32"
  moe_impl: MoeImpl = "ragged"
  moe_all_to_all: AllToAll = "auto"
  # Expert parallelism exchanges at most this many tokens per device at a time (0: all of
  # them). Dropless exchange buffers hold the worst case, `expert_parallelism * tokens * k`
  # rows, so long rows need chunks: GLM-4.5-Air with 32K tokens per chip and 16-way expert
  # parallelism would otherwise need 34 GB for one buffer.
  moe_token_chunk: int = 0
  attention_impl: AttentionImpl = "xla"
  # Rematerialization of each decoder layer in the backward pass: `none` keeps all
  # activations, `full` recomputes the layer, `dots` / `dots_no_batch` keep matmul
  # outputs (all, or those without batch dimensions) and recompute the rest.
  remat: Remat = "none"
  # Run each run of identical consecutive decoder layers (`layer_runs`) as one
  # `jax.lax.scan` over parameters stacked on a leading layer axis, stored under
  # `params["layer_stacks"][run]` instead of `params["layers"][i]`. Compile time
  # then no longer grows with depth; the results are the same (`models.stacking`
  # converts between the two layouts).
  scan_layers: bool = False

  def __post_init__(self):
    check_choices(self)
    object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
      require(getattr(self, name) > 0, name, f"must be positive, got {getattr(self, name)}")
    require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
            f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}")
    require(0.0 < self.partial_rotary_factor <= 1.0, "partial_rotary_factor",
            f"must be in (0, 1], got {self.partial_rotary_factor}")
    require(self.rotary_dim % 2 == 0 and self.rotary_dim > 0, "partial_rotary_factor",
            f"rotary dim head_dim*factor={self.rotary_dim} must be a positive even number")
    require(self.rms_norm_eps > 0, "rms_norm_eps", "must be positive")
    require(self.rope_theta > 0, "rope_theta", "must be positive")
    self._validate_moe()

  def _validate_moe(self):
    require(self.num_experts >= 0, "num_experts", "must be >= 0")
    if self.num_experts == 0:
      require(self.num_experts_per_tok == 0, "num_experts_per_tok",
              "must be 0 for a dense model (num_experts=0)")
      require(self.num_shared_experts == 0, "num_shared_experts",
              "must be 0 for a dense model (num_experts=0)")
      return
    require(1 <= self.num_experts_per_tok <= self.num_experts, "num_experts_per_tok",
            f"top-k={self.num_experts_per_tok} must be in [1, num_experts={self.num_experts}]")
    require(self.moe_intermediate_size > 0, "moe_intermediate_size", "must be positive")
    require(self.num_shared_experts >= 0, "num_shared_experts", "must be >= 0")
    require(0 <= self.first_k_dense <= self.num_layers, "first_k_dense",
            f"must be in [0, num_layers={self.num_layers}]")
    require(self.moe_layer_step >= 1, "moe_layer_step", "must be >= 1")
    for i in self.dense_layers:
      require(0 <= i < self.num_layers, "dense_layers", f"layer {i} out of range")
    require(self.router_n_group >= 1, "router_n_group", "must be >= 1")
    require(self.num_experts % self.router_n_group == 0, "router_n_group",
            f"num_experts={self.num_experts} is not divisible by router_n_group={self.router_n_group}")
    if self.router_n_group > 1:
      require(self.num_experts // self.router_n_group >= 2, "router_n_group",
              "each expert group needs at least two experts (group score = sum of its top two)")
    require(1 <= self.router_topk_group <= self.router_n_group, "router_topk_group",
            f"must be in [1, router_n_group={self.router_n_group}]")
    allowed = self.router_topk_group * (self.num_experts // self.router_n_group)
    require(self.num_experts_per_tok <= allowed, "num_experts_per_tok",
            f"top-k={self.num_experts_per_tok} exceeds the {allowed} experts in the "
            f"router_topk_group={self.router_topk_group} selectable groups")
    require(self.router_scaling_factor > 0, "router_scaling_factor", "must be positive")
    require(self.router_aux_loss_coef >= 0, "router_aux_loss_coef", "must be >= 0")
    require(self.moe_token_chunk >= 0, "moe_token_chunk", "must be >= 0 (0: no chunks)")

  # --------------------------------------------------------------------------
  # Derived properties
  # --------------------------------------------------------------------------

  @property
  def rotary_dim(self) -> int:
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def is_moe(self) -> bool:
    return self.num_experts > 0

  def is_moe_layer(self, i: int) -> bool:
    return (self.is_moe and i >= self.first_k_dense and i not in self.dense_layers
            and (i + 1) % self.moe_layer_step == 0)

  @property
  def moe_layer_ids(self) -> tuple[int, ...]:
    return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

  @property
  def layer_runs(self) -> tuple[tuple[int, int], ...]:
    """`(first_layer, count)` of each maximal run of consecutive layers of one kind
    (dense or MoE), e.g. GLM-4.5-Air: ((0, 1), (1, 45))."""
    runs: list[list[int]] = []
    for i in range(self.num_layers):
      if runs and self.is_moe_layer(i) == self.is_moe_layer(runs[-1][0]):
        runs[-1][1] += 1
      else:
        runs.append([i, 1])
    return tuple((start, count) for start, count in runs)

  @property
  def num_moe_layers(self) -> int:
    return len(self.moe_layer_ids)

  @property
  def shared_intermediate_size(self) -> int:
    return self.num_shared_experts * self.moe_intermediate_size

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


__all__ = ["ModelConfig", "ConfigError"]
