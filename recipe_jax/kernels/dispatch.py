"""Which attention implementation runs: by the configured `attention_impl`, platform, shape and mesh.

`attention_impl` (a `ModelConfig` field) names a request:

* `xla` (default): the plain XLA reference.
* `auto`: the Pallas kernel of the platform (the mesh's devices, else JAX's default
  backend; TPU: splash attention, GPU: the Triton kernel), XLA on CPU. A TPU topology
  mesh on a CPU host therefore gets the TPU kernel when compiling ahead of time.
* `pallas_tpu`, `pallas_gpu`: that kernel whatever the host platform (how a
  TPU executable is compiled ahead of time on a CPU host).
* `pallas_tpu_interpret`, `pallas_gpu_interpret`: the same kernels in Pallas
  interpret mode, on any platform (tests; slow).

A request for a kernel that cannot take the shape or the mesh falls back to
XLA with a logged warning saying why; every choice is logged at INFO when the
function is traced (logger `recipe_jax.kernels`). Shapes that do not fit the
attention contract raise ValueError before anything runs.

With a mesh (the one passed, else the context mesh of `jax.set_mesh`), a
kernel runs inside `shard_map`: rows split over `data, fsdp, expert`, heads
over `tensor`; `pallas_call` is not partitioned automatically.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import jax
from jax.sharding import PartitionSpec as P

from recipe_jax.kernels.decode_gpu import decode_attention_gpu
from recipe_jax.kernels.decode_tpu import decode_attention_tpu
from recipe_jax.kernels.flash_gpu import flash_attention_gpu
from recipe_jax.kernels.flash_tpu import flash_attention_tpu
from recipe_jax.kernels.reference import check_attention_shapes, check_decode_shapes, decode_attention_xla
from recipe_jax.parallel.mesh import BATCH_AXES, mesh_platform

logger = logging.getLogger("recipe_jax.kernels")

IMPLS = ("xla", "auto", "pallas_tpu", "pallas_gpu", "pallas_tpu_interpret", "pallas_gpu_interpret")
TPU_HEAD_DIMS = (64, 128, 256)
GPU_HEAD_DIMS = (16, 32, 64, 128, 256)  # Triton tiles are powers of two; dot needs >= 16


class KernelChoice(NamedTuple):
  """The implementation that runs: `kernel` in (xla, pallas_tpu, pallas_gpu), and why."""

  kernel: str
  interpret: bool
  reason: str

  @property
  def label(self) -> str:
    return self.kernel + (" (interpret)" if self.interpret else "")


def context_mesh(mesh=None):
  """`mesh`, else the mesh set with `jax.set_mesh` (abstract: works under jit), else None."""
  if mesh is not None:
    return mesh
  abstract = jax.sharding.get_abstract_mesh()
  return None if abstract.empty else abstract


def _axis_sizes(mesh) -> dict[str, int]:
  return {} if mesh is None else dict(zip(mesh.axis_names, mesh.axis_sizes))


def _requested(impl: str, platform: str) -> tuple[str, bool] | None:
  """(kernel, interpret) a request names, or None for xla / auto on CPU."""
  if impl not in IMPLS:
    raise ValueError(f"attention_impl {impl!r} is unknown; choose one of {', '.join(IMPLS)}")
  if impl == "xla":
    return None
  if impl == "auto":
    return {"tpu": ("pallas_tpu", False), "gpu": ("pallas_gpu", False)}.get(platform)
  return impl.removesuffix("_interpret"), impl.endswith("_interpret")


def _mesh_problem(mesh, batch: int, heads: tuple[int, ...]) -> str | None:
  sizes = _axis_sizes(mesh)
  shards = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
  if batch % shards:
    return f"batch {batch} is not divisible by the mesh batch shards data*fsdp*expert={shards}"
  tensor = sizes.get("tensor", 1)
  for name, count in zip(("N", "K"), heads):
    if count % tensor:
      return f"{name}={count} heads are not divisible by the mesh tensor axis {tensor}"
  return None


def _first(*problems: str | None) -> str | None:
  return next((p for p in problems if p is not None), None)


def _head_dim_problem(h: int, supported: tuple[int, ...]) -> str | None:
  return None if h in supported else f"head dim {h} is not one of {supported}"


def _choose(impl: str, problems: dict[str, str | None], what: str, mesh=None) -> KernelChoice:
  platform = mesh_platform(mesh)  # the mesh's devices: a TPU topology on a CPU host says tpu
  requested = _requested(impl, platform)
  if requested is None:
    why = "configured" if impl == "xla" else f"auto on {platform}: no Pallas kernel"
    choice = KernelChoice("xla", False, why)
    logger.info("%s: xla (%s)", what, why)
    return choice
  kernel, interpret = requested
  problem = problems[kernel]
  if problem is not None:
    logger.warning("%s: %s requested (attention_impl=%r) but falls back to xla: %s",
                   what, kernel, impl, problem)
    return KernelChoice("xla", False, problem)
  choice = KernelChoice(kernel, interpret, f"attention_impl={impl!r}")
  logger.info("%s: %s (%s)", what, choice.label, choice.reason)
  return choice


def choose_attention_kernel(impl: str, q_shape, k_shape, *, mesh=None) -> KernelChoice:
  """The kernel for causal segment attention of q `[B, T, N, H]` over k `[B, S, K, H]`."""
  b, t, n, h = q_shape
  s, kv_heads = k_shape[1], k_shape[2]
  common = None
  if t != s:
    common = f"the kernels are for self-attention (T == S); got T={t}, S={s}"
  common = common or _mesh_problem(mesh, b, (n, kv_heads))
  problems = {
      "pallas_tpu": _first(common, _head_dim_problem(h, TPU_HEAD_DIMS)),
      "pallas_gpu": _first(common, _head_dim_problem(h, GPU_HEAD_DIMS)),
  }
  return _choose(impl, problems, f"attention q{tuple(q_shape)} k{tuple(k_shape)}", mesh)


def choose_decode_kernel(impl: str, q_shape, cache_shape, *, mesh=None) -> KernelChoice:
  """The kernel for decode attention of q `[B, N, H]` over caches `[B, S, K, H]`."""
  b, n, h = q_shape
  s, kv_heads = cache_shape[1], cache_shape[2]
  common = _mesh_problem(mesh, b, (n, kv_heads))
  long_enough = None if s % 16 == 0 else f"cache length {s} is not a multiple of 16"
  problems = {
      "pallas_tpu": _first(common, long_enough, _head_dim_problem(h, TPU_HEAD_DIMS)),
      "pallas_gpu": _first(common, long_enough, _head_dim_problem(h, GPU_HEAD_DIMS)),
  }
  return _choose(impl, problems, f"decode attention q{tuple(q_shape)} cache{tuple(cache_shape)}", mesh)


def _sharded(fn, mesh, in_specs, out_spec):
  """`fn` as is without a multi-device mesh, else inside `shard_map` over it."""
  if mesh is None or math.prod(mesh.axis_sizes) == 1:
    return fn
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)


def _specs(mesh):
  names = set(mesh.axis_names) if mesh is not None else set()
  batch = tuple(a for a in BATCH_AXES if a in names) or None
  heads = "tensor" if "tensor" in names else None
  return batch, heads


def run_flash_attention(choice: KernelChoice, q, k, v, *, q_segment_ids, kv_segment_ids, scale,
                        mesh=None) -> jax.Array:
  """Runs the Pallas kernel `choice` names (see `choose_attention_kernel`)."""
  kernel = {"pallas_tpu": flash_attention_tpu, "pallas_gpu": flash_attention_gpu}[choice.kernel]

  def local(q, k, v, q_ids, kv_ids):
    return kernel(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids, scale=scale,
                  interpret=choice.interpret)

  batch, heads = _specs(mesh)
  rows, ids = P(batch, None, heads, None), P(batch, None)
  return _sharded(local, mesh, (rows, rows, rows, ids, ids), rows)(
      q, k, v, q_segment_ids, kv_segment_ids)


def flash_attention(q, k, v, *, q_segment_ids, kv_segment_ids, scale, impl: str = "auto",
                    mesh=None, reference=None) -> jax.Array:
  """Causal segment attention through the kernel `impl` selects (see the module docstring).

  `reference(q, k, v, q_segment_ids=, kv_segment_ids=, scale=)` runs when XLA
  is chosen (`recipe_jax.models.attention.attention_xla`; required then).
  """
  check_attention_shapes(q, k, v, q_segment_ids, kv_segment_ids)
  mesh = context_mesh(mesh)
  choice = choose_attention_kernel(impl, q.shape, k.shape, mesh=mesh)
  if choice.kernel == "xla":
    if reference is None:
      raise ValueError(f"attention falls back to xla ({choice.reason}) but no reference was given")
    return reference(q, k, v, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, scale=scale)
  return run_flash_attention(choice, q, k, v, q_segment_ids=q_segment_ids,
                             kv_segment_ids=kv_segment_ids, scale=scale, mesh=mesh)


def decode_attention(q, k_cache, v_cache, lengths, *, scale: float, impl: str = "auto",
                     mesh=None) -> jax.Array:
  """One query token per row against ragged KV caches through the kernel `impl` selects.

  q `[B, N, H]`, k_cache / v_cache `[B, S, K, H]`, lengths `[B]` (filled slots
  per row). Returns `[B, N, H]`; see `reference.decode_attention_xla`.
  """
  check_decode_shapes(q, k_cache, v_cache, lengths)
  mesh = context_mesh(mesh)
  choice = choose_decode_kernel(impl, q.shape, k_cache.shape, mesh=mesh)
  if choice.kernel == "xla":
    return decode_attention_xla(q, k_cache, v_cache, lengths, scale=scale)
  kernel = {"pallas_tpu": decode_attention_tpu, "pallas_gpu": decode_attention_gpu}[choice.kernel]

  def local(q, k_cache, v_cache, lengths):
    return kernel(q, k_cache, v_cache, lengths, scale=scale, interpret=choice.interpret)

  batch, heads = _specs(mesh)
  cache = P(batch, None, heads, None)
  return _sharded(local, mesh, (P(batch, heads, None), cache, cache, P(batch)),
                  P(batch, heads, None))(q, k_cache, v_cache, lengths)
