"""The reward reference a prompt record carries, and the verifier it names.

RL and grading records hold their reward reference under `"reward"`:

  {"messages": [{"role": "user", "content": "What is 12 + 30?"}],
   "reward": {"verifier": "math", "reference": "42"}}
  {"messages": [...], "reward": {"verifier": "code", "reference": {"tests": [...]},
                                 "options": {"max_tests": 50}}}

`verifier` is a short name (`VERIFIERS`) or a module path with a
`score(response, reference, **options) -> Score` function. A record whose reference is
missing or malformed raises `DropRecord` ("missing_reward_reference",
"malformed_reward_reference", "unknown_verifier"), so pipelines skip and count it instead of scoring it 0.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

from recipe_jax.data.errors import DropRecord

VERIFIERS = {
    "math": "recipe_jax.rewards.math",
    "science": "recipe_jax.rewards.science",
    "code": "recipe_jax.rewards.code",
    "puzzles": "recipe_jax.rewards.puzzles",
    "ifeval": "recipe_jax.rewards.ifeval.scoring",
    "rubrics": "recipe_jax.rewards.rubrics",
}
# What each short-named verifier needs its reference to be.
_REFERENCE_TYPES = {"math": (str, int, float), "science": (str, list), "code": (dict,), "puzzles": (dict,),
                    "ifeval": (dict, list), "rubrics": (list,)}


@dataclasses.dataclass(frozen=True)
class RewardReference:
  verifier: str          # module path
  reference: Any
  options: dict = dataclasses.field(default_factory=dict)


def verifier_module(name: str) -> str:
  """The module path of a short name or module path; raises ValueError if it does not exist."""
  module = VERIFIERS.get(name, name)
  if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
    raise ValueError(f"verifier {name!r} is neither one of {sorted(VERIFIERS)} nor an importable module")
  return module


def parse_reward_reference(record: dict, *, default_verifier: str = "") -> RewardReference:
  """The record's `reward` field as a `RewardReference`; DropRecord naming what is wrong."""
  reward = record.get("reward")
  if reward is None:
    raise DropRecord("missing_reward_reference", "the record has no 'reward' field")
  if not isinstance(reward, dict):
    raise DropRecord("malformed_reward_reference", f"'reward' is a {type(reward).__name__}, not an object")
  name = reward.get("verifier") or default_verifier
  if not isinstance(name, str) or not name:
    raise DropRecord("malformed_reward_reference", "'reward.verifier' is missing or not a string")
  if "reference" not in reward or reward["reference"] is None:
    raise DropRecord("missing_reward_reference", "'reward.reference' is missing")
  reference, options = reward["reference"], reward.get("options", {})
  if not isinstance(options, dict):
    raise DropRecord("malformed_reward_reference", f"'reward.options' is a {type(options).__name__}, not an object")
  want = _REFERENCE_TYPES.get(name)
  if want is not None and (not isinstance(reference, want) or isinstance(reference, bool)):
    raise DropRecord("malformed_reward_reference",
                     f"'reward.reference' for verifier {name!r} must be {' or '.join(t.__name__ for t in want)}, "
                     f"got {type(reference).__name__}")
  if isinstance(reference, str) and not reference.strip():
    raise DropRecord("malformed_reward_reference", "'reward.reference' is an empty string")
  try:
    module = verifier_module(name)
  except ValueError as e:
    raise DropRecord("unknown_verifier", str(e)) from None
  return RewardReference(module, str(reference) if isinstance(reference, (int, float)) else reference, options)
