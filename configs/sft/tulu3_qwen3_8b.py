"""Tülu 3 SFT settings on Qwen3-8B: summed token loss, lr 5e-6, 2 epochs, linear decay.

Run (TPU v5p-64, data prepared as OpenAI-style JSONL):
  recipe-jax sft --config configs/sft/tulu3_qwen3_8b.py --set init_from=/ckpt/Qwen3-8B-Base \
      --set output_dir=gs://bucket/tulu3_sft
Check that it fits before launching (any host with the `tpu` extra):
  recipe-jax compile --config configs/sft/tulu3_qwen3_8b.py --topology v5p-64
Global batch: 16 rows x 4,096 tokens per host, 8 hosts; gradient summed (Tülu 3, section 4.1).
"""

from recipe_jax.data.pipeline import PipelineConfig
from recipe_jax.models.presets import get_preset
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.sft import DataSourceConfig, SftConfig
from recipe_jax.stages.sft_objective import SftLossConfig
from recipe_jax.training import OptimizerConfig


def get_config() -> SftConfig:
  steps = 20_000
  return SftConfig(
      model=get_preset("qwen3-8b").replace(dtype="bfloat16", remat="dots_no_batch", scan_layers=True,
                                                attention_impl="auto"),
      pipeline=PipelineConfig(seq_len=4096, batch_size=16, packing="best_fit", num_epochs=2),
      sources=(DataSourceConfig("data/tulu3_sft_mixture.jsonl"),),
      output_dir="runs/tulu3_qwen3_8b",
      steps=steps,
      template="qwen3",
      loss=SftLossConfig(normalization="sum", logprob_chunk_size=1024),
      optimizer=OptimizerConfig(learning_rate=5e-6, schedule="linear", warmup_ratio=0.03, total_steps=steps,
                                weight_decay=0.0, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
      num_micro_batches=4,
      checkpoint_every=500,
  )
