"""Distillation demo (MOPD): one weak student, two domain teachers (addition, subtraction), on CPU.

Run first (once; the OPD demo shares the first three):
  python -m recipe_jax.demo.distill_domains --out runs/distill_demo
  recipe-jax sft --config configs/distill/demo_teacher_addition.py
  recipe-jax sft --config configs/distill/demo_teacher_subtraction.py
  recipe-jax sft --config configs/distill/demo_student.py
Then:
  recipe-jax distill --config configs/distill/demo_mopd.py
Hardware: 2 CPU cores, about 7 minutes. Each prompt goes to its domain's teacher (the prompt files
map to domains through `source_domains`); held-out exact match per domain for each teacher, and for
the student before, every 100 steps and after (summary.json), with per-domain KL in the metrics.
The loss is the full-vocabulary forward KL on the student's samples, as in demo_opd.py (which says
why).
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.distill import (DemoDistillConfig, DistillConfig, DistillSamplingConfig, TeacherConfig)
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

ROOT = "runs/distill_demo"
DOMAINS = ("addition", "subtraction")


def get_config() -> DistillConfig:
  return DistillConfig(
      output_dir=f"{ROOT}/mopd",
      init_from=f"{ROOT}/student/hf",
      steps=300,
      teachers=tuple(TeacherConfig(d, f"{ROOT}/teacher_{d}/hf") for d in DOMAINS),
      routing=tuple((d, d) for d in DOMAINS),
      sources=tuple(DataSourceConfig(f"{ROOT}/data/{d}_prompts.jsonl", name=d) for d in DOMAINS),
      source_domains=tuple((d, d) for d in DOMAINS),
      prompts_per_step=32,
      prompts=PromptDataConfig(max_prompt_len=48),
      sampling=DistillSamplingConfig(samples_per_prompt=4, max_new_tokens=12, temperature=1.0),
      loss=DistillLossConfig(kind="forward_kl", logprob_chunk_size=64, chunk_size=64, max_segments=16),
      optimizer=OptimizerConfig(learning_rate=2e-4, schedule="constant", warmup_steps=20, total_steps=1000, b2=0.98,
                                clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      engine_slots=64,
      checkpoint_every=50,
      demo=DemoDistillConfig(eval_files=tuple((d, f"{ROOT}/data/{d}_eval.jsonl") for d in DOMAINS), eval_every=100),
  )
