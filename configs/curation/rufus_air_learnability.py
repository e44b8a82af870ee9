"""Rufus-Air reasoning-RL prompt filters: teacher correctness, then current-policy learnability.

Run: recipe-jax data grade --config configs/curation/rufus_air_learnability.py \
       --model POLICY_HF_DIR --teacher TEACHER_HF_DIR --input prompts.jsonl --output kept.jsonl
1. Correctness: drop prompts the (stronger) teacher never solves in 4 tries.
2. Learnability: keep prompts the current policy solves with rate in (0, 0.8].
The recipe gives the teacher's 4 tries (instruction-following stage); it does not give the
policy's sample count, so 8 is our choice: it resolves 0.8 (7/8 is dropped, 6/8 kept).
Without a teacher: `--set teacher_samples=0`.
"""

from recipe_jax.curation.grade import NEBULAEXP_BANDS, GradeConfig, Interval


def get_config() -> GradeConfig:
  return GradeConfig(samples=8, teacher_samples=4, temperature=1.0, max_new_tokens=30_000,
                     bands=NEBULAEXP_BANDS, filter=Interval(0.0, 0.8, low_open=True))
