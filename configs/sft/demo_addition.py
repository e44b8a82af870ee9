"""SFT demo: a tiny Qwen3-style model learns 2-digit addition with boxed answers, on CPU.

Run: recipe-jax sft --config configs/sft/demo_addition.py
Hardware: 2 CPU cores, a few minutes. Data (20K problems, 200 held out) and a 320-token
BPE tokenizer are generated under output_dir on first run. Expect >= 90% held-out exact match.
"""

from recipe_jax.data.pipeline import PipelineConfig
from recipe_jax.models.presets import get_preset
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.sft import DemoTaskConfig, SftConfig
from recipe_jax.stages.sft_objective import SftLossConfig
from recipe_jax.training import OptimizerConfig


def get_config() -> SftConfig:
  model = get_preset("tiny-dense").replace(vocab_size=384, hidden_size=128, intermediate_size=384,
                                           num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32)
  steps = 600
  return SftConfig(
      model=model,
      pipeline=PipelineConfig(seq_len=256, batch_size=16, packing="best_fit", seed=0),
      output_dir="runs/sft_demo_addition",
      steps=steps,
      loss=SftLossConfig(normalization="token_mean", logprob_chunk_size=256),
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=30, total_steps=steps, b2=0.98,
                                weight_decay=0.01, clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      log_every=50,
      demo=DemoTaskConfig(train_records=20_000, eval_records=200, digits=2),
  )
