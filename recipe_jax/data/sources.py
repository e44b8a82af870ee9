"""Record sources with random access: JSONL, Parquet, ArrayRecord and TFDS.

Each source follows Grain's `RandomAccessDataSource` protocol (`__len__` and
`__getitem__(index) -> record`), so `grain.MapDataset.source(src)` or an index
pipeline over `range(len(src))` can shuffle, shard and repeat it without
reading anything first. Records come back as plain Python dicts. A stored
record that cannot be decoded raises `MalformedRecord` naming the file and line
(or record index); the pipeline counts and skips it.

All sources are picklable (open files are dropped and reopened lazily), so they
work with Grain's multiprocessing prefetch, and safe to read from several
threads (JSONL uses `os.pread`; Parquet guards its row-group cache with a lock).

TFDS goes through `tfds.data_source` (ArrayRecord-backed, no TensorFlow needed
at read time) and is imported only when asked for; `tensorflow-datasets` is an
optional dependency.
"""

from __future__ import annotations

import collections
import json
import operator
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from recipe_jax.data.errors import MalformedRecord

PathOrPaths = str | os.PathLike | Sequence[str | os.PathLike]


def _as_paths(paths: PathOrPaths) -> list[str]:
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  paths = [os.fspath(p) for p in paths]
  if not paths:
    raise ValueError("a source needs at least one file")
  for p in paths:
    if not os.path.exists(p):
      raise FileNotFoundError(f"source file {p!r} does not exist")
  return paths


def _check_index(index, length: int) -> int:
  index = operator.index(index)
  if not 0 <= index < length:
    raise IndexError(f"record index {index} out of range for a source of {length} records")
  return index


class JsonlSource:
  """One JSON object per line, over one or more files, read by line offset.

  Opening the source scans each file once and keeps the byte offset of every
  non-blank line (16 bytes per record); a record is then one `os.pread`.
  Record `i` is the `i`-th non-blank line over the files in order. A line that
  is not valid UTF-8 JSON, or is JSON but not an object, raises
  `MalformedRecord` with the file and 1-based line number.
  """

  def __init__(self, paths: PathOrPaths):
    self._paths = _as_paths(paths)
    files, starts, lengths, lines = [], [], [], []
    for f, path in enumerate(self._paths):
      offset = 0
      with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, start=1):
          if line.strip():
            files.append(f)
            starts.append(offset)
            lengths.append(len(line))
            lines.append(line_no)
          offset += len(line)
    self._file = np.asarray(files, np.int32)
    self._start = np.asarray(starts, np.int64)
    self._length = np.asarray(lengths, np.int64)
    self._line = np.asarray(lines, np.int64)
    self._fds: dict[int, int] = {}
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return len(self._start)

  def _fd(self, f: int) -> int:
    with self._lock:
      if f not in self._fds:
        self._fds[f] = os.open(self._paths[f], os.O_RDONLY)
      return self._fds[f]

  def where(self, index: int) -> str:
    """`path:line` of record `index`, for messages."""
    index = _check_index(index, len(self))
    return f"{self._paths[self._file[index]]}:{self._line[index]}"

  def __getitem__(self, index) -> dict[str, Any]:
    index = _check_index(index, len(self))
    f = int(self._file[index])
    raw = os.pread(self._fd(f), int(self._length[index]), int(self._start[index]))
    try:
      record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise MalformedRecord("invalid_json", f"{self.where(index)}: {e}") from None
    if not isinstance(record, dict):
      raise MalformedRecord(
          "not_an_object", f"{self.where(index)}: expected a JSON object, got "
          f"{type(record).__name__}")
    return record

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_fds"], state["_lock"] = {}, None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def __del__(self):
    for fd in getattr(self, "_fds", {}).values():
      try:
        os.close(fd)
      except OSError:
        pass

  def __repr__(self) -> str:
    return f"JsonlSource({self._paths!r}, records={len(self)})"


class ParquetSource:
  """Rows of one or more Parquet files, read by row group (needs `pyarrow`).

  Record `i` is the `i`-th row over the files in order. Reading a row loads
  its whole row group; the last `cache_row_groups` groups stay in memory, so
  sequential reads are cheap and shuffled reads cost one row group each (write
  files with small row groups, e.g. 1,000 rows, for shuffled training reads).
  Nested columns (lists of message structs) come back as lists of dicts.
  """

  def __init__(self, paths: PathOrPaths, *, columns: Sequence[str] | None = None,
               cache_row_groups: int = 4):
    import pyarrow.parquet as pq  # optional dependency, imported on use

    self._paths = _as_paths(paths)
    self._columns = None if columns is None else list(columns)
    self._groups: list[tuple[int, int]] = []  # (file, row group)
    sizes = []
    for f, path in enumerate(self._paths):
      meta = pq.ParquetFile(path).metadata
      for g in range(meta.num_row_groups):
        self._groups.append((f, g))
        sizes.append(meta.row_group(g).num_rows)
    self._offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    self._cache_size = max(1, cache_row_groups)
    self._cache: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def __len__(self) -> int:
    return int(self._offsets[-1])

  def _row_group(self, k: int):
    with self._lock:
      if k in self._cache:
        self._cache.move_to_end(k)
        return self._cache[k]
    import pyarrow.parquet as pq

    f, g = self._groups[k]
    table = pq.ParquetFile(self._paths[f]).read_row_group(g, columns=self._columns)
    with self._lock:
      self._cache[k] = table
      while len(self._cache) > self._cache_size:
        self._cache.popitem(last=False)
    return table

  def __getitem__(self, index) -> dict[str, Any]:
    index = _check_index(index, len(self))
    k = int(np.searchsorted(self._offsets, index, side="right")) - 1
    return self._row_group(k).slice(index - int(self._offsets[k]), 1).to_pylist()[0]

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_cache"], state["_lock"] = collections.OrderedDict(), None
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._lock = threading.Lock()

  def __repr__(self) -> str:
    return f"ParquetSource({self._paths!r}, records={len(self)})"


def decode_json_bytes(raw: bytes) -> dict[str, Any]:
  """The default ArrayRecord decoder: each record is one UTF-8 JSON object."""
  record = json.loads(raw)
  if not isinstance(record, dict):
    raise ValueError(f"expected a JSON object, got {type(record).__name__}")
  return record


class ArrayRecordSource:
  """Records of one or more ArrayRecord files, decoded by `decode` (JSON by default).

  Reading is Grain's `ArrayRecordDataSource`; this class adds decoding and
  turns a decode failure into `MalformedRecord` naming the record index.
  """

  def __init__(self, paths: PathOrPaths,
               decode: Callable[[bytes], dict[str, Any]] = decode_json_bytes):
    import grain

    self._paths = _as_paths(paths)
    self._reader = grain.sources.ArrayRecordDataSource(self._paths)
    self._decode = decode

  def __len__(self) -> int:
    return len(self._reader)

  def __getitem__(self, index) -> dict[str, Any]:
    index = _check_index(index, len(self))
    raw = self._reader[index]
    try:
      return self._decode(raw)
    except Exception as e:  # any decoder failure is a property of the stored bytes
      raise MalformedRecord(
          "undecodable", f"ArrayRecord record {index} of {self._paths}: "
          f"{type(e).__name__}: {e}") from None

  def __repr__(self) -> str:
    return f"ArrayRecordSource({self._paths!r}, records={len(self)})"


def _to_python(value):
  """TFDS values (bytes, NumPy scalars and arrays, nested dicts) as plain Python."""
  if isinstance(value, dict):
    return {k: _to_python(v) for k, v in value.items()}
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, np.ndarray):
    if value.dtype == object or value.dtype.kind == "S":
      return [_to_python(v) for v in value.tolist()]
    return value
  if isinstance(value, np.generic):
    return _to_python(value.item())
  if isinstance(value, (list, tuple)):
    return [_to_python(v) for v in value]
  return value


class TfdsSource:
  """A `tfds.data_source` with text decoded to `str`; built by `tfds_source`."""

  def __init__(self, data_source, name: str):
    self._source = data_source
    self._name = name

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index) -> dict[str, Any]:
    index = _check_index(index, len(self))
    try:
      record = _to_python(self._source[index])
    except UnicodeDecodeError as e:
      raise MalformedRecord("undecodable", f"TFDS {self._name} record {index}: {e}") from None
    if not isinstance(record, dict):
      raise MalformedRecord("not_an_object", f"TFDS {self._name} record {index} is "
                            f"{type(record).__name__}, not a feature dict")
    return record

  def __repr__(self) -> str:
    return f"TfdsSource({self._name!r}, records={len(self)})"


def tfds_source(name: str, *, split: str, data_dir: str | None = None) -> TfdsSource:
  """Random access to a prepared TFDS dataset (`tfds.data_source`; ArrayRecord format).

  Raises ImportError with an install hint when `tensorflow-datasets` is missing.
  """
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError(
        f"reading TFDS dataset {name!r} needs the optional package "
        "tensorflow-datasets (pip install tensorflow-datasets array_record); "
        "JSONL, Parquet and ArrayRecord sources work without it") from e
  return TfdsSource(tfds.data_source(name, split=split, data_dir=data_dir), f"{name}/{split}")
