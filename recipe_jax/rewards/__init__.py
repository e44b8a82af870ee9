"""Verifiable rewards: each verifier module exposes `score(response, reference, **options) -> Score`.

Verifiers (import the module you need; heavy engines load lazily or in worker processes):
`math` (math-verify under a stricter exact-number policy, in isolated workers), `science`,
`code` (bwrap sandbox), `puzzles` (reasoning-gym, scored in the sandbox), `ifeval` (54
instruction types), `rubrics`, `judges`. Around them: `shaping` (penalties applied after
verification), `pool` (batch scoring with deadlines), `isolation` and `sandbox`.
See docs/rewards.md.
"""

from recipe_jax.rewards.score import Score

__all__ = ["Score"]
