"""All instruction types: importing the checker modules fills `REGISTRY`.

25 IFEval types (Zhou et al. 2023, arXiv 2311.07911) and 29 types of the open
multi-constraint sets (IFBench, Pyatkin et al. 2025, arXiv 2507.02833): 54 in all.
"""

from __future__ import annotations

from recipe_jax.rewards.ifeval import (  # noqa: F401 (imported to register their instructions)
  checks_count_ratio,
  checks_format_case,
  checks_keywords_length,
  checks_layout,
  checks_words_sentence,
)
from recipe_jax.rewards.ifeval.spec import REGISTRY, Instruction, validate_kwargs

IFEVAL_PREFIXES = (
  "keywords:", "language:", "length_constraints:", "detectable_content:", "detectable_format:",
  "combination:", "startend:", "change_case:", "punctuation:",
)


def instruction_ids() -> list[str]:
  """Every registered id, sorted."""
  return sorted(REGISTRY)


def get_instruction(instruction_id: str) -> Instruction:
  """The registered instruction, or a ValueError naming the unknown id."""
  if instruction_id not in REGISTRY:
    raise ValueError(f"unknown instruction id {instruction_id!r}")
  return REGISTRY[instruction_id]


def is_ifeval(instruction_id: str) -> bool:
  """Whether the id is one of IFEval's 25 (the others come from the open multi-constraint sets)."""
  return instruction_id.startswith(IFEVAL_PREFIXES)


__all__ = ["REGISTRY", "Instruction", "get_instruction", "instruction_ids", "is_ifeval", "validate_kwargs"]
