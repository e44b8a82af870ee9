"""Ahead-of-time compilation of a stage's train step for a TPU topology, on any host.

`recipe-jax compile --config configs/sft/<file>.py --topology v5p-64` builds the SFT
train step exactly as `recipe-jax sft` would (same model, loss, optimizer, micro-batches,
mesh), with abstract parameters, optimizer state and batch on compile-only TPU devices,
and reports per-chip memory and compiled FLOPs. Nothing is allocated.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.config import ConfigError
from recipe_jax.models import abstract_params
from recipe_jax.parallel.mesh import BATCH_AXES
from recipe_jax.parallel.sharding import param_shardings
from recipe_jax.stages.sft_objective import make_sft_loss, sft_normalizers
from recipe_jax.training import TrainState, make_optimizer, make_train_step

# Accelerator names (TensorCores) -> chip grids. A v5p chip has two cores run as one device.
V5P_SLICES = {"v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4", "v5p-64": "v5p:2x4x4",
              "v5p-128": "v5p:4x4x4", "v5p-256": "v5p:4x4x8", "v5p-512": "v5p:4x8x8"}
V5P_HBM_BYTES = 95 * 2**30


def topology_name(name: str) -> str:
  """`v5p-64` -> `v5p:2x4x4`; `generation:AxBxC` names pass through."""
  if name in V5P_SLICES:
    return V5P_SLICES[name]
  if re.fullmatch(r"v\d+[a-z]*:\d+(x\d+)*", name):
    return name
  raise ConfigError(f"topology {name!r}: use a slice name ({', '.join(V5P_SLICES)}) or a chip grid "
                    "such as v5p:2x2x1")


def global_rows(cfg, mesh) -> int:
  """Rows per step on the slice: each 4-chip v5p host feeds `pipeline.batch_size` rows."""
  return cfg.pipeline.batch_size * (len(mesh.devices.flat) // 4 or 1)


def _abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def compile_sft_step(cfg, topology: str):
  """Compiles `cfg`'s SFT train step for `topology`; returns `(compiled, mesh)`."""
  from recipe_jax.parallel.tpu import tpu_topology_mesh

  model = cfg.model
  if model is None:
    raise ConfigError("model: compiling needs the architecture in the config (a preset such as "
                      "get_preset('qwen3-8b')), since no checkpoint is read")
  mesh = tpu_topology_mesh(topology_name(topology), cfg.mesh)
  optimizer = make_optimizer(cfg.optimizer)
  params = abstract_params(model)
  p_sh = param_shardings(model, params, mesh)
  replicated = NamedSharding(mesh, P())
  opt_state = jax.eval_shape(optimizer.init, params)
  o_sh = optax.tree_map_params(optimizer, lambda _, s: s, opt_state, p_sh,
                               transform_non_params=lambda _: replicated)
  state_sh = TrainState(replicated, p_sh, o_sh)
  state = TrainState(jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated), _abstract(params, p_sh),
                     _abstract(opt_state, o_sh))
  rows = global_rows(cfg, mesh)
  batch_sh = NamedSharding(mesh, P(BATCH_AXES))
  shape = (rows, cfg.pipeline.seq_len)
  batch = {k: jax.ShapeDtypeStruct(shape, dt, sharding=batch_sh) for k, dt in
           dict(tokens=jnp.int32, targets=jnp.int32, segment_ids=jnp.int32, positions=jnp.int32,
                loss_mask=jnp.float32).items()}
  step = make_train_step(make_sft_loss(model, cfg.loss, num_micro_batches=cfg.num_micro_batches, mesh=mesh),
                         optimizer, normalizers_fn=sft_normalizers, num_micro_batches=cfg.num_micro_batches)
  compiled = jax.jit(step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None),
                     donate_argnums=(0,)).lower(state, batch).compile()
  return compiled, mesh


def report_lines(compiled, mesh, cfg) -> list[str]:
  from recipe_jax.parallel.tpu import compile_report

  from recipe_jax.metrics import train_flops_per_token

  r = compile_report(compiled)
  gib = 2**30
  chips = len(mesh.devices.flat)
  rows = global_rows(cfg, mesh)
  model_flops = train_flops_per_token(cfg.model, cfg.pipeline.seq_len) * rows * cfg.pipeline.seq_len / chips
  # XLA's cost analysis counts a while loop's body once, so with scanned layers it misses
  # (layers - runs) layers; the analytic count (6N + attention, PaLM) is the one to trust there.
  scanned = " (scanned layers: the loop body counted once)" if cfg.model.scan_layers else ""
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  fits = "fits" if r.peak_bytes <= V5P_HBM_BYTES else "does NOT fit"
  flops = "n/a" if r.flops is None else f"{r.flops:.3e} FLOP"
  return [
      f"train step for {cfg.model.family} ({cfg.model.num_layers} layers) on {len(mesh.devices.flat)} "
      f"{mesh.devices.flat[0].device_kind} chips, mesh {sizes}, batch {cfg.pipeline.seq_len} tokens/row",
      f"per chip: arguments {r.argument_bytes / gib:.2f} GiB, temporaries {r.temp_bytes / gib:.2f} GiB, "
      f"peak {r.peak_bytes / gib:.2f} GiB of {V5P_HBM_BYTES / gib:.0f} GiB HBM ({fits})",
      f"compiled cost per chip: {flops}{scanned}",
      f"model FLOPs per chip and step (6N + attention): {model_flops:.3e}",
  ]
