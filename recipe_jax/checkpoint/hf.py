"""Hugging Face checkpoints (safetensors + config.json) in and out of our parameter tree.

`load` reads Qwen3, Qwen3-MoE and GLM-4.5 checkpoints and places every
parameter straight onto its shards: each device's piece is read from a
memory-mapped safetensors file, so no host ever holds a whole sharded tensor
(only the slices it serves). `save` writes a checkpoint that
`transformers.AutoModelForCausalLM.from_pretrained` loads, streaming one
parameter at a time to disk.

Tensor layout. Torch `Linear` weights are `[out, in]`; ours are `[in, out]`
with head axes split out (`q_proj` `[D, N, H]` from `[N*H, D]`, `o_proj`
`[N, H, D]` from `[D, N*H]`). Routed experts come in two layouts, both read:
hub-style per-expert keys `mlp.experts.{e}.{gate,up,down}_proj.weight`, and
the fused tensors transformers 5 holds in memory, `mlp.experts.gate_up_proj`
`[E, 2M, D]` (gate rows, then up rows) and `mlp.experts.down_proj` `[E, D, M]`.
`save` writes the per-expert layout: it is what transformers 5.24's own
`save_pretrained` writes (its conversion mapping splits the fused tensors on
save and merges them on load) and what other readers of hub checkpoints expect.

GLM-4.5 checkpoints carry `num_nextn_predict_layers` multi-token-prediction
layers stored as `model.layers.{num_hidden_layers + j}.*`. They are not part of
the decoder; `load` skips them and logs how many tensors it skipped.

safetensors files are parsed here directly (an 8-byte header length, a JSON
header, raw little-endian data) because the library's numpy reader cannot
return bfloat16 and its flax reader materializes tensors on the default
accelerator; a memory map with `ml_dtypes` handles every float dtype and
touches only the bytes a slice needs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import pathlib
import re

import jax
import ml_dtypes
import numpy as np

from recipe_jax.checkpoint.hf_config import CheckpointError, config_from_hf, config_to_hf
from recipe_jax.models.config import ModelConfig
from recipe_jax.models.stacking import layer_slices
from recipe_jax.models.transformer import abstract_params
from recipe_jax.parallel.sharding import param_shardings, path_str

log = logging.getLogger(__name__)

_ST_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
              "BF16": np.dtype(ml_dtypes.bfloat16)}
_ST_CODES = {v: k for k, v in _ST_DTYPES.items()}
_OWN_FILES = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?")
_INDEX = "model.safetensors.index.json"

__all__ = ["CheckpointError", "config_from_hf", "config_to_hf", "load", "save", "tensor_map"]


# ----------------------------------------------------------------------------
# Where each parameter lives in a Hugging Face checkpoint
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
  """How one of our parameters is stored.

  The stored tensor is `keys[0]` of shape `stored`, or, with `stacked`, one
  tensor per key (per expert) of shape `stored`, stacked on a new leading
  axis. Our parameter is the window of that tensor starting at `lo` whose
  axes, split into the sizes `view[axis]`, are transposed by `perm`
  (`ours = window.reshape(flat(view)).transpose(perm)`).
  """

  keys: tuple[str, ...]
  stored: tuple[int, ...]
  view: tuple[tuple[int, ...], ...]
  perm: tuple[int, ...]
  stacked: bool = False
  lo: tuple[int, ...] | None = None

  def read(self, get, index: tuple[slice, ...]) -> np.ndarray:
    """Our parameter's block `index`, reading only the stored rows it needs via `get(key, slices)`."""
    sizes = [n for group in self.view for n in group]
    vidx = [None] * len(sizes)
    for ours, v in enumerate(self.perm):
      vidx[v] = range(*index[ours].indices(sizes[v]))
    coarse, fine, shape, pos = [], [], [], 0
    for ax, group in enumerate(self.view):
      inner, lead = math.prod(group[1:]), vidx[pos]
      start = self.lo[ax] if self.lo else 0
      coarse.append(slice(start + lead.start * inner, start + lead.stop * inner))
      shape += [len(lead), *group[1:]]
      fine += [slice(None)] + [slice(r.start, r.stop) for r in vidx[pos + 1:pos + len(group)]]
      pos += len(group)
    if self.stacked:
      experts = range(coarse[0].start, coarse[0].stop)
      arr = np.stack([get(self.keys[e], tuple(coarse[1:])) for e in experts])
    else:
      arr = get(self.keys[0], tuple(coarse))
    return arr.reshape(shape)[tuple(fine)].transpose(self.perm)

  def split(self, ours: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The stored tensors holding our full parameter `ours` (inverse of `read`; no windows)."""
    full = ((len(self.keys),) if self.stacked else ()) + self.stored
    arr = ours.transpose(np.argsort(self.perm)).reshape(full)
    return list(zip(self.keys, arr)) if self.stacked else [(self.keys[0], arr)]


def _plain(key: str, shape: tuple[int, ...]) -> Source:
  return Source((key,), shape, tuple((n,) for n in shape), tuple(range(len(shape))))


def _linear(key: str, out: tuple[int, ...], inp: tuple[int, ...]) -> Source:
  """A torch Linear weight `[prod(out), prod(in)]` held as `[*in, *out]`."""
  o, i = len(out), len(inp)
  return Source((key,), (math.prod(out), math.prod(inp)), (out, inp),
                tuple(range(o, o + i)) + tuple(range(o)))


def _bias(key: str, heads: int, head_dim: int) -> Source:
  return Source((key,), (heads * head_dim,), ((heads, head_dim),), (0, 1))


def _mlp(m: dict, ours: str, theirs: str, d: int, width: int) -> None:
  m[f"{ours}.gate_proj"] = _linear(f"{theirs}.gate_proj.weight", (width,), (d,))
  m[f"{ours}.up_proj"] = _linear(f"{theirs}.up_proj.weight", (width,), (d,))
  m[f"{ours}.down_proj"] = _linear(f"{theirs}.down_proj.weight", (d,), (width,))


def _experts(m: dict, ours: str, theirs: str, cfg: ModelConfig, fused: bool) -> None:
  e, d, mm = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
  to_ours = (0, 2, 1)  # [E, out, in] -> [E, in, out]
  if fused:
    gate_up = f"{theirs}.gate_up_proj"
    for j, name in enumerate(("gate_proj", "up_proj")):
      m[f"{ours}.{name}"] = Source((gate_up,), (e, 2 * mm, d), ((e,), (mm,), (d,)), to_ours,
                                   lo=(0, j * mm, 0))
    m[f"{ours}.down_proj"] = Source((f"{theirs}.down_proj",), (e, d, mm), ((e,), (d,), (mm,)), to_ours)
    return
  for name, out, inp in (("gate_proj", mm, d), ("up_proj", mm, d), ("down_proj", d, mm)):
    keys = tuple(f"{theirs}.{i}.{name}.weight" for i in range(e))
    m[f"{ours}.{name}"] = Source(keys, (out, inp), ((e,), (out,), (inp,)), to_ours, stacked=True)


def tensor_map(cfg: ModelConfig, fused_layers=frozenset()) -> dict[str, Source]:
  """Our parameter path (`layers.3.attn.q_proj`) -> its `Source`.

  Experts of the layers in `fused_layers` use the fused transformers-5
  layout; the others use per-expert keys.
  """
  d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  m = {"embed": _plain("model.embed_tokens.weight", (cfg.vocab_size, d)),
       "final_norm.scale": _plain("model.norm.weight", (d,))}
  if not cfg.tie_word_embeddings:
    m["lm_head"] = _linear("lm_head.weight", (cfg.vocab_size,), (d,))
  for i in range(cfg.num_layers):
    ours, theirs = f"layers.{i}", f"model.layers.{i}"
    m[f"{ours}.input_norm.scale"] = _plain(f"{theirs}.input_layernorm.weight", (d,))
    m[f"{ours}.post_attn_norm.scale"] = _plain(f"{theirs}.post_attention_layernorm.weight", (d,))
    a = f"{theirs}.self_attn"
    for x, heads in (("q", n), ("k", k), ("v", k)):
      m[f"{ours}.attn.{x}_proj"] = _linear(f"{a}.{x}_proj.weight", (heads, h), (d,))
      if cfg.attention_bias:
        m[f"{ours}.attn.{x}_bias"] = _bias(f"{a}.{x}_proj.bias", heads, h)
    m[f"{ours}.attn.o_proj"] = _linear(f"{a}.o_proj.weight", (d,), (n, h))
    if cfg.qk_norm:
      m[f"{ours}.attn.q_norm.scale"] = _plain(f"{a}.q_norm.weight", (h,))
      m[f"{ours}.attn.k_norm.scale"] = _plain(f"{a}.k_norm.weight", (h,))
    if not cfg.is_moe_layer(i):
      _mlp(m, f"{ours}.mlp", f"{theirs}.mlp", d, cfg.intermediate_size)
      continue
    m[f"{ours}.moe.router"] = _linear(f"{theirs}.mlp.gate.weight", (cfg.num_experts,), (d,))
    if cfg.router_selection_bias:
      m[f"{ours}.moe.router_bias"] = _plain(f"{theirs}.mlp.gate.e_score_correction_bias",
                                            (cfg.num_experts,))
    _experts(m, f"{ours}.moe", f"{theirs}.mlp.experts", cfg, i in fused_layers)
    if cfg.num_shared_experts:
      _mlp(m, f"{ours}.moe.shared", f"{theirs}.mlp.shared_experts", d, cfg.shared_intermediate_size)
  return m


# ----------------------------------------------------------------------------
# safetensors files
# ----------------------------------------------------------------------------


class _SafetensorsFile:
  """One safetensors file: its header, and tensors read lazily through a memory map."""

  def __init__(self, path: pathlib.Path):
    with open(path, "rb") as f:
      n = int.from_bytes(f.read(8), "little")
      header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    self.path, self.header, self.base, self._map = path, header, 8 + n, None

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self.header[key]["shape"])

  def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
    if self._map is None:
      self._map = np.memmap(self.path, np.uint8, mode="r")
    info = self.header[key]
    begin, end = (self.base + o for o in info["data_offsets"])
    whole = self._map[begin:end].view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
    return np.array(whole[index])


def _open(path: pathlib.Path) -> dict[str, _SafetensorsFile]:
  """Tensor name -> the file holding it, from the index (sharded) or `model.safetensors`."""
  if (path / _INDEX).is_file():
    names = sorted(set(json.loads((path / _INDEX).read_text())["weight_map"].values()))
  elif (path / "model.safetensors").is_file():
    names = ["model.safetensors"]
  else:
    raise CheckpointError(f"{path} holds neither model.safetensors nor {_INDEX}")
  files = {}
  for name in names:
    f = _SafetensorsFile(path / name)
    files.update((key, f) for key in f.header)
  return files


def _check(cfg: ModelConfig, hf: dict, sources: dict[str, Source], files: dict) -> None:
  """Raises one `CheckpointError` listing every missing, unexpected, misshapen or non-float tensor."""
  expected = {key: s.stored for s in sources.values() for key in s.keys}
  problems = [f"missing tensor {k}" for k in expected if k not in files]
  for k, shape in expected.items():
    if k in files and files[k].shape(k) != shape:
      problems.append(f"tensor {k} has shape {files[k].shape(k)}, expected {shape}")
    if k in files and files[k].header[k]["dtype"] not in _ST_DTYPES:
      problems.append(f"tensor {k} has dtype {files[k].header[k]['dtype']}, not a float type")
  n_mtp = hf.get("num_nextn_predict_layers", 0) if cfg.family == "glm4_moe" else 0
  mtp = re.compile(r"model\.layers\.(\d+)\.")
  skipped = []
  for k in files:
    if k in expected:
      continue
    layer = mtp.match(k)
    if layer and cfg.num_layers <= int(layer.group(1)) < cfg.num_layers + n_mtp:
      skipped.append(k)
    elif not (k == "lm_head.weight" and cfg.tie_word_embeddings) and not k.endswith("rotary_emb.inv_freq"):
      problems.append(f"unexpected tensor {k}")
  if skipped:
    log.info("skipping %d tensors of %d multi-token-prediction layer(s) (model.layers.%d.*)",
             len(skipped), n_mtp, cfg.num_layers)
  if problems:
    raise CheckpointError(f"checkpoint does not match its {cfg.family} config "
                          f"({len(problems)} problems):\n  " + "\n  ".join(problems))


@dataclasses.dataclass(frozen=True)
class _LayerStack:
  """A stacked parameter (`[L, ...]`, scanned layers): one `Source` per layer."""

  layers: tuple[Source, ...]

  def read(self, get, index: tuple[slice, ...]) -> np.ndarray:
    picked = range(*index[0].indices(len(self.layers)))
    return np.stack([self.layers[j].read(get, index[1:]) for j in picked])


def _source(cfg: ModelConfig, sources: dict[str, Source], path: str):
  """Where the parameter at `path` (either layout) is stored."""
  per_layer = [sources[p] for p, _ in layer_slices(cfg, path)]
  return _LayerStack(tuple(per_layer)) if path.startswith("layer_stacks.") else per_layer[0]


def _place(source: Source, files: dict, x: jax.ShapeDtypeStruct, sharding) -> jax.Array:
  """One parameter on its devices; each distinct shard is read from disk once."""
  read = lambda index: source.read(lambda k, s: files[k].read(k, s), index).astype(x.dtype)
  if sharding is None:
    return jax.device_put(read(tuple(slice(None) for _ in x.shape)))
  cache = {}

  def callback(index):
    key = tuple((s.start, s.stop, s.step) for s in index)
    if key not in cache:
      cache[key] = read(index)
    return cache[key]

  return jax.make_array_from_callback(x.shape, sharding, callback)


def load(path, mesh=None, *, dtype=None, scan_layers: bool = False) -> tuple[ModelConfig, dict]:
  """Reads a Hugging Face checkpoint directory into `(config, params)`.

  Args:
    path: a directory with `config.json` and `model.safetensors` or a sharded
      `model.safetensors.index.json`.
    mesh: place each parameter directly on its shards as
      `parallel.sharding.param_shardings` lays them out; None puts whole
      arrays on the default device.
    dtype: storage dtype of the parameters (`param_dtype`, also used as the
      compute `dtype` of the returned config); default: the checkpoint's
      `dtype`. The router weight and bias stay float32 regardless.
    scan_layers: read the decoder layers straight into the stacked layout of
      `models.stacking` (and return a config with `scan_layers=True`).

  Raises:
    CheckpointError: an unsupported config, or tensors missing, unexpected or
      of the wrong shape (all of them listed in one message).
  """
  path = pathlib.Path(path)
  if not (path / "config.json").is_file():
    raise CheckpointError(f"{path} has no config.json")
  hf = json.loads((path / "config.json").read_text())
  cfg = config_from_hf(hf).replace(scan_layers=scan_layers)
  if dtype is not None:
    name = np.dtype(dtype).name
    if name not in ("float32", "bfloat16", "float16"):
      raise CheckpointError(f"dtype {name} is not float32, bfloat16 or float16")
    cfg = cfg.replace(param_dtype=name, dtype=name)
  files = _open(path)
  fused = {i for i in cfg.moe_layer_ids if f"model.layers.{i}.mlp.experts.gate_up_proj" in files}
  sources = tensor_map(cfg, fused)
  _check(cfg, hf, sources, files)
  abstract = abstract_params(cfg)
  flat, treedef = jax.tree_util.tree_flatten_with_path(abstract)
  if mesh is None:
    shardings = [None] * len(flat)
  else:
    shardings = jax.tree.leaves(param_shardings(cfg, abstract, mesh))
  leaves = [_place(_source(cfg, sources, path_str(p)), files, x, s) for (p, x), s in zip(flat, shardings)]
  return cfg, jax.tree_util.tree_unflatten(treedef, leaves)


# ----------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------


def _to_host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def save(path, config: ModelConfig, params: dict, *, max_shard_bytes: int = 5 << 30) -> None:
  """Writes `params` as a Hugging Face checkpoint directory that transformers loads.

  Writes `config.json` (`config_to_hf`) and safetensors files of at most
  `max_shard_bytes` each (a single parameter larger than that gets a file of
  its own), with `model.safetensors.index.json` when there is more than one.
  Parameters keep their dtype. Each one is gathered to the host, converted and
  written before the next is touched. Stale `model*.safetensors*` files in
  `path` are removed first. On several hosts every process must call `save`
  (parameters are gathered collectively); only process 0 writes.
  """
  path = pathlib.Path(path)
  hf = config_to_hf(config)
  sources = tensor_map(config)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  want = {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract_params(config))[0]}
  got = {path_str(p): x for p, x in flat}
  problems = [f"missing parameter {k}" for k in want if k not in got]
  problems += [f"unexpected parameter {k}" for k in got if k not in want]
  problems += [f"parameter {k} has shape {tuple(got[k].shape)}, expected {tuple(want[k].shape)}"
               for k in want if k in got and tuple(got[k].shape) != tuple(want[k].shape)]
  problems += [f"parameter {k} has dtype {got[k].dtype}, not float32/bfloat16/float16/float64"
               for k in got if np.dtype(got[k].dtype) not in _ST_CODES]
  if problems:
    raise CheckpointError("params do not match the config:\n  " + "\n  ".join(problems))

  shards, size = [[]], 0
  for p, x in flat:  # stacked (scanned) layers are written layer by layer
    slices = list(layer_slices(config, path_str(p)))
    nbytes = math.prod(x.shape) * np.dtype(x.dtype).itemsize // len(slices)
    for key_path, take in slices:
      if shards[-1] and size + nbytes > max_shard_bytes:
        shards, size = shards + [[]], 0
      shards[-1].append((key_path, x, take))
      size += nbytes
  names = (["model.safetensors"] if len(shards) == 1 else
           [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
  writer = jax.process_index() == 0
  if writer:
    path.mkdir(parents=True, exist_ok=True)
    for old in path.iterdir():
      if _OWN_FILES.fullmatch(old.name):
        old.unlink()
  weight_map, total = {}, 0
  for name, shard in zip(names, shards):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for key_path, x, _ in shard:
      code, itemsize = _ST_CODES[np.dtype(x.dtype)], np.dtype(x.dtype).itemsize
      source = sources[key_path]
      nbytes = math.prod(source.stored) * itemsize
      for key in source.keys:
        header[key] = {"dtype": code, "shape": list(source.stored),
                       "data_offsets": [offset, offset + nbytes]}
        weight_map[key], offset = name, offset + nbytes
    total += offset
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with (open(path / name, "wb") if writer else contextlib.nullcontext()) as f:
      if writer:
        f.write(len(blob).to_bytes(8, "little") + blob)
      for key_path, x, take in shard:
        host = _to_host(take(x))
        for _, tensor in sources[key_path].split(host):
          if writer:
            f.write(np.ascontiguousarray(tensor).tobytes())
        del host
  if writer:
    if len(shards) > 1:
      index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
      (path / _INDEX).write_text(json.dumps(index, indent=2) + "\n")
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
