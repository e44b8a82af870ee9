"""Score a response against a list of instructions: 1 only when every instruction is followed.

The reference names the instructions in one of two shapes (or either as a JSON string):

    {"instructions": [{"id": "punctuation:no_comma"},
                      {"id": "length_constraints:number_words",
                       "kwargs": {"relation": "at least", "num_words": 300}}]}
    {"instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
     "kwargs": [{}, {"relation": "at least", "num_words": 300}]}

The second is the IFEval / IFBench dataset row; other keys ("key", "prompt") are ignored.
Loose mode (IFEval's "loose" accuracy) counts an instruction as followed when any of eight
variants of the response follows it: the response as is, without its first line, without its
last line, without both, and each of these four with every "*" removed; a variant that is
blank after stripping is skipped.
"""

from __future__ import annotations

import json
from typing import Any

from recipe_jax.rewards.ifeval.registry import REGISTRY, validate_kwargs
from recipe_jax.rewards.score import Score


def parse_reference(reference: Any) -> list[tuple[str, dict[str, Any]]]:
  """(instruction id, validated kwargs) pairs, or a ValueError naming what is wrong."""
  if isinstance(reference, (str, bytes)):
    try:
      reference = json.loads(reference)
    except ValueError as error:
      raise ValueError(f"reference is a string but not JSON: {error}") from None
  if isinstance(reference, dict) and "instructions" in reference:
    entries = reference["instructions"]
    if not isinstance(entries, list):
      raise ValueError(f"reference 'instructions' must be a list, got {type(entries).__name__}")
    pairs = []
    for index, entry in enumerate(entries):
      if not isinstance(entry, dict) or "id" not in entry:
        raise ValueError(f"reference instruction {index} must be a dict with an 'id', got {entry!r}")
      pairs.append((entry["id"], entry.get("kwargs")))
  elif isinstance(reference, dict) and "instruction_id_list" in reference:
    ids = reference["instruction_id_list"]
    kwargs = reference.get("kwargs")
    if not isinstance(ids, list):
      raise ValueError(f"reference 'instruction_id_list' must be a list, got {type(ids).__name__}")
    if kwargs is None:
      kwargs = [None] * len(ids)
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
      raise ValueError(
        f"reference 'kwargs' must be a list as long as 'instruction_id_list' ({len(ids)}), got {kwargs!r}"
      )
    pairs = list(zip(ids, kwargs))
  else:
    raise ValueError(
      "reference must be a dict with 'instructions' (a list of {'id', 'kwargs'}) or with "
      f"'instruction_id_list' and 'kwargs', got {type(reference).__name__}"
    )
  if not pairs:
    raise ValueError("reference lists no instructions")
  return [(instruction_id, validate_kwargs(instruction_id, raw)) for instruction_id, raw in pairs]


def loose_variants(response: str) -> list[tuple[str, str]]:
  """IFEval's eight loose-mode variants of a response, named, blank ones left out."""
  lines = response.split("\n")
  base = [
    ("original", response),
    ("without_first_line", "\n".join(lines[1:]).strip()),
    ("without_last_line", "\n".join(lines[:-1]).strip()),
    ("without_first_and_last_line", "\n".join(lines[1:-1]).strip()),
  ]
  starless = [(f"{name}_no_asterisks", variant.replace("*", "")) for name, variant in base]
  return [(name, variant) for name, variant in base + starless if variant.strip()]


def check_instruction(response: str, instruction_id: str, kwargs: dict[str, Any], *, loose: bool = False) -> dict:
  """One instruction's result: {"id", "passed", "note"} (+ "variant" in loose mode when it passed)."""
  check = REGISTRY[instruction_id].check
  if not loose:
    outcome = check(response, **kwargs)
    return {"id": instruction_id, "passed": bool(outcome.passed), "note": outcome.note}
  first_note = ""
  for name, variant in loose_variants(response):
    outcome = check(variant, **kwargs)
    if outcome.passed:
      return {"id": instruction_id, "passed": True, "note": outcome.note, "variant": name}
    first_note = first_note or outcome.note
  return {"id": instruction_id, "passed": False, "note": first_note or "blank response"}


def score(response: str, reference: Any, *, loose: bool = False, strict: bool = True) -> Score:
  """1.0 when the response follows every instruction in `reference`, else 0.0.

  Args:
    response: the model's answer.
    reference: the instructions (see the module docstring).
    loose: IFEval's loose mode (see the module docstring); default strict mode.
    strict: when True (default) a bad reference (unknown id, missing/unknown/invalid argument)
      or a non-string response raises ValueError; when False it scores 0 with reason
      "invalid_reference: <message>" or "invalid_response: <message>".

  Returns:
    Score with reason "correct" or "instructions_not_followed: <failing ids>", and details
    {"mode", "followed", "total", "results": [{"id", "passed", "note"[, "variant"]}, ...]}.
  """
  try:
    instructions = parse_reference(reference)
  except ValueError as error:
    if strict:
      raise
    return Score.wrong(f"invalid_reference: {error}")
  if not isinstance(response, str):
    message = f"response must be a string, got {type(response).__name__}"
    if strict:
      raise ValueError(message)
    return Score.wrong(f"invalid_response: {message}")
  results = [check_instruction(response, name, kwargs, loose=loose) for name, kwargs in instructions]
  failed = [result["id"] for result in results if not result["passed"]]
  details = {
    "mode": "loose" if loose else "strict",
    "followed": len(results) - len(failed),
    "total": len(results),
    "results": results,
  }
  if failed:
    return Score.wrong(f"instructions_not_followed: {', '.join(failed)}", **details)
  return Score.correct(**details)
