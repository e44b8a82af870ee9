"""NebulaExp multi-teacher on-policy distillation (MOPD): four domain teachers, on Qwen3-8B.

From RECIPES.md (NebulaExp section V-C): 10K prompts from four domains (math, code, instruction
following, general); each prompt is routed to its domain's specialist teacher, which scores the
student's own samples (per-token reverse KL, no verifier). Reported: +4.18 average over the RL
baseline, and the student exceeded each teacher on math. Each teacher scores the rows of its
domain in one forward per step; all four are loaded once, each may be larger than the student.
Not given by the paper, chosen here: 4 samples per prompt at temperature 1, 8,192 new tokens, 64
prompts per step, one pass over the 10K prompts (157 steps), lr 1e-6 constant.

Run (TPU v5p-64; prompts as OpenAI-style JSONL with "domain": math | code | if | general; others
are skipped and counted as "unrouted_domain"):
  recipe-jax distill --config configs/distill/nebulaexp_mopd.py \
      --set init_from=runs/nebulaexp_rl/hf --set output_dir=gs://bucket/nebulaexp_mopd
Per-domain metrics: distill/<domain>/reverse_kl, response_len, responses. CPU variant of the same
wiring: configs/distill/nebulaexp_mopd_tiny.py.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.distill import DistillConfig, DistillSamplingConfig, TeacherConfig
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

DOMAINS = ("math", "code", "if", "general")


def get_config() -> DistillConfig:
  return DistillConfig(
      output_dir="runs/nebulaexp_mopd",
      init_from="runs/nebulaexp_rl/hf",
      steps=157,
      teachers=tuple(TeacherConfig(d, f"runs/nebulaexp_teachers/{d}/hf", dtype="bfloat16") for d in DOMAINS),
      routing=tuple((d, d) for d in DOMAINS),
      sources=(DataSourceConfig("data/nebulaexp_mopd_prompts.jsonl", name="mopd_prompts"),),
      prompts_per_step=64,
      prompts=PromptDataConfig(max_prompt_len=2048, num_epochs=1),
      sampling=DistillSamplingConfig(samples_per_prompt=4, max_new_tokens=8192, temperature=1.0),
      loss=DistillLossConfig(kind="sampled", logprob_chunk_size=1024, max_segments=64),
      optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", total_steps=157, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
      num_micro_batches=4,
      engine_slots=256,
      dtype="bfloat16",
      remat="dots_no_batch",
      checkpoint_every=20,
  )
