"""Distillation demo (OPD): the weak student learns addition from the addition teacher, on CPU.

Run first (once; the MOPD demo reuses them):
  python -m recipe_jax.demo.distill_domains --out runs/distill_demo
  recipe-jax sft --config configs/distill/demo_teacher_addition.py
  recipe-jax sft --config configs/distill/demo_student.py
Then:
  recipe-jax distill --config configs/distill/demo_opd.py
Hardware: 2 CPU cores, about 7 minutes. Held-out exact match on 200 addition questions (never in any
SFT data or prompt) is measured for the teacher, and for the student before, every 50 steps and after
(summary.json: demo_teachers, demo_before, demo_after); expect 0.35 -> about 0.83 against the
teacher's 0.99 (docs/distill.md). No verifier is used: the signal is the teacher's next-token
distribution at every position of the student's own samples. The loss is the full-vocabulary
forward KL (GKD's on-policy form); NebulaExp's sampled reverse KL (--set 'loss.kind="sampled"')
also closes the half gap from this student (0.35 -> 0.745) on a noisier path: with a teacher
this sure of every digit, a few tokens dominate each of its steps (docs/distill.md).
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.distill import (DemoDistillConfig, DistillConfig, DistillSamplingConfig, TeacherConfig)
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

ROOT = "runs/distill_demo"


def get_config() -> DistillConfig:
  return DistillConfig(
      output_dir=f"{ROOT}/opd",
      init_from=f"{ROOT}/student/hf",
      steps=300,
      teachers=(TeacherConfig("addition", f"{ROOT}/teacher_addition/hf"),),
      routing=(("addition", "addition"),),
      sources=(DataSourceConfig(f"{ROOT}/data/addition_prompts.jsonl", name="addition"),),
      source_domains=(("addition", "addition"),),
      prompts_per_step=32,
      prompts=PromptDataConfig(max_prompt_len=48),
      sampling=DistillSamplingConfig(samples_per_prompt=4, max_new_tokens=12, temperature=1.0),
      loss=DistillLossConfig(kind="forward_kl", logprob_chunk_size=64, chunk_size=64, max_segments=16),
      optimizer=OptimizerConfig(learning_rate=2e-4, schedule="constant", warmup_steps=20, total_steps=1000, b2=0.98,
                                clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      engine_slots=64,
      checkpoint_every=50,
      demo=DemoDistillConfig(eval_files=(("addition", f"{ROOT}/data/addition_eval.jsonl"),), eval_every=50),
  )
