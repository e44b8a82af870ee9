"""Typed configuration helpers shared by every config in the project.

Configs are frozen dataclasses that validate themselves in ``__post_init__``.
This module adds what all of them need: a common error type, dotted-key
overrides from the command line (``--set model.num_layers=2``) that reject
unknown keys, and loading of experiment files from ``configs/``.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import pathlib
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any


class ConfigError(ValueError):
  """A config field holds a value that cannot work; the message names the field."""


def require(condition: bool, field: str, message: str) -> None:
  """Raises `ConfigError` naming `field` unless `condition` holds."""
  if not condition:
    raise ConfigError(f"{field}: {message}")


def check_choices(config: Any) -> None:
  """Raises `ConfigError` naming the field when a `Literal` field holds an unlisted value."""
  for name, hint in _field_types(type(config)).items():
    if typing.get_origin(hint) is typing.Literal:
      value = getattr(config, name)
      require(value in typing.get_args(hint), name,
              f"{value!r} is not one of {list(typing.get_args(hint))}")


# ----------------------------------------------------------------------------
# Overrides
# ----------------------------------------------------------------------------


def _field_types(cls: type) -> dict[str, Any]:
  hints = typing.get_type_hints(cls)
  return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _parse_scalar(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text  # a bare word is a string: --set model.dtype=bfloat16


def _coerce(value: Any, annotation: Any, key: str) -> Any:
  """Converts a parsed override to the annotated type, or raises naming `key`."""
  origin = typing.get_origin(annotation)
  args = typing.get_args(annotation)
  if origin in (typing.Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    errors = []
    for arg in args:
      if arg is type(None):
        continue
      try:
        return _coerce(value, arg, key)
      except ConfigError as e:
        errors.append(str(e))
    raise ConfigError(f"{key}: cannot read {value!r} as {annotation}")
  if origin is typing.Literal:
    if value not in args:
      raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
    return value
  if origin is tuple:
    if not isinstance(value, (tuple, list)):
      value = (value,)
    inner = args[0] if args else Any
    return tuple(_coerce(v, inner, key) for v in value)
  if annotation is bool:
    if isinstance(value, bool):
      return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
      return value.lower() == "true"
    raise ConfigError(f"{key}: expected true or false, got {value!r}")
  if annotation is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ConfigError(f"{key}: expected an integer, got {value!r}")
    return value
  if annotation is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key}: expected a number, got {value!r}")
    return float(value)
  if annotation is str:
    return str(value)
  return value


def override(config: Any, updates: Mapping[str, Any] | Iterable[str]) -> Any:
  """Returns `config` with dotted-key updates applied.

  Args:
    config: a (nested) frozen dataclass.
    updates: ``{"model.num_layers": 2}`` or ``["model.num_layers=2"]``; string
      values are parsed as Python literals, falling back to the bare string.

  Raises:
    ConfigError: for an unknown key (listing the valid ones at that level) or a
      value of the wrong type; the field's own validation runs on rebuild.
  """
  if not isinstance(updates, Mapping):
    parsed = {}
    for item in updates:
      if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value")
      key, text = item.split("=", 1)
      parsed[key.strip()] = _parse_scalar(text.strip())
    updates = parsed
  tree: dict[str, Any] = {}
  for key, value in updates.items():
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise ConfigError(f"{key}: conflicts with another override of {part}")
    node[parts[-1]] = (key, value)
  return _apply(config, tree, "")


def _apply(node: Any, tree: dict[str, Any], prefix: str) -> Any:
  """Applies a tree of updates with one `replace` per dataclass, so related fields change
  together (e.g. num_experts and num_experts_per_tok) before validation runs."""
  if not dataclasses.is_dataclass(node):
    raise ConfigError(f"{prefix.rstrip('.')}: {type(node).__name__} has no fields to set")
  types_ = _field_types(type(node))
  changes = {}
  for name, sub in tree.items():
    full_key = sub[0] if isinstance(sub, tuple) else prefix + name
    if name not in types_:
      raise ConfigError(
          f"{full_key}: unknown key {name!r} in {type(node).__name__}; "
          f"valid keys: {', '.join(sorted(types_))}")
    if isinstance(sub, tuple):
      changes[name] = _coerce(sub[1], types_[name], full_key)
    else:
      changes[name] = _apply(getattr(node, name), sub, prefix + name + ".")
  return dataclasses.replace(node, **changes)


def to_dict(config: Any) -> dict[str, Any]:
  """A JSON-friendly nested dict of a config."""
  return dataclasses.asdict(config)


# ----------------------------------------------------------------------------
# Experiment files
# ----------------------------------------------------------------------------


def load_config_file(path: str | pathlib.Path, *, overrides: Iterable[str] = ()) -> Any:
  """Loads ``get_config()`` from a Python config file, then applies overrides."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ConfigError(f"config file {path} does not exist")
  spec = importlib.util.spec_from_file_location(f"recipe_jax_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file {path} defines no get_config()")
  return override(module.get_config(), list(overrides))


def load_typed_config(path: str | pathlib.Path | None, expected: type, *, overrides: Iterable[str] = (),
                      default: Any = None) -> Any:
  """`path`'s get_config() (or `default` when no path is given) with overrides applied; ConfigError
  unless the result is an `expected`."""
  if path:
    config = load_config_file(path, overrides=overrides)
  elif default is not None:
    config = override(default, list(overrides))
  else:
    raise ConfigError(f"give a config file defining get_config() -> {expected.__name__}")
  if not isinstance(config, expected):
    raise ConfigError(f"{path}: get_config() returned {type(config).__name__}, not {expected.__name__}")
  return config
