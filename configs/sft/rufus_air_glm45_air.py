"""Rufus-Air stage 1 (SFT) on GLM-4.5-Air: assistant-only loss on the final response,
3 epochs, AdamW with cosine decay, packed rows.

Run (TPU v5p-256 or larger):
  recipe-jax sft --config configs/sft/rufus_air_glm45_air.py --set init_from=/ckpt/GLM-4.5-Air-Base
Compile check on any host with the `tpu` extra (experts over 16 chips):
  recipe-jax compile --config configs/sft/rufus_air_glm45_air.py --topology v5p-64
The recipe packs to 128K-token contexts. Rows are split over data x fsdp x expert only, so every
chip holds whole rows, and next to 37 GiB of float32 weights and AdamW state per chip (v5p-64)
a chip fits one 16K row: the compile reports a peak of 85.6 GiB of 95 GiB; 32K rows need 118.6.
128K rows need context parallelism (not built yet); this config packs 16K rows, 32 per step on
v5p-64 (512K tokens), and exchanges MoE tokens 512 at a time (`moe_token_chunk`) to bound the
dropless all-to-all buffers.
"""

from recipe_jax.data.pipeline import PipelineConfig
from recipe_jax.models.presets import get_preset
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.sft import DataSourceConfig, SftConfig
from recipe_jax.stages.sft_objective import SftLossConfig
from recipe_jax.training import OptimizerConfig


def get_config() -> SftConfig:
  steps = 30_000
  return SftConfig(
      model=get_preset("glm-4.5-air").replace(dtype="bfloat16", remat="full", scan_layers=True,
                                                   attention_impl="auto", moe_token_chunk=512),
      pipeline=PipelineConfig(seq_len=16_384, batch_size=4, packing="best_fit", num_epochs=3),
      sources=(DataSourceConfig("data/rufus_air_sft.jsonl"),),
      output_dir="runs/rufus_air_sft",
      steps=steps,
      template="glm45",
      policy="final_response",
      loss=SftLossConfig(normalization="token_mean", logprob_chunk_size=2048),
      optimizer=OptimizerConfig(learning_rate=1e-5, schedule="cosine", warmup_ratio=0.01, total_steps=steps,
                                end_lr_ratio=0.1, weight_decay=0.1, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=2, expert=16, tensor=1),
      num_micro_batches=1,
      checkpoint_every=500,
  )
