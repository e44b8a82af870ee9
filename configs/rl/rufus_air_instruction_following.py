"""Rufus-Air stage 4 (instruction-following RL) on GLM-4.5-Air: GRPO, all-pass binary rubric reward.

Recipe (seed 000, /work/shared/design/RECIPES.md section 1, stage 4): 14K single-turn prompts with
2-6 Python-checkable constraints and 13K multi-turn conversations (6.1 turns, 2.7 rubrics on
average); reward 1 only when every rubric passes, no optional rubrics; prompts solved above 80%
are dropped (`rollout.band=(0, 0.8)`; a group that never passes has no learning signal under
group advantages anyway); GRPO: token-level ratio, clip 0.2, each response's tokens averaged,
then responses (DeepSeekMath, arXiv:2402.03300, eq. 3).
Rewards come from the records: single-turn prompts name verifier "ifeval" (every listed
instruction must be followed), multi-turn ones "rubrics" (every check must pass). The reward pool
passes no judge model, so rubrics with judge checks score 0 ("verifier_error"); keep this data
to Python checks. Dropping prompts the teacher fails in 4 tries is data preparation.
Not given by the text, ours: 128 prompts x 16 responses, a 16,384-token response budget, 8,192-token
prompts (multi-turn), learning rate 1e-6 constant, 4 mini-batches, temperature 1.0, source weights
by prompt count (14K : 13K), the step count (about one pass over the 27K prompts at 128 per step).

Run (from the coding RL stage's export):
  recipe-jax rl --config configs/rl/rufus_air_instruction_following.py \\
      --set init_from=runs/rufus_air_coding_rl/hf
No RL compile check exists yet; the mesh is the reasoning stage's.
CPU variant: rufus_air_instruction_following_tiny.py.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.rl import RlConfig
from recipe_jax.stages.rl_objective import PolicyLossConfig
from recipe_jax.stages.rollouts import RolloutConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

PROMPTS_PER_STEP = 128
GROUP_SIZE = 16
NUM_MINI_BATCHES = 4


def get_config() -> RlConfig:
  steps = 27_000 // PROMPTS_PER_STEP
  return RlConfig(
      output_dir="runs/rufus_air_instruction_following_rl",
      init_from="runs/rufus_air_coding_rl/hf",
      steps=steps,
      prompts_per_step=PROMPTS_PER_STEP,
      sources=(DataSourceConfig("data/rufus_air_rl_if_single_turn.jsonl", name="if_single_turn", weight=14.0),
               DataSourceConfig("data/rufus_air_rl_if_multi_turn.jsonl", name="if_multi_turn", weight=13.0)),
      prompts=PromptDataConfig(max_prompt_len=8192, enable_thinking=True),
      rollout=RolloutConfig(group_size=GROUP_SIZE, max_new_tokens=16_384, temperature=1.0,
                            dynamic_sampling=True, band=(0.0, 0.8), max_extra_rounds=4, pass_threshold=1.0,
                            truncation="mask", advantage="normalized", reward_workers=32, reward_deadline_s=60.0),
      loss=PolicyLossConfig(ratio_level="token", clip_low=0.2, clip_high=0.2,
                            aggregation="sequence_mean_token_mean", logprob_chunk_size=2048),
      optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", total_steps=steps * NUM_MINI_BATCHES,
                                weight_decay=0.0, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=16, expert=16, tensor=1),
      num_mini_batches=NUM_MINI_BATCHES,
      num_micro_batches=2,
      engine_slots=256,
      routing_replay=True,
      dtype="bfloat16",
      remat="full",
      moe_impl="ragged",
      checkpoint_every=50,
  )
