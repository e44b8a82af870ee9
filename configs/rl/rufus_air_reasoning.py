"""Rufus-Air stage 2 (reasoning RL) on GLM-4.5-Air: GSPO, 256 prompts x 16 responses, 30,000-token budget.

Recipe (seed 000, /work/shared/design/RECIPES.md section 1, stage 2): math, science and logic-puzzle
prompts; a learnability filter keeps prompts the current policy solves at a rate in (0, 0.8], and
online dynamic sampling keeps only groups inside that band (`rollout.band`, `dynamic_sampling`);
256 prompts x 16 responses per step under a 30,000-token response budget; Rollout Routing Replay
for the Mixture-of-Experts model (`routing_replay`).
GSPO numbers from its paper (Zheng et al. 2025, arXiv:2507.18071): sequence-level ratio,
clip range (3e-4, 4e-4), each rollout batch split into 4 mini-batches; the loss averages tokens
within each sequence, then sequences. Not given by either text, ours: learning rate 1e-6
constant, temperature 1.0, 4,096-token prompts (puzzle prompts average 688), the source weights
beyond math's 83.5% (the share of prompts with a boxed answer; science and puzzles split the rest
evenly), the step count, and the truncation rule ("mask", as the coding stage does).

Run (from the SFT stage's export; the recipe seeds RL from the SFT checkpoint of the first plateau):
  recipe-jax rl --config configs/rl/rufus_air_reasoning.py --set init_from=runs/rufus_air_sft/hf
Data: prompt JSONL with a `reward` field (recipe_jax.rewards.reference): verifier "math" (boxed
answer vs gold label), "science" (fuzzy match), "puzzles" (generated checkers).
Mesh: v5p-256, experts over 16 chips. Rows of 34,096 tokens; no RL compile check exists yet, and
the SFT compile (configs/sft/rufus_air_glm45_air.py) says 32K rows do not fit v5p-64 without
context parallelism, so size the slice with that in mind. CPU variant: rufus_air_reasoning_tiny.py.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.rl import RlConfig
from recipe_jax.stages.rl_objective import PolicyLossConfig
from recipe_jax.stages.rollouts import RolloutConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

PROMPTS_PER_STEP = 256
GROUP_SIZE = 16
RESPONSE_BUDGET = 30_000
NUM_MINI_BATCHES = 4


def get_config() -> RlConfig:
  steps = 1000
  return RlConfig(
      output_dir="runs/rufus_air_reasoning_rl",
      init_from="runs/rufus_air_sft/hf",
      steps=steps,
      prompts_per_step=PROMPTS_PER_STEP,
      sources=(DataSourceConfig("data/rufus_air_rl_math.jsonl", name="math", weight=0.835),
               DataSourceConfig("data/rufus_air_rl_science.jsonl", name="science", weight=0.0825),
               DataSourceConfig("data/rufus_air_rl_puzzles.jsonl", name="puzzles", weight=0.0825)),
      prompts=PromptDataConfig(max_prompt_len=4096, enable_thinking=True),
      rollout=RolloutConfig(group_size=GROUP_SIZE, max_new_tokens=RESPONSE_BUDGET, temperature=1.0,
                            dynamic_sampling=True, band=(0.0, 0.8), max_extra_rounds=4, pass_threshold=1.0,
                            truncation="mask", advantage="normalized", reward_workers=32, reward_deadline_s=60.0),
      loss=PolicyLossConfig(ratio_level="sequence", clip_low=3e-4, clip_high=4e-4,
                            aggregation="sequence_mean_token_mean", logprob_chunk_size=2048),
      optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", total_steps=steps * NUM_MINI_BATCHES,
                                weight_decay=0.0, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=16, expert=16, tensor=1),
      num_mini_batches=NUM_MINI_BATCHES,
      num_micro_batches=4,
      engine_slots=256,
      routing_replay=True,
      async_generation=False,
      dtype="bfloat16",
      remat="full",
      moe_impl="ragged",
      checkpoint_every=50,
  )
