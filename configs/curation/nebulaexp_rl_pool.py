"""NebulaExp RL candidate pool: 5 samples per prompt from the SFT model; drop pass rates 0 and 1.

Run: recipe-jax data grade --config configs/curation/nebulaexp_rl_pool.py \
       --model SFT_HF_DIR --input prompts.jsonl --output rl_pool.jsonl
Keeps pass rates in (0, 1) and labels them with the pass@4 bands; NebulaExp found the hard-only
band (0, 0.5) best at 8B: `--set filter.high=0.5 --set filter.high_open=True`.
"""

from recipe_jax.curation.grade import NEBULAEXP_BANDS, GradeConfig, Interval


def get_config() -> GradeConfig:
  return GradeConfig(samples=5, temperature=1.0, max_new_tokens=16_384, bands=NEBULAEXP_BANDS,
                     filter=Interval(0.0, 1.0, low_open=True, high_open=True))
