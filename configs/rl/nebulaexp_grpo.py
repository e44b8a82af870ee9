"""NebulaExp Instruct-branch GRPO on Qwen3-8B: rollout size 5, KL loss, 256 prompts, mini-batches of 64.

Recipe (seed 003, /work/shared/design/RECIPES.md section 3): rollout size 5 (10 was better but
about 70% slower); KL loss on; train batch 256 prompts with PPO mini-batches of 64, so 4 optimizer
steps per rollout batch (strictly on-policy trained slower and scored lowest); 16,384-token
responses; up to 6 epochs over the 53K-prompt training subset (steps = 6 x 53,000 / 256).
Prompts with pass rate 0 or 1 over 5 samples of the SFT model are removed beforehand
(recipe_jax.curation), so no online group filter is set here.
Numbers the text leaves to its table of hyperparameters, which our copy lacks (an image): the
KL coefficient 0.001 with the k3 ("low_var_kl") estimator, clip 0.2, token-mean aggregation,
learning rate 1e-6 are the defaults of verl's GRPO actor (the paper's curves carry verl's
metric names, critic/rewards/mean, actor/entropy); temperature 1.0; 2,048-token prompts. KL
stays out of the reward (`kl_reward_coef` 0), as in verl's GRPO.

Run (from the Instruct SFT model, NebulaExp-Ins-SFT, exported as Hugging Face weights):
  recipe-jax rl --config configs/rl/nebulaexp_grpo.py --set init_from=runs/nebulaexp_ins_sft/hf
The text trains with sequence parallelism 8 (not built here); rows of 18,432 tokens split over
every chip's fsdp axis, no RL compile check exists yet. CPU variant: nebulaexp_grpo_tiny.py.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.rl import RlConfig
from recipe_jax.stages.rl_objective import PolicyLossConfig
from recipe_jax.stages.rollouts import RolloutConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

TRAIN_BATCH = 256          # prompts per rollout batch
PPO_MINI_BATCH = 64        # prompts per optimizer step
ROLLOUT_SIZE = 5
TRAIN_PROMPTS = 53_000
EPOCHS = 6


def get_config() -> RlConfig:
  steps = EPOCHS * TRAIN_PROMPTS // TRAIN_BATCH
  num_mini_batches = TRAIN_BATCH // PPO_MINI_BATCH
  return RlConfig(
      output_dir="runs/nebulaexp_grpo",
      init_from="runs/nebulaexp_ins_sft/hf",
      steps=steps,
      prompts_per_step=TRAIN_BATCH,
      sources=(DataSourceConfig("data/nebulaexp_rl_53k.jsonl", name="nebulaexp_rl"),),
      prompts=PromptDataConfig(max_prompt_len=2048, num_epochs=EPOCHS),
      rollout=RolloutConfig(group_size=ROLLOUT_SIZE, max_new_tokens=16_384, temperature=1.0,
                            dynamic_sampling=False, band=None, max_extra_rounds=0, truncation="none",
                            advantage="normalized", reward_workers=32, reward_deadline_s=60.0),
      loss=PolicyLossConfig(ratio_level="token", clip_low=0.2, clip_high=0.2, aggregation="token_mean",
                            kl_coef=0.001, kl_estimator="k3", kl_reward_coef=0.0, logprob_chunk_size=1024),
      optimizer=OptimizerConfig(learning_rate=1e-6, schedule="constant", total_steps=steps * num_mini_batches,
                                weight_decay=0.0, clip_norm=1.0),
      mesh=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
      num_mini_batches=num_mini_batches,
      num_micro_batches=4,
      engine_slots=256,
      dtype="bfloat16",
      remat="full",
      checkpoint_every=100,
  )
