"""Reference log-probs for preference training: computed once with the starting model, cached on disk.

DPO, length-normalized DPO and IPO compare the policy with the frozen starting
model pi_ref on every pair. pi_ref never changes, so its sequence log-probs
log pi_ref(y_c|x), log pi_ref(y_r|x) are computed in one forward pass over the
data before training, and the train step reads them from the batch; no second
model is held in memory during training.

The table. Per source, a float32 `[num_records, 2]` array (chosen, rejected),
indexed by record number; NaN for records this host does not read or that the
data pipeline drops. Rows are rendered by the same `PairReader` as training
rows, so the tokens are identical.

The cache. `<directory>/reference_logps.host<h>-of-<n>.npz` holds the tables
and a key; a JSON file next to it holds the parts of the key. The key is a
SHA-256 over:

* `weights`: the contents of the starting checkpoint's safetensors and
  config.json files (or of the parameter arrays when there is no directory);
* `model`: the model config the pass ran with (dtype included);
* `data`: per source its name, kind, record count and the contents of its
  files (the path instead, for sources that are not local files);
* `template`: the chat template's name and text, the loss-mask policy,
  `seq_len`, and the tokenizer's files;
* `code`: a format number bumped when the computation changes.

A cache whose stored key differs from the current one is stale: `load`
reports which parts changed, and the tables are recomputed and overwritten.
A cache that cannot be read, or whose tables do not fit the sources, is
treated the same way. Nothing stale is ever returned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import jax
import numpy as np

from recipe_jax.data.chat_template import template_text
from recipe_jax.data.pipeline import Source, global_batch
from recipe_jax.data.preference import DroppedPair, PairFn, PairReader

log = logging.getLogger(__name__)

CODE_VERSION = 1
_CHUNK = 1 << 24
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "added_tokens.json")


# ----------------------------------------------------------------------------
# Fingerprints
# ----------------------------------------------------------------------------


def hash_files(paths: Sequence[pathlib.Path], root: pathlib.Path | None = None) -> str:
  """SHA-256 over the names (relative to `root`) and contents of `paths`, in sorted order."""
  h = hashlib.sha256()
  for p in sorted(pathlib.Path(x) for x in paths):
    h.update(str(p.relative_to(root) if root else p.name).encode() + b"\0")
    with p.open("rb") as f:
      while chunk := f.read(_CHUNK):
        h.update(chunk)
    h.update(b"\0")
  return h.hexdigest()


def files_under(path: str | pathlib.Path) -> list[pathlib.Path]:
  """`path` itself if it is a file, else every file below it."""
  path = pathlib.Path(path)
  if path.is_file():
    return [path]
  return sorted(p for p in path.rglob("*") if p.is_file())


def checkpoint_fingerprint(directory: str | pathlib.Path) -> str:
  """The weights of a Hugging Face checkpoint directory: its safetensors files and config.json."""
  d = pathlib.Path(directory)
  files = sorted(d.glob("*.safetensors")) + [p for p in (d / "config.json",) if p.exists()]
  if not files:
    raise FileNotFoundError(f"{d} holds no safetensors files to fingerprint")
  return hash_files(files, d)


def params_fingerprint(params: Any) -> str:
  """The weights as arrays (for starting points that are not a checkpoint on disk)."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    a = np.asarray(jax.device_get(leaf))
    h.update(f"{jax.tree_util.keystr(path)}:{a.dtype}:{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()


def tokenizer_fingerprint(directory: str | pathlib.Path) -> str:
  d = pathlib.Path(directory)
  return hash_files([d / n for n in TOKENIZER_FILES if (d / n).exists()], d)


def key_parts(*, weights: str, model: Mapping, sources: Sequence[Mapping], template: str, policy: str,
              seq_len: int, tokenizer: str) -> dict[str, Any]:
  """The named parts of the cache key (module docstring); `sources` as `source_fingerprint` returns."""
  return {
      "weights": weights,
      "model": json.loads(json.dumps(model)),
      "data": [dict(s) for s in sources],
      "template": {"name": template, "text_sha256": hashlib.sha256(template_text(template).encode()).hexdigest(),
                   "policy": policy, "seq_len": seq_len, "tokenizer": tokenizer},
      "code": CODE_VERSION,
  }


def source_fingerprint(name: str, kind: str, path: str, num_records: int) -> dict[str, Any]:
  """A source by its contents when its files are local (so copies match), else by its path."""
  local = pathlib.Path(path)
  out = {"name": name, "kind": kind, "records": num_records}
  if local.exists():
    out["contents"] = hash_files(files_under(local), local if local.is_dir() else local.parent)
  else:
    out["path"] = path  # e.g. a TFDS name: identified by name, split and size only
  return out


def cache_key(parts: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------
# The cache
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ReferenceCache:
  """The cache files of one host under `directory`, for the key made of `parts`."""

  directory: pathlib.Path
  parts: Mapping[str, Any]
  host: int = 0
  hosts: int = 1

  @property
  def path(self) -> pathlib.Path:
    return self.directory / f"reference_logps.host{self.host}-of-{self.hosts}.npz"

  @property
  def parts_path(self) -> pathlib.Path:
    return self.path.with_suffix(".json")

  @property
  def key(self) -> str:
    return cache_key(self.parts)

  def stale_parts(self) -> list[str] | None:
    """None when no cache exists; else the key parts that changed (empty: the cache is current)."""
    if not self.path.exists():
      return None
    try:
      saved = json.loads(self.parts_path.read_text())
    except (OSError, ValueError):
      return ["unreadable key file"]
    return sorted(k for k in set(saved) | set(self.parts) if saved.get(k) != json.loads(json.dumps(self.parts.get(k))))

  def load(self, sizes: Mapping[str, int]) -> dict[str, np.ndarray] | None:
    """The cached tables if present and current for sources of `sizes` records; else None (logged)."""
    stale = self.stale_parts()
    if stale is None:
      return None
    if stale:
      log.warning("reference cache %s is stale (changed: %s); recomputing", self.path, ", ".join(stale))
      return None
    try:
      with np.load(self.path) as f:
        if str(f["__key__"]) != self.key:
          log.warning("reference cache %s holds another key than its key file; recomputing", self.path)
          return None
        tables = {name: f[f"source:{name}"] for name in sizes}
    except (OSError, KeyError, ValueError) as e:
      log.warning("reference cache %s is unreadable (%s: %s); recomputing", self.path, type(e).__name__, e)
      return None
    bad = [n for n, t in tables.items() if t.shape != (sizes[n], 2)]
    if bad:
      log.warning("reference cache %s does not fit sources %s; recomputing", self.path, bad)
      return None
    return tables

  def save(self, tables: Mapping[str, np.ndarray]) -> None:
    """Writes the tables and the key (temporary files, then renames: a killed save leaves no cache)."""
    self.directory.mkdir(parents=True, exist_ok=True)
    tmp = self.path.with_name(self.path.name + ".tmp.npz")
    np.savez(tmp, __key__=np.asarray(self.key), **{f"source:{n}": t for n, t in tables.items()})
    tmp_parts = self.parts_path.with_name(self.parts_path.name + ".tmp")
    tmp_parts.write_text(json.dumps(self.parts, indent=1, sort_keys=True))
    self.parts_path.unlink(missing_ok=True)   # no current key file until the tables are in place
    tmp.rename(self.path)
    tmp_parts.rename(self.parts_path)


# ----------------------------------------------------------------------------
# Computing the tables
# ----------------------------------------------------------------------------


def compute_reference_logps(logps_fn: Callable, params, sources: Sequence[Source], pair_fn: PairFn, *,
                            seq_len: int, batch_size: int, mesh, host: int = 0, hosts: int = 1,
                            read_threads: int = 4) -> dict[str, np.ndarray]:
  """One pass of `logps_fn(params, batch) -> (logps [B, 2], lengths)` over this host's records.

  Every host runs the same number of batches (padded with empty pairs), as the
  sharded forward pass needs all of them.
  """
  tables = {}
  for s in sources:
    table = np.full((len(s.data), 2), np.nan, np.float32)
    indices = list(range(host, len(s.data), hosts))
    per_host = math.ceil(len(s.data) / hosts)
    reader = PairReader(s, pair_fn, seq_len)
    rows = iter(grain.MapDataset.source(indices).map(lambda i, r=reader: (i, r(i))).to_iter_dataset(
        grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=4 * batch_size)))
    for _ in range(math.ceil(per_host / batch_size)):
      kept = []
      for index, element in rows:
        if not isinstance(element, DroppedPair):
          kept.append((index, element))
        if len(kept) == batch_size:
          break
      batch = {k: np.zeros((batch_size, 2, seq_len), np.int32 if k != "loss_mask" else bool)
               for k in ("tokens", "targets", "loss_mask", "segment_ids", "positions")}
      for j, (_, element) in enumerate(kept):
        for k in batch:
          batch[k][j] = element[k]
      logps, _ = logps_fn(params, global_batch(batch, mesh))
      logps = _host_rows(logps, mesh)
      for j, (index, _) in enumerate(kept):
        table[index] = logps[j]
    tables[s.name] = table
  return tables


def _host_rows(x: jax.Array, mesh) -> np.ndarray:
  """This host's rows of a batch-sharded global array."""
  if jax.process_count() == 1:
    return np.asarray(x)
  from jax.experimental import multihost_utils
  from jax.sharding import PartitionSpec as P

  from recipe_jax.parallel.mesh import BATCH_AXES
  spec = P(tuple(a for a in BATCH_AXES if a in mesh.axis_names))
  return np.asarray(multihost_utils.global_array_to_host_local_array(x, mesh, spec))


def reference_logps(cache: ReferenceCache, compute: Callable[[], dict[str, np.ndarray]],
                    sizes: Mapping[str, int]) -> tuple[dict[str, np.ndarray], bool]:
  """`(tables, from_cache)`: the current cached tables, or `compute()`'s, which are then cached."""
  tables = cache.load(sizes)
  if tables is not None:
    return tables, True
  tables = compute()
  cache.save(tables)
  return tables, False
