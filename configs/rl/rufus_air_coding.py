"""Rufus-Air stage 3 (coding RL) on GLM-4.5-Air: binary execution reward, 128 prompts x 64 samples.

Recipe (seed 000, /work/shared/design/RECIPES.md section 1, stage 3): functional (assert tests) and
stdin/stdout problems; reward 1 only when every test passes, tests deterministically subsampled to
at most 50 per problem (verifier "code", `max_tests` 50 is its default; a record may set it in
`reward.options`); 128 prompts x 64 samples per step with a 64K-token response budget and
truncated responses masked out of the loss (`truncation="mask"`). Later in the run the recipe
raises the budget to 128K tokens and drops to 64 prompts per step:
  --set rollout.max_new_tokens=131072 --set prompts_per_step=64
Offline filters (no tests, SHA-256 dedup, leakage, teacher-solvable, not solved by all 4 warm-up
samples) belong to data preparation (recipe_jax.curation), not to this config.
Not given by the text, ours: the policy loss (GSPO as in stage 2, the same model family and
routing replay), learning rate 1e-6 constant, 4 mini-batches, temperature 1.0, 4,096-token
prompts, no learnability band (only groups with equal rewards are dropped), the step count.

Run (from the reasoning RL stage's export):
  recipe-jax rl --config configs/rl/rufus_air_coding.py --set init_from=runs/rufus_air_reasoning_rl/hf
Data: prompt JSONL whose `reward` is {"verifier": "code", "reference": {"tests": [...]}} (see
recipe_jax.rewards.code); scoring runs each program in the bwrap sandbox, so reward workers need it.
Rows of 69,632 tokens: no RL compile check exists yet and this needs context parallelism to fit;
the mesh is the reasoning stage's. CPU variant: rufus_air_coding_tiny.py.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.rl import RlConfig
from recipe_jax.stages.rl_objective import PolicyLossConfig
from recipe_jax.stages.rollouts import RolloutConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

PROMPTS_PER_STEP = 128
GROUP_SIZE = 64
RESPONSE_BUDGET = 65_536
NUM_MINI_BATCHES = 4


def get_config() -> RlConfig:
  steps = 500
  return RlConfig(
      output_dir="runs/rufus_air_coding_rl",
      init_from="runs/rufus_air_reasoning_rl/hf",
      steps=steps,
      prompts_per_step=PROMPTS_PER_STEP,
      sources=(DataSourceConfig("data/rufus_air_rl_code.jsonl", name="code"),),
      prompts=PromptDataConfig(max_prompt_len=4096, enable_thinking=True),
      rollout=RolloutConfig(group_size=GROUP_SIZE, max_new_tokens=RESPONSE_BUDGET, temperature=1.0,
                            dynamic_sampling=True, band=None, max_extra_rounds=4, pass_threshold=1.0,
                            truncation="mask", advantage="normalized", reward_workers=64, reward_deadline_s=120.0),
      loss=PolicyLossConfig(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4,
                            aggregation="sequence_mean_token_mean", logprob_chunk_size=2048),
      optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", total_steps=steps * NUM_MINI_BATCHES,
                                weight_decay=0.0, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=16, expert=16, tensor=1),
      num_mini_batches=NUM_MINI_BATCHES,
      num_micro_batches=8,
      engine_slots=256,
      routing_replay=True,
      dtype="bfloat16",
      remat="full",
      moe_impl="ragged",
      checkpoint_every=50,
  )
