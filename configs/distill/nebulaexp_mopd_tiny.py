"""The wiring of nebulaexp_mopd.py on CPU: four tiny teachers routed by domain, the same loss and sampling.

The distillation demo's models stand in: the "math" and "if" teachers are the addition teacher,
"code" and "general" the subtraction teacher (the same checkpoint loaded under two names), and the
four domains are fed the demo's prompt files through `source_domains`:
  python -m recipe_jax.demo.distill_domains --out runs/distill_demo
  recipe-jax sft --config configs/distill/demo_teacher_addition.py
  recipe-jax sft --config configs/distill/demo_teacher_subtraction.py
  recipe-jax sft --config configs/distill/demo_student.py
  recipe-jax distill --config configs/distill/nebulaexp_mopd_tiny.py
Hardware: 2 CPU cores, about a minute after the SFT runs.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.distill import DistillConfig, DistillSamplingConfig, TeacherConfig
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

ROOT = "runs/distill_demo"
STAND_IN = {"math": "addition", "code": "subtraction", "if": "addition", "general": "subtraction"}


def get_config() -> DistillConfig:
  return DistillConfig(
      output_dir="runs/nebulaexp_mopd_tiny",
      init_from=f"{ROOT}/student/hf",
      steps=4,
      teachers=tuple(TeacherConfig(d, f"{ROOT}/teacher_{task}/hf") for d, task in STAND_IN.items()),
      routing=tuple((d, d) for d in STAND_IN),
      sources=tuple(DataSourceConfig(f"{ROOT}/data/{task}_prompts.jsonl", name=f"{d}_prompts")
                    for d, task in STAND_IN.items()),
      source_domains=tuple((f"{d}_prompts", d) for d in STAND_IN),
      prompts_per_step=16,
      prompts=PromptDataConfig(max_prompt_len=48, num_epochs=1),
      sampling=DistillSamplingConfig(samples_per_prompt=4, max_new_tokens=12, temperature=1.0),
      loss=DistillLossConfig(kind="sampled", logprob_chunk_size=64, max_segments=16),
      optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=4, clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      num_micro_batches=2,
      engine_slots=16,
      checkpoint_every=2,
  )
