"""RL demo: GRPO on the SFT demo model's addition task, on CPU (2 cores: about 10 minutes).

The starting point is the SFT demo stopped early, so that it solves the task only sometimes
(about 70% held-out exact match; the full 600-step demo reaches >= 90%):
  recipe-jax sft --config configs/sft/demo_addition.py --set steps=400 \
      --set optimizer.schedule=constant --set output_dir=runs/sft_demo_addition_400
  recipe-jax rl --config configs/rl/demo_addition.py
Prompts (4,000 questions with gold answers for the math verifier) and 200 fresh held-out
questions are generated under output_dir; held-out exact match is measured before, every
`demo.eval_every` steps, and after. See docs/rl.md for the measured curve.
"""

from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages.rl import DemoRlConfig, RlConfig
from recipe_jax.stages.rl_objective import PolicyLossConfig
from recipe_jax.stages.rollouts import RolloutConfig
from recipe_jax.training import OptimizerConfig


def get_config() -> RlConfig:
  return RlConfig(
      output_dir="runs/rl_demo_addition",
      init_from="runs/sft_demo_addition_400/hf",
      steps=20,
      prompts_per_step=32,
      prompts=PromptDataConfig(max_prompt_len=48),
      rollout=RolloutConfig(group_size=8, max_new_tokens=16, temperature=1.0, dynamic_sampling=True,
                            max_extra_rounds=2, truncation="mask", advantage="normalized"),
      loss=PolicyLossConfig(ratio_level="token", clip_low=0.2, clip_high=0.28, aggregation="token_mean",
                            logprob_chunk_size=64, max_segments=16),
      optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant", warmup_steps=0, total_steps=1000,
                                b2=0.98, clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      num_mini_batches=2,
      engine_slots=64,
      checkpoint_every=20,
      demo=DemoRlConfig(train_prompts=4000, eval_records=200, digits=2, eval_every=5),
  )
