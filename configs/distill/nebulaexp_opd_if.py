"""NebulaExp single-teacher on-policy distillation (OPD) for instruction following, on Qwen3-8B.

From RECIPES.md (NebulaExp section V-C): the RL model is the student; it samples its own responses
to 4K instruction-following prompts and one instruction-following teacher scores every prefix;
the loss is the per-token reverse KL on the student's samples (no verifier). Reported: +3.26 IFEval
over the RL baseline. Not given by the paper, chosen here: 4 samples per prompt, temperature 1
(the sampled estimate d_t is unbiased for KL(pi_S || pi_T) only at the engine's temperature 1),
8,192 new tokens, 64 prompts per step, one pass over the 4K prompts (63 steps), lr 1e-6 constant.

Run (TPU v5p-64; prompts as OpenAI-style JSONL, each with "domain": "if" or none):
  recipe-jax distill --config configs/distill/nebulaexp_opd_if.py \
      --set init_from=runs/nebulaexp_rl/hf --set output_dir=gs://bucket/nebulaexp_opd_if
The teacher checkpoint must share the student's tokenizer (checked at start). CPU variant of the
same wiring: configs/distill/nebulaexp_opd_if_tiny.py.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.distill import DistillConfig, DistillSamplingConfig, TeacherConfig
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig


def get_config() -> DistillConfig:
  return DistillConfig(
      output_dir="runs/nebulaexp_opd_if",
      init_from="runs/nebulaexp_rl/hf",
      steps=63,
      teachers=(TeacherConfig("if", "runs/nebulaexp_teachers/if/hf", dtype="bfloat16"),),
      routing=(("if", "if"),),
      sources=(DataSourceConfig("data/nebulaexp_opd_if_prompts.jsonl", name="if_prompts"),),
      default_domain="if",
      prompts_per_step=64,
      prompts=PromptDataConfig(max_prompt_len=2048, num_epochs=1),
      sampling=DistillSamplingConfig(samples_per_prompt=4, max_new_tokens=8192, temperature=1.0),
      loss=DistillLossConfig(kind="sampled", logprob_chunk_size=1024, max_segments=64),
      optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", total_steps=63, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
      num_micro_batches=4,
      engine_slots=256,
      dtype="bfloat16",
      remat="dots_no_batch",
      checkpoint_every=20,
  )
