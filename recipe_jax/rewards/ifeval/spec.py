"""How an instruction type is declared: its id, its arguments, and its check.

Checker modules declare each type with the `instruction` decorator:

    @instruction("punctuation:no_comma")
    def no_comma(response: str) -> Outcome: ...

    @instruction("keywords:frequency", keyword=Arg("str"), frequency=Arg("int"), relation=Arg("relation"))
    def keyword_frequency(response: str, *, keyword: str, frequency: int, relation: str) -> Outcome: ...

`validate_kwargs` turns a reference's raw kwargs into the checker's keyword arguments or raises
`ValueError` naming the instruction id and the argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

# IFEval's two comparison relations: "less than" is count < N, "at least" is count >= N.
RELATIONS = ("less than", "at least")
ARG_KINDS = ("int", "str", "str_list", "relation")


class Outcome(NamedTuple):
  """One instruction's verdict on one response, with what was measured."""

  passed: bool
  note: str = ""


@dataclasses.dataclass(frozen=True)
class Arg:
  """One argument: kind is "int" (a whole number >= minimum), "str" (non-empty unless
  allow_empty), "str_list" (a non-empty list of non-empty strings) or "relation" (one of
  RELATIONS); normalize, when set, maps a string value to its canonical form (or raises
  ValueError); choices, when set, lists the allowed values (compared after normalize)."""

  kind: str
  minimum: int = 0
  choices: frozenset[str] | None = None
  normalize: Callable[[str], str] | None = None
  allow_empty: bool = False

  def __post_init__(self):
    if self.kind not in ARG_KINDS:
      raise ValueError(f"Arg kind must be one of {ARG_KINDS}, got {self.kind!r}")


@dataclasses.dataclass(frozen=True)
class Instruction:
  """A registered instruction type."""

  id: str
  check: Callable[..., Outcome]
  args: dict[str, Arg]
  summary: str
  check_args: Callable[[dict[str, Any]], str | None] | None = None


REGISTRY: dict[str, Instruction] = {}


def instruction(
  instruction_id: str, *, check_args: Callable[[dict[str, Any]], str | None] | None = None, **args: Arg
) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
  """Register a checker under `instruction_id`; its docstring's first line is the summary.

  check_args, when given, sees the converted arguments together and returns an error message
  for a combination that cannot be satisfied (e.g. min_words > max_words), or None.
  """

  def register(check: Callable[..., Outcome]) -> Callable[..., Outcome]:
    if instruction_id in REGISTRY:
      raise ValueError(f"instruction id {instruction_id!r} registered twice")
    summary = (check.__doc__ or "").strip().split("\n")[0]
    REGISTRY[instruction_id] = Instruction(instruction_id, check, dict(args), summary, check_args)
    return check

  return register


def compare(count: int | float, relation: str, threshold: int | float) -> bool:
  """IFEval's comparison: "less than" -> count < threshold; "at least" -> count >= threshold."""
  if relation == "less than":
    return count < threshold
  if relation == "at least":
    return count >= threshold
  raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


def _convert(instruction_id: str, name: str, arg: Arg, value: Any) -> Any:
  where = f"instruction {instruction_id!r}: argument {name!r}"
  if arg.kind == "int":
    if isinstance(value, float) and value.is_integer():
      value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
      raise ValueError(f"{where} must be a whole number, got {value!r}")
    if value < arg.minimum:
      raise ValueError(f"{where} must be >= {arg.minimum}, got {value}")
    return value
  if arg.kind == "str_list":
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
      raise ValueError(f"{where} must be a non-empty list of strings, got {value!r}")
    if not all(isinstance(item, str) and item.strip() for item in value):
      raise ValueError(f"{where} must hold only non-empty strings, got {value!r}")
    return [item.strip() for item in value]
  if not isinstance(value, str) or (not value.strip() and not arg.allow_empty):
    raise ValueError(f"{where} must be a non-empty string, got {value!r}")
  if arg.kind == "relation":
    value = value.strip().lower()
    if value not in RELATIONS:
      raise ValueError(f"{where} must be one of {list(RELATIONS)}, got {value!r}")
    return value
  if arg.normalize is not None:
    try:
      value = arg.normalize(value)
    except ValueError as error:
      raise ValueError(f"{where}: {error}") from None
  if arg.choices is not None and value not in arg.choices:
    raise ValueError(f"{where} must be one of {sorted(arg.choices)}, got {value!r}")
  return value


def validate_kwargs(instruction_id: Any, kwargs: Any) -> dict[str, Any]:
  """The checked keyword arguments for `instruction_id`, or a ValueError naming id and argument.

  None-valued entries are dropped first (the IFEval dataset stores every argument name in
  every row, unused ones as null). All declared arguments are required; unknown ones are errors.
  """
  if not isinstance(instruction_id, str) or instruction_id not in REGISTRY:
    raise ValueError(f"unknown instruction id {instruction_id!r}")
  spec = REGISTRY[instruction_id]
  if kwargs is None:
    kwargs = {}
  if not isinstance(kwargs, dict):
    raise ValueError(f"instruction {instruction_id!r}: kwargs must be a dict, got {type(kwargs).__name__}")
  given = {name: value for name, value in kwargs.items() if value is not None}
  unknown = sorted(set(given) - set(spec.args))
  if unknown:
    raise ValueError(
      f"instruction {instruction_id!r}: unknown argument(s) {unknown}; it takes {sorted(spec.args) or 'none'}"
    )
  missing = sorted(set(spec.args) - set(given))
  if missing:
    raise ValueError(f"instruction {instruction_id!r}: missing argument(s) {missing}")
  converted = {name: _convert(instruction_id, name, spec.args[name], given[name]) for name in spec.args}
  problem = spec.check_args(converted) if spec.check_args is not None else None
  if problem:
    raise ValueError(f"instruction {instruction_id!r}: {problem}")
  return converted
