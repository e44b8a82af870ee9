"""Device meshes over the four axes `data, fsdp, expert, tensor`.

* `data`: pure data parallelism (parameters replicated).
* `fsdp`: batch split and parameters / optimizer state sharded (gathered per use).
* `expert`: experts sharded; outside MoE layers it splits the batch too, and
  token copies are exchanged across it with all-to-all.
* `tensor`: attention heads, MLP hidden and vocabulary sharded.

Any axis may have size 1. Meshes use `AxisType.Auto`, so XLA propagates
shardings from parameters and inputs; explicit `shard_map` regions (expert
dispatch) state their own specs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from recipe_jax.config import require

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Sizes of the mesh axes; -1 in at most one axis means "all remaining devices"."""

  data: int = 1
  fsdp: int = -1
  expert: int = 1
  tensor: int = 1

  def __post_init__(self):
    sizes = self.shape
    require(sum(s == -1 for s in sizes) <= 1, "mesh", "at most one axis may be -1")
    for name, s in zip(MESH_AXES, sizes):
      require(s == -1 or s >= 1, f"mesh.{name}", f"must be >= 1 or -1, got {s}")

  @property
  def shape(self) -> tuple[int, int, int, int]:
    return (self.data, self.fsdp, self.expert, self.tensor)

  def resolve(self, num_devices: int) -> tuple[int, ...]:
    """Axis sizes with -1 filled in; raises naming the axes if they do not fit `num_devices`."""
    sizes = list(self.shape)
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      require(num_devices % known == 0, "mesh",
              f"{num_devices} devices cannot be split as {dict(zip(MESH_AXES, sizes))}")
      sizes[sizes.index(-1)] = num_devices // known
    require(math.prod(sizes) == num_devices, "mesh",
            f"axis sizes {dict(zip(MESH_AXES, sizes))} multiply to {math.prod(sizes)}, "
            f"but there are {num_devices} devices")
    return tuple(sizes)


def make_mesh(shape: MeshConfig | Sequence[int] = MeshConfig(), devices: Sequence | None = None) -> Mesh:
  """A mesh with axes `MESH_AXES` over `devices` (default: all devices).

  A fully specified shape smaller than the device list uses its first devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  if not isinstance(shape, MeshConfig):
    shape = MeshConfig(*shape)
  if -1 not in shape.shape and math.prod(shape.shape) < len(devices):
    devices = devices[:math.prod(shape.shape)]
  sizes = shape.resolve(len(devices))
  try:
    return jax.make_mesh(sizes, MESH_AXES, axis_types=(AxisType.Auto,) * 4, devices=devices)
  except Exception:  # device sets that mesh_utils cannot lay out physically
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 4)


def axis_size(mesh, name: str) -> int:
  """Size of axis `name` in `mesh` (1 when the mesh lacks it or is None)."""
  if mesh is None or name not in mesh.axis_names:
    return 1
  return dict(zip(mesh.axis_names, mesh.axis_sizes))[name]


def batch_shards(mesh) -> int:
  return math.prod(axis_size(mesh, a) for a in BATCH_AXES)


def mesh_platform(mesh=None) -> str:
  """The platform of `mesh`'s devices ("cpu", "gpu", "tpu"), else JAX's default backend.

  A compile-only TPU topology mesh says "tpu" on a CPU host, so `auto` choices made
  from it pick the TPU code path when compiling ahead of time.
  """
  if isinstance(mesh, jax.sharding.Mesh):
    return mesh.devices.flat[0].platform
  if getattr(mesh, "abstract_device", None) is not None:  # an abstract mesh (jax.set_mesh)
    return mesh.abstract_device.platform
  return jax.default_backend()
