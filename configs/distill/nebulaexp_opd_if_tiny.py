"""The wiring of nebulaexp_opd_if.py on CPU: tiny student, one tiny teacher, the same loss and sampling.

The distillation demo's models stand in (the "if" domain is fed the demo's addition prompts):
  python -m recipe_jax.demo.distill_domains --out runs/distill_demo
  recipe-jax sft --config configs/distill/demo_teacher_addition.py
  recipe-jax sft --config configs/distill/demo_student.py
  recipe-jax distill --config configs/distill/nebulaexp_opd_if_tiny.py
Hardware: 2 CPU cores, under a minute after the SFT runs.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.distill import DistillConfig, DistillSamplingConfig, TeacherConfig
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

ROOT = "runs/distill_demo"


def get_config() -> DistillConfig:
  return DistillConfig(
      output_dir="runs/nebulaexp_opd_if_tiny",
      init_from=f"{ROOT}/student/hf",
      steps=4,
      teachers=(TeacherConfig("if", f"{ROOT}/teacher_addition/hf"),),
      routing=(("if", "if"),),
      sources=(DataSourceConfig(f"{ROOT}/data/addition_prompts.jsonl", name="if_prompts"),),
      default_domain="if",
      prompts_per_step=8,
      prompts=PromptDataConfig(max_prompt_len=48, num_epochs=1),
      sampling=DistillSamplingConfig(samples_per_prompt=4, max_new_tokens=12, temperature=1.0),
      loss=DistillLossConfig(kind="sampled", logprob_chunk_size=64, max_segments=16),
      optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=4, clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      num_micro_batches=2,
      engine_slots=16,
      checkpoint_every=2,
  )
