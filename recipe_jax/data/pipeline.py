"""The SFT input pipeline: sources -> examples -> packed rows -> host batches -> global arrays.

    per source: record indices -> this host's slice -> shuffle (reshuffled each
                epoch) -> repeat -> read record + example_fn + shift (threads)
    mix sources by weight -> count and drop bad records -> pack (first/best fit)
    -> batch [B_host, T] -> (optional thread prefetch)
    global_batch(): host batch -> global jax.Arrays sharded over the batch axes

Everything up to the batch is Grain (`MapDataset` index ops, `MapDataset.mix`,
`FirstFitPackIterDataset` / `BestFitPackIterDataset`, `IterDataset.batch`), so
the whole pipeline is one Grain `DatasetIterator` whose `get_state()` is a
small JSON-serializable dict and whose output is a pure function of that state.

Hosts. Host `h` of `n` reads records `h, h + n, h + 2n, ...` of every source
(`MapDataset[h::n]`), so hosts read disjoint slices that together cover each
source; each host packs and batches its own slice.

Mixtures. `MapDataset.mix` interleaves the sources deterministically in
proportion to their weights (measured in records, before drops). With a finite
`num_epochs` the mixture ends when its first source runs out; for multi-host
training prefer `num_epochs=None` and a step count, since hosts may hold
different numbers of records.

Drops. A record is dropped and counted (`recipe_jax.data.errors`) when reading
or `example_fn` raises `DropRecord`, when anything else is raised (unless
`strict`), when it is empty ("empty"), longer than the row ("over_length"), or
has no token to learn after the next-token shift ("no_loss_tokens").

Report and checkpoints. The counting stage keeps its `PipelineReport` inside its
iterator state, so the counts are a function of the position in the record
stream and are restored with it. `report()` reads the counts out of the current
checkpoint state. Grain's packer checkpoints the stream position at the start
of its current window of open rows and re-reads that window after a restore;
hence `report()` counts the records behind that position: records read ahead
into the window are counted once the window's last row has been emitted. The
result: `report()` right after `set_state(s)` equals `report()` when `s` was
saved, and a resumed run reports exactly what an uninterrupted run reports
after the same number of batches, with no record counted twice. (The counting
stage reads one kept example ahead, so drops that follow it, even at the very
end of finite data, enter the state the packer saves next.)

A final short batch (finite epochs) is filled with padding rows, never dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import grain
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.config import require
from recipe_jax.data.errors import DropRecord, PipelineReport, RecordFailedError, reason_for
from recipe_jax.data.packing import PackingMethod, next_token_example, pack, pad_rows
from recipe_jax.parallel.mesh import BATCH_AXES, batch_shards

# (record, source name, record index) -> {"ids": int [L], "loss_mask": bool [L]}
ExampleFn = Callable[[dict, str, int], dict]
_REPORT_KEY = "recipe_jax_drop_report"
_STATE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Source:
  """A named record source (anything with `__len__` and `__getitem__`) and its mixture weight."""

  name: str
  data: Any
  weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """Shape, order and robustness settings of the pipeline.

  `batch_size` is rows per host; `process_index` / `process_count` default to
  `jax.process_index()` / `jax.process_count()`. `num_packing_bins` defaults to
  `batch_size`. `read_threads` and `read_buffer` size Grain's record prefetch;
  `prefetch_batches` > 0 adds a thread that prepares batches ahead.
  `strict` raises `RecordFailedError` on an unexpected exception in a record
  instead of counting it (`DropRecord` still only drops). `shuffle_bins`
  shuffles the rows of each packing window. `max_consecutive_drops` stops a
  pipeline whose every record is being dropped (it would otherwise spin
  forever on repeated data).
  """

  seq_len: int
  batch_size: int
  packing: PackingMethod = "best_fit"
  num_packing_bins: int | None = None
  seed: int = 0
  num_epochs: int | None = None
  shuffle: bool = True
  shuffle_bins: bool = True
  strict: bool = False
  process_index: int | None = None
  process_count: int | None = None
  read_threads: int = 4
  read_buffer: int = 64
  prefetch_batches: int = 0
  max_consecutive_drops: int = 10_000

  def __post_init__(self):
    require(self.seq_len >= 2, "data.seq_len", f"must be >= 2, got {self.seq_len}")
    require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")
    require(self.packing in ("first_fit", "best_fit"), "data.packing",
            f"must be 'first_fit' or 'best_fit', got {self.packing!r}")
    require(self.num_packing_bins is None or self.num_packing_bins >= 1,
            "data.num_packing_bins", f"must be >= 1, got {self.num_packing_bins}")
    require(self.num_epochs is None or self.num_epochs >= 1, "data.num_epochs",
            f"must be >= 1 or None (repeat forever), got {self.num_epochs}")
    require(0 <= self.seed < 2**31, "data.seed", f"must be in [0, 2**31), got {self.seed}")
    require(self.max_consecutive_drops >= 1, "data.max_consecutive_drops",
            f"must be >= 1, got {self.max_consecutive_drops}")

  def hosts(self) -> tuple[int, int]:
    count = jax.process_count() if self.process_count is None else self.process_count
    index = jax.process_index() if self.process_index is None else self.process_index
    require(0 <= index < count, "data.process_index", f"{index} not in [0, {count})")
    return index, count


@dataclasses.dataclass(frozen=True)
class _Dropped:
  """Stands in for a dropped record until the counting stage sees it."""

  source: str
  index: int
  reason: str
  detail: str


class _ReadExample:
  """Record index -> next-token example, or `_Dropped`; runs in Grain's reader threads."""

  def __init__(self, source: Source, example_fn: ExampleFn, seq_len: int, strict: bool):
    self._name, self._data = source.name, source.data
    self._example_fn, self._seq_len, self._strict = example_fn, seq_len, strict

  def __call__(self, index: int):
    index = int(index)
    try:
      out = self._example_fn(self._data[index], self._name, index)
      example = next_token_example(out["ids"], out["loss_mask"])
    except DropRecord as e:
      return _Dropped(self._name, index, e.reason, e.detail)
    except Exception as e:  # a record must not stop training; strict mode says otherwise
      if self._strict:
        raise RecordFailedError(self._name, index, e) from e
      return _Dropped(self._name, index, reason_for(e), f"{type(e).__name__}: {e}")
    length = len(example["tokens"])
    if length == 0:
      return _Dropped(self._name, index, "empty", "example_fn returned no tokens")
    if length > self._seq_len:
      return _Dropped(self._name, index, "over_length",
                      f"{length} tokens > seq_len {self._seq_len}")
    if not example["loss_mask"].any():
      return _Dropped(self._name, index, "no_loss_tokens",
                      "loss_mask selects no token after the first")
    example["source"] = self._name
    return example


_EXHAUSTED = object()


class _CountDropsIterator(grain.DatasetIterator):
  """Passes examples on, counts and removes `_Dropped`; the counts are part of the state.

  After handing out an example it reads on to the next kept one and holds it,
  so drops that follow an example (including those at the very end of finite
  data) are counted in the state the packer saves next. The held example is
  not in the state: `get_state` returns the parent's state from before it was
  read, and a restore reads it again.
  """

  def __init__(self, parent: grain.DatasetIterator, max_consecutive_drops: int):
    super().__init__(parent)
    self._report = PipelineReport()
    self._max_consecutive_drops = max_consecutive_drops
    self._held = None  # the next kept example, _EXHAUSTED, or None (nothing read ahead)
    self._state_before_held = None

  def _read_ahead(self) -> None:
    consecutive = 0
    while True:
      self._state_before_held = self._parent.get_state()
      try:
        element = next(self._parent)
      except StopIteration:
        self._held = _EXHAUSTED
        return
      if not isinstance(element, _Dropped):
        self._held = element
        return
      self._report.add_dropped(element.source, element.index, element.reason, element.detail)
      consecutive += 1
      if consecutive >= self._max_consecutive_drops:
        raise RuntimeError(
            f"{consecutive} records in a row were dropped (last: record {element.index} of "
            f"{element.source!r}, {element.reason}: {element.detail}); "
            f"{self._report.summary()}")

  def __next__(self):
    if self._held is None:
      self._read_ahead()
    if self._held is _EXHAUSTED:
      raise StopIteration
    element, self._held = self._held, None
    self._report.add_kept(element["source"], len(element["tokens"]))
    self._read_ahead()
    return element

  def get_state(self) -> dict[str, Any]:
    parent = self._parent.get_state() if self._held is None else self._state_before_held
    return {"parent": parent, _REPORT_KEY: self._report.to_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._report = PipelineReport.from_state(state[_REPORT_KEY])
    self._held = self._state_before_held = None


class _CountDrops(grain.IterDataset):

  def __init__(self, parent: grain.IterDataset, max_consecutive_drops: int):
    super().__init__(parent)
    self._max_consecutive_drops = max_consecutive_drops

  def __iter__(self) -> _CountDropsIterator:
    return _CountDropsIterator(self._parent.__iter__(), self._max_consecutive_drops)


def _seed(seed: int, *salt: Any) -> int:
  """A 32-bit seed for one stage, derived from the pipeline seed and a label."""
  return zlib.crc32(json.dumps([seed, *salt]).encode()) % 2**32


def build_dataset(sources: Sequence[Source], example_fn: ExampleFn,
                  config: PipelineConfig) -> grain.IterDataset:
  """The Grain dataset of host batches described in the module docstring."""
  require(len(sources) >= 1, "data.sources", "need at least one source")
  names = [s.name for s in sources]
  require(len(set(names)) == len(names), "data.sources", f"names must be unique: {names}")
  host, hosts = config.hosts()
  parts = []
  for source in sources:
    require(source.weight > 0, f"data.sources.{source.name}.weight",
            f"must be > 0, got {source.weight}")
    records = grain.MapDataset.range(len(source.data))[host::hosts]
    require(len(records) > 0, f"data.sources.{source.name}",
            f"{len(source.data)} records leave none for host {host} of {hosts}")
    if config.shuffle:
      records = records.shuffle(seed=_seed(config.seed, "shuffle", source.name))
    records = records.repeat(config.num_epochs)
    parts.append(records.map(_ReadExample(source, example_fn, config.seq_len, config.strict)))
  mixed = parts[0] if len(parts) == 1 else grain.MapDataset.mix(
      parts, weights=[s.weight for s in sources])
  examples = mixed.to_iter_dataset(grain.ReadOptions(
      num_threads=config.read_threads, prefetch_buffer_size=config.read_buffer))
  examples = _CountDrops(examples, config.max_consecutive_drops)
  rows = pack(examples, seq_len=config.seq_len,
              num_packing_bins=config.num_packing_bins or config.batch_size,
              method=config.packing, seed=_seed(config.seed, "pack"),
              shuffle_bins=config.shuffle_bins)
  batches = rows.batch(config.batch_size, drop_remainder=False).map(
      functools.partial(pad_rows, batch_size=config.batch_size))
  if config.prefetch_batches:
    batches = grain.experimental.ThreadPrefetchIterDataset(
        batches, prefetch_buffer_size=config.prefetch_batches)
  return batches


def _find_report(state: Any) -> dict | None:
  if isinstance(state, dict):
    if _REPORT_KEY in state:
      return state[_REPORT_KEY]
    state = list(state.values())
  if isinstance(state, list):
    for item in state:
      if (found := _find_report(item)) is not None:
        return found
  return None


class SftPipeline:
  """Iterates host batches: `tokens, targets, loss_mask, segment_ids, positions`, each [B_host, T].

  `get_state()` / `set_state()` checkpoint the position (JSON-serializable;
  the drop report is inside). `report()` returns the drop counts.
  """

  def __init__(self, sources: Source | Sequence[Source], example_fn: ExampleFn,
               config: PipelineConfig):
    self.sources = [sources] if isinstance(sources, Source) else list(sources)
    self.config = config
    self.dataset = build_dataset(self.sources, example_fn, config)
    self.iterator = iter(self.dataset)
    host, hosts = config.hosts()
    fields = dataclasses.asdict(config)
    for name in ("read_threads", "read_buffer", "prefetch_batches", "max_consecutive_drops",
                 "strict"):
      del fields[name]  # settings that do not change the batches may differ between runs
    fields.update(process_index=host, process_count=hosts,
                  sources=[[s.name, len(s.data), s.weight] for s in self.sources])
    self._fingerprint = json.loads(json.dumps(fields))

  def __iter__(self) -> SftPipeline:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self.iterator)

  def get_state(self) -> dict[str, Any]:
    return {"format": _STATE_FORMAT, "config": self._fingerprint,
            "iterator": self.iterator.get_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Restores a `get_state()` result; raises naming the settings that differ."""
    self.iterator.set_state(saved_iterator_state(state, self._fingerprint, _STATE_FORMAT, "data iterator"))

  def report(self) -> PipelineReport:
    """Records kept and dropped so far, as of the checkpoint position (module docstring)."""
    found = _find_report(self.iterator.get_state())
    return PipelineReport() if found is None else PipelineReport.from_state(found)


def saved_iterator_state(state: dict[str, Any], fingerprint: dict, state_format: int, what: str) -> Any:
  """The iterator part of a saved `{"format", "config", "iterator"}` state, after checking that it
  was saved by this format with the same settings; raises ValueError naming the settings that differ."""
  if state.get("format") != state_format:
    raise ValueError(f"{what} state has format {state.get('format')!r}, this code reads format {state_format}")
  saved = state["config"]
  differ = sorted(k for k in set(saved) | set(fingerprint) if saved.get(k) != fingerprint.get(k))
  if differ:
    raise ValueError(f"{what} state was saved with different settings: " + "; ".join(
        f"{k}: saved {saved.get(k)!r}, now {fingerprint.get(k)!r}" for k in differ))
  return state["iterator"]


def global_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh,
                 spec: P | None = None) -> dict[str, jax.Array]:
  """Host batches -> global `jax.Array`s, rows sharded over the mesh's batch axes.

  Every process calls this with its own [B_host, ...] arrays; the global arrays
  are [B_host * process_count, ...]. The default spec splits rows over
  `BATCH_AXES` ('data', 'fsdp', 'expert') present in `mesh` and replicates the
  rest (tokens are not split over 'tensor').
  """
  if spec is None:
    spec = P(tuple(a for a in BATCH_AXES if a in mesh.axis_names))
    rows = len(next(iter(batch.values()))) * jax.process_count()
    shards = batch_shards(mesh)
    if rows % shards:
      raise ValueError(f"global batch of {rows} rows ({jax.process_count()} hosts) cannot be "
                       f"split over {shards} batch shards of mesh {dict(mesh.shape)}")
  sharding = NamedSharding(mesh, spec)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}
