"""Two layouts of the decoder layers' parameters, and conversion between them.

- Per layer (`scan_layers=False`): `params["layers"][i]` for layer i.
- Stacked (`scan_layers=True`): `params["layer_stacks"][r]` for the r-th entry
  `(start, count)` of `cfg.layer_runs`, every leaf with a leading axis of `count`
  layers (what `jax.lax.scan` runs over).

Everything else (embed, final_norm, lm_head) is the same in both. A config
decides which layout its model uses; `to_layout` converts a tree to the layout
of a config, so a checkpoint written in one layout loads into the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp

from recipe_jax.models.config import ModelConfig


def is_stacked(params: dict) -> bool:
  return "layer_stacks" in params


def stack_layers(cfg: ModelConfig, params: dict) -> dict:
  """Per-layer tree -> stacked tree (traceable; under `jax.jit` XLA builds each stack once)."""
  if is_stacked(params):
    return params
  layers = params["layers"]
  stacks = {r: jax.tree.map(lambda *xs: jnp.stack(xs), *[layers[start + j] for j in range(count)])
            for r, (start, count) in enumerate(cfg.layer_runs)}
  return {**{k: v for k, v in params.items() if k != "layers"}, "layer_stacks": stacks}


def unstack_layers(cfg: ModelConfig, params: dict) -> dict:
  """Stacked tree -> per-layer tree."""
  if not is_stacked(params):
    return params
  layers = {}
  for r, (start, count) in enumerate(cfg.layer_runs):
    for j in range(count):
      layers[start + j] = jax.tree.map(lambda x, j=j: x[j], params["layer_stacks"][r])
  return {**{k: v for k, v in params.items() if k != "layer_stacks"}, "layers": layers}


def to_layout(cfg: ModelConfig, params: dict, *, mesh=None) -> dict:
  """`params` in the layout `cfg.scan_layers` asks for, placed as `param_shardings` says on `mesh`."""
  if is_stacked(params) == cfg.scan_layers:
    return params
  convert = stack_layers if cfg.scan_layers else unstack_layers
  if mesh is None:
    return jax.jit(convert, static_argnums=0)(cfg, params)
  from recipe_jax.models.transformer import abstract_params
  from recipe_jax.parallel.sharding import param_shardings
  shardings = param_shardings(cfg, abstract_params(cfg), mesh)
  return jax.jit(convert, static_argnums=0, out_shardings=shardings)(cfg, params)


def layer_slices(cfg: ModelConfig, path: str) -> Iterator[tuple[str, Callable[[jax.Array], jax.Array]]]:
  """For a stacked leaf's path (`layer_stacks.1.attn.q_proj`), the per-layer paths
  (`layers.1.attn.q_proj`, `layers.2.attn.q_proj`, ...) each with a function taking
  the stacked array to that layer's slice. Any other path maps to itself."""
  head, _, rest = path.partition(".")
  if head != "layer_stacks":
    yield path, lambda x: x
    return
  run, _, leaf = rest.partition(".")
  start, count = cfg.layer_runs[int(run)]
  for j in range(count):
    yield f"layers.{start + j}.{leaf}", lambda x, j=j: x[j]
