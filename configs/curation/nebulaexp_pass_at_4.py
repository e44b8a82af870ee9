"""NebulaExp SFT difficulty grading: the base model's pass@4 sorts prompts into three bands.

Run: recipe-jax data grade --config configs/curation/nebulaexp_pass_at_4.py \
       --model BASE_HF_DIR --input prompts.jsonl --output graded.jsonl
Bands: pass rate over 4 samples in [0, 0.25) hard, [0.25, 0.5) medium, [0.5, 1] easy
(NebulaExp calls them high, medium and low difficulty). Grading only: nothing is filtered;
select by the `difficulty` field downstream. Hardware: any host the base model samples on.
"""

from recipe_jax.curation.grade import NEBULAEXP_BANDS, GradeConfig


def get_config() -> GradeConfig:
  return GradeConfig(samples=4, temperature=1.0, max_new_tokens=16_384, bands=NEBULAEXP_BANDS, filter=None)
