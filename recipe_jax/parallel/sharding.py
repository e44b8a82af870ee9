"""The partition-spec tables: how every parameter of every model family is sharded.

Sharding is stated once. Each family's table maps a parameter name (its path
with layer numbers dropped) to the logical axes of its dimensions, in the
axis letters of `models.config`; `AXIS_RULES` maps each letter to a mesh axis.
A parameter missing from its family's table is an error, never silently
replicated.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.config import ConfigError

if TYPE_CHECKING:  # models imports this module; only the type is needed here
  from recipe_jax.models.config import ModelConfig

# Logical axis -> mesh axes. Outside the experts the model width is sharded over
# `fsdp` and `expert` together (the expert axis is one more data-parallel axis
# there); an expert weight's own width axis `d` uses `fsdp` only, since its `E`
# axis takes `expert`. `R` marks small dimensions kept whole. `L` is the leading
# layer axis of stacked (scanned) layers: never sharded, since a scan step reads one
# layer whole.
AXIS_RULES: dict[str, tuple[str, ...]] = {
    "V": ("tensor",), "D": ("fsdp", "expert"), "d": ("fsdp",), "N": ("tensor",), "K": ("tensor",),
    "H": (), "F": ("tensor",), "E": ("expert",), "M": ("tensor",), "S": ("tensor",), "R": (),
    "L": (),
}

# Logical axis -> the config field that sets its size (for error messages).
AXIS_FIELDS = {
    "V": "vocab_size", "D": "hidden_size", "d": "hidden_size", "N": "num_heads", "K": "num_kv_heads", "H": "head_dim",
    "F": "intermediate_size", "E": "num_experts", "M": "moe_intermediate_size",
    "S": "num_shared_experts * moe_intermediate_size", "R": "num_experts", "L": "num_layers",
}

_DENSE = {
    "embed": ("V", "D"),
    "lm_head": ("D", "V"),
    "final_norm.scale": ("R",),
    "input_norm.scale": ("R",),
    "post_attn_norm.scale": ("R",),
    "attn.q_proj": ("D", "N", "H"),
    "attn.k_proj": ("D", "K", "H"),
    "attn.v_proj": ("D", "K", "H"),
    "attn.o_proj": ("N", "H", "D"),
    "attn.q_norm.scale": ("H",),
    "attn.k_norm.scale": ("H",),
    "mlp.gate_proj": ("D", "F"),
    "mlp.up_proj": ("D", "F"),
    "mlp.down_proj": ("F", "D"),
}
_ROUTED_EXPERTS = {
    "moe.router": ("D", "R"),
    "moe.gate_proj": ("E", "d", "M"),
    "moe.up_proj": ("E", "d", "M"),
    "moe.down_proj": ("E", "M", "d"),
}
_GLM_EXTRAS = {
    "attn.q_bias": ("N", "H"),
    "attn.k_bias": ("K", "H"),
    "attn.v_bias": ("K", "H"),
    "moe.router_bias": ("R",),
    "moe.shared.gate_proj": ("D", "S"),
    "moe.shared.up_proj": ("D", "S"),
    "moe.shared.down_proj": ("S", "D"),
}

SHARDING_TABLES: dict[str, dict[str, tuple[str, ...]]] = {
    "qwen3": _DENSE | {k: v for k, v in _GLM_EXTRAS.items() if k.startswith("attn.")},
    "qwen3_moe": _DENSE | _ROUTED_EXPERTS | {k: v for k, v in _GLM_EXTRAS.items() if k.startswith("attn.")},
    "glm4_moe": _DENSE | _ROUTED_EXPERTS | _GLM_EXTRAS,
}


def path_str(path: tuple) -> str:
  return ".".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def _parts(path: tuple) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def table_key(path: tuple) -> str:
  """`layers.3.attn.q_proj` (or stacked: `layer_stacks.1.attn.q_proj`) -> `attn.q_proj`."""
  parts = [p for p in _parts(path) if not p.isdigit()]
  if parts and parts[0] in ("layers", "layer_stacks"):
    parts = parts[1:]
  return ".".join(parts)


def logical_axes(cfg: ModelConfig, path: tuple) -> tuple[str, ...]:
  """The axis letters of a parameter; stacked layers get a leading `L`."""
  key = table_key(path)
  table = SHARDING_TABLES[cfg.family]
  if key not in table:
    raise ConfigError(f"parameter {path_str(path)} has no entry {key!r} in the {cfg.family} sharding table")
  stacked = _parts(path)[:1] == ["layer_stacks"]
  return ("L",) * stacked + table[key]


def _spec(cfg: ModelConfig, path: tuple, shape: tuple[int, ...], mesh_sizes: dict[str, int]) -> P:
  axes = logical_axes(cfg, path)
  if len(axes) != len(shape):
    raise ConfigError(f"parameter {path_str(path)} has shape {shape} but its table entry names "
                      f"{len(axes)} axes {axes}")
  spec = []
  for dim, (letter, size) in enumerate(zip(axes, shape)):
    used = tuple(a for a in AXIS_RULES[letter] if mesh_sizes.get(a, 1) > 1)
    n = math.prod(mesh_sizes[a] for a in used)
    if size % n:
      raise ConfigError(
          f"{AXIS_FIELDS[letter]}: parameter {path_str(path)} dimension {dim} ({letter} = {size}) "
          f"is not divisible by mesh axes {used} of size {n}")
    spec.append(None if not used else used[0] if len(used) == 1 else used)
  return P(*spec)


def param_specs(cfg: ModelConfig, abstract: Any, mesh) -> Any:
  """A tree of `PartitionSpec`s matching `abstract` (arrays or shape structs)."""
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes)) if mesh is not None else {}
  return jax.tree_util.tree_map_with_path(lambda p, x: _spec(cfg, p, tuple(x.shape), sizes), abstract)


def param_shardings(cfg: ModelConfig, abstract: Any, mesh) -> Any:
  """A tree of `NamedSharding`s on `mesh` matching `abstract`."""
  specs = param_specs(cfg, abstract, mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def replicated_params(abstract: Any, specs: Any, *, min_size: int = 1 << 20) -> list[str]:
  """Paths of parameters with more than `min_size` elements that no mesh axis shards.

  `specs` is a tree of `PartitionSpec` or `NamedSharding` matching `abstract`.
  """
  flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, (P, NamedSharding)))
  flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
  out = []
  for (path, x), spec in zip(flat, flat_specs):
    spec = spec.spec if isinstance(spec, NamedSharding) else spec
    if math.prod(x.shape) > min_size and all(a is None for a in spec):
      out.append(f"{path_str(path)} {tuple(x.shape)}")
  return out
