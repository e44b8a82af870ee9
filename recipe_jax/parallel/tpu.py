"""Ahead-of-time compilation for TPU on a host without one.

With the `libtpu` wheel installed (`pip install "jax[tpu]==0.10.2"`, which
pulls `libtpu==0.0.42.*`), `jax.experimental.topologies` describes a TPU slice
as compile-only devices. A mesh over them lets `jax.jit(...).lower(...)
.compile()` produce a real TPU executable on a CPU machine: its HLO,
`memory_analysis()` and `cost_analysis()` are the TPU compiler's, so sharding,
collectives and memory can be checked before a TPU is rented.

Nothing here imports libtpu at module import time; `tpu_topology_mesh` raises
`TpuUnavailableError` when the wheel is missing. The host's own backend stays
whatever `JAX_PLATFORMS` says (CPU in the tests); only the plugin is loaded.

    mesh = tpu_topology_mesh("v5p:2x2x1", (1, 1, 4, 1))
    compiled = compile_for_tpu(fn, args, in_shardings, out_shardings)
    compile_report(compiled)  # flops, bytes accessed, argument/temp bytes
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax

from recipe_jax.parallel.mesh import MeshConfig, make_mesh


class TpuUnavailableError(RuntimeError):
  """The `libtpu` wheel (the TPU compiler) is not installed."""


def libtpu_available() -> bool:
  """Whether the TPU compiler can be loaded (the `libtpu` wheel, or `TPU_LIBRARY_PATH`)."""
  path = os.environ.get("TPU_LIBRARY_PATH")
  return bool(path and os.path.isfile(path)) or importlib.util.find_spec("libtpu") is not None


def _quiet_tpu_runtime_env() -> None:
  """Sets the env vars whose absence makes libtpu log metadata-server warnings on a TPU-less host.

  JAX sets `TPU_SKIP_MDS_QUERY=1` at import when it sees no TPU chip; only then
  do we fill in a fake single-host identity (a real TPU VM keeps its own). These
  only affect logging: the compile target is the topology passed explicitly.
  Compile-only use never touches a chip, so several processes (parallel test
  workers) may load libtpu at once: its single-process lockfile is waived.
  """
  if os.environ.get("TPU_SKIP_MDS_QUERY") == "1":
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")


def tpu_topology_devices(topology: str = "v5p:2x2x1", *, num_slices: int = 1,
                         chips_per_host_bounds: Sequence[int] | None = None) -> list:
  """Compile-only TPU devices of `topology` (e.g. `v5p:2x2x1`, `v5p:4x4x4`, `v5e:4x4`, `v6e:2x2`).

  The name is `<generation>:<chip grid>`; `v5p-8` style accelerator names are
  rejected by libtpu. v5p gives one device per chip (megacore); a topology larger
  than one host (4 chips on v5p) spans several processes, which compiles fine.
  """
  if not libtpu_available():
    raise TpuUnavailableError(
        "TPU compilation needs the libtpu wheel: pip install 'jax[tpu]==" + jax.__version__ + "'")
  _quiet_tpu_runtime_env()
  from jax.experimental import topologies  # loads the TPU plugin on first use

  kwargs: dict[str, Any] = {"num_slices": num_slices}
  if chips_per_host_bounds is not None:
    kwargs["chips_per_host_bounds"] = tuple(chips_per_host_bounds)
  return list(topologies.get_topology_desc(topology_name=topology, platform="tpu", **kwargs).devices)


def tpu_topology_mesh(topology: str = "v5p:2x2x1", mesh_shape: MeshConfig | Sequence[int] = MeshConfig(),
                      *, num_slices: int = 1, chips_per_host_bounds: Sequence[int] | None = None
                      ) -> jax.sharding.Mesh:
  """A mesh with axes `data, fsdp, expert, tensor` (AxisType.Auto) over compile-only TPU devices.

  `mesh_shape` is a `MeshConfig` or the four axis sizes (one may be -1); the
  default puts every chip on `fsdp`. The axis sizes must multiply to the number
  of chips in the topology (times `num_slices`): the executable is for the whole slice.
  """
  devices = tpu_topology_devices(topology, num_slices=num_slices,
                                 chips_per_host_bounds=chips_per_host_bounds)
  shape = mesh_shape if isinstance(mesh_shape, MeshConfig) else MeshConfig(*mesh_shape)
  sizes = shape.resolve(len(devices))  # raises ConfigError unless the shape covers every chip
  return make_mesh(sizes, devices=devices)


def compile_for_tpu(fn, args_abstract: Sequence[Any], in_shardings=None, out_shardings=None, *,
                    static_argnums: Sequence[int] = (), donate_argnums: Sequence[int] = ()):
  """`jax.jit(fn, ...).lower(*args_abstract).compile()`: the compiled executable.

  `args_abstract` are `jax.ShapeDtypeStruct` trees (or anything with shape and
  dtype); shardings are those of `jax.jit` and must name devices of a TPU mesh
  (`tpu_topology_mesh`). With `in_shardings=None` the structs' own `sharding`
  is used. The result cannot run on a host without the TPU, but
  `.as_text()`, `.memory_analysis()` and `.cost_analysis()` work.
  """
  kwargs: dict[str, Any] = {"static_argnums": tuple(static_argnums),
                            "donate_argnums": tuple(donate_argnums)}
  if in_shardings is not None:
    kwargs["in_shardings"] = in_shardings
  if out_shardings is not None:
    kwargs["out_shardings"] = out_shardings
  return jax.jit(fn, **kwargs).lower(*args_abstract).compile()


class CompileReport(NamedTuple):
  """What the TPU compiler says one executable costs, per device.

  flops, transcendentals, bytes_accessed: from `cost_analysis()` (None when the
  compiler does not report them). The `*_bytes` fields: from `memory_analysis()`,
  in bytes of device memory (HBM) per device.
  """

  flops: float | None
  transcendentals: float | None
  bytes_accessed: float | None
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int

  @property
  def peak_bytes(self) -> int:
    """Arguments + outputs + temporaries, less outputs aliased to (donated) arguments."""
    return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes


def compile_report(compiled) -> CompileReport:
  """Flops, bytes accessed and argument / output / temp memory of a compiled executable."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0] if cost else {}
  cost = cost or {}
  mem = compiled.memory_analysis()
  if mem is None:
    raise RuntimeError("the compiled executable has no memory analysis")

  def get(key):
    v = cost.get(key)
    return None if v is None else float(v)

  return CompileReport(
      flops=get("flops"), transcendentals=get("transcendentals"), bytes_accessed=get("bytes accessed"),
      argument_bytes=int(mem.argument_size_in_bytes), output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes), temp_bytes=int(mem.temp_size_in_bytes),
      generated_code_bytes=int(mem.generated_code_size_in_bytes))


def hlo_ops(compiled, *names: str) -> dict[str, int]:
  """How often each HLO op `name` (e.g. `ragged-all-to-all`, `all-to-all`) occurs in the compiled HLO."""
  text = compiled.as_text()
  return {n: text.count(f" {n}(") for n in names}
