"""Instruction-following verifiers: IFEval's 25 instruction types and 29 of the open multi-constraint sets.

`score(response, reference, loose=False, strict=True) -> Score` gives 1.0 when the response
follows every listed instruction. See `scoring` for the reference format and
docs/rewards_ifeval.md for every instruction id, its arguments and what it checks.
"""

from recipe_jax.rewards.ifeval.language import SUPPORTED_LANGUAGES, detect_language
from recipe_jax.rewards.ifeval.registry import REGISTRY, get_instruction, instruction_ids, is_ifeval
from recipe_jax.rewards.ifeval.scoring import check_instruction, loose_variants, parse_reference, score

__all__ = [
  "REGISTRY",
  "SUPPORTED_LANGUAGES",
  "check_instruction",
  "detect_language",
  "get_instruction",
  "instruction_ids",
  "is_ifeval",
  "loose_variants",
  "parse_reference",
  "score",
]
