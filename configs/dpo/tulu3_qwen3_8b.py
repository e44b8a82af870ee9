"""Tülu 3 preference tuning on Qwen3-8B: length-normalized DPO, beta 5, one epoch, 128 pairs per step,
lr 5e-7 with a linear schedule and 10% warmup (Lambert et al. 2024, arXiv:2411.15124, section 5).

Run (TPU v5p-64, 8 hosts; the SFT stage's export as the start and the reference model):
  recipe-jax dpo --config configs/dpo/tulu3_qwen3_8b.py --set init_from=runs/tulu3_qwen3_8b/hf \
      --set output_dir=gs://bucket/tulu3_dpo
Data: preference records as JSONL ({"prompt", "chosen", "rejected"}, see recipe_jax.data.preference).
Global batch: 16 pairs (32 rows of 2,048 tokens) per host x 8 hosts = 128 pairs; steps = one pass over
the kept pairs. The reference pass runs once before training and is cached under output_dir.
"""

from recipe_jax.data.preference import PreferenceDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.dpo import DpoConfig
from recipe_jax.stages.dpo_objective import DpoLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig


def get_config() -> DpoConfig:
  return DpoConfig(
      data=PreferenceDataConfig(seq_len=2048, batch_size=16, num_epochs=1),
      sources=(DataSourceConfig("data/tulu3_preference_mixture.jsonl"),),
      output_dir="runs/tulu3_qwen3_8b_dpo",
      init_from="runs/tulu3_qwen3_8b/hf",
      template="qwen3",
      policy="final_response",
      dtype="bfloat16",
      remat="dots_no_batch",
      steps=0,
      loss=DpoLossConfig(loss_type="length_normalized", beta=5.0, logprob_chunk_size=1024),
      # total_steps is replaced by the one-epoch step count when steps=0.
      optimizer=OptimizerConfig(learning_rate=5e-7, schedule="linear", warmup_ratio=0.1, total_steps=1,
                                weight_decay=0.0, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
      num_micro_batches=4,
      checkpoint_every=200,
  )
