"""Weighted mixtures of record sources with per-source caps and epochs, reproducible by seed.

`recipe-jax data mix --source a.jsonl,weight=3,cap=10000 --source tfds:name:train,weight=1,epochs=2
--num-records 50000 --output mix.jsonl` (or `--config FILE` returning a MixConfig).

A source is a JSONL file or a prepared TFDS dataset (`tfds:<name>:<split>`, read through
`recipe_jax.data.sources.tfds_source`; `data_dir` says where it was prepared). Source s offers

  limit_s = min(cap_s, floor(epochs_s * n_s))      n_s = its valid records

records: up to `epochs_s` passes over it (fractional allowed: 1.5 is one pass plus half of a
second), at most `cap_s` in all. The output has `num_records` records (0: every offered record;
fewer if the sources offer fewer, reported as a shortfall).

The method is index based and streaming, in three steps:
1. Count: one streaming pass per source counts its valid records (malformed lines are reported).
2. Draw: a NumPy generator seeded with `seed` picks the source of each output slot with
   probability proportional to the weights of the sources that still have records to offer,
   so a source that reaches its limit drops out and the others share its weight.
3. Write: source s taking t_s records contributes floor(t_s / n_s) full passes in file order,
   then t_s mod n_s records chosen uniformly at random without replacement (seeded by
   `(seed, source index)`), in file order. One reader per source advances as the draws ask, so
   memory holds only the draws (one byte per output record) and one bit per record of a
   partial pass. The output interleaves sources by the draws; within a source, records keep
   their file order (shuffle in the training pipeline).

The same seed, sources and `num_records` give the same output. The report says, per source,
records available, offered, taken and passes used (taken / available). Records never taken
count as removed ("not_sampled"); a source's repeats count as kept each time they are written,
so with epochs > 1 `kept` can exceed what was read.

`register_seqio_mixture(name, sources)` expresses the same JSONL sources as one seqio Task per
source (raw JSON lines in the string feature `json`, capped at limit_s per pass of the task) and
a seqio Mixture with the weights, so evaluation tasks and training mixtures share seqio's
registry. seqio draws by weight from each task's stream (repeating tasks while `num_epochs` is
None); only `mix` gives exact caps and epochs over the whole output.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from recipe_jax.config import ConfigError, load_config_file, override, require, to_dict
from recipe_jax.curation.records import CurationError, CurationReport, read_jsonl, write_jsonl

TFDS_PREFIX = "tfds:"


@dataclasses.dataclass(frozen=True)
class MixSource:
  """A JSONL path or `tfds:<name>:<split>`, its weight, cap (None: no cap) and epochs."""

  path: str
  weight: float = 1.0
  cap: int | None = None
  epochs: float = 1.0
  name: str = ""
  data_dir: str = ""

  def __post_init__(self):
    require(self.weight > 0 and math.isfinite(self.weight), "weight", f"{self.path}: must be > 0, got {self.weight}")
    require(self.cap is None or self.cap >= 0, "cap", f"{self.path}: must be >= 0 or None, got {self.cap}")
    require(self.epochs > 0 and math.isfinite(self.epochs), "epochs", f"{self.path}: must be > 0, got {self.epochs}")
    if self.path.startswith(TFDS_PREFIX):
      tfds_name_split(self.path)

  @property
  def label(self) -> str:
    if self.name:
      return self.name
    if self.path.startswith(TFDS_PREFIX):
      name, split = tfds_name_split(self.path)
      return f"{name}_{split}"
    return pathlib.Path(self.path).stem

  def limit(self, available: int) -> int:
    """Records this source offers: min(cap, floor(epochs * available))."""
    offered = math.floor(self.epochs * available + 1e-9)
    return offered if self.cap is None else min(self.cap, offered)


def tfds_name_split(path: str) -> tuple[str, str]:
  """`tfds:<name>:<split>` -> (name, split); the name may hold a version ("mnist:3.0.1")."""
  body = path[len(TFDS_PREFIX):]
  name, sep, split = body.rpartition(":")
  if not sep or not name or not split:
    raise ConfigError(f"source {path!r}: a TFDS source is tfds:<name>:<split>, e.g. tfds:gsm8k:train")
  return name, split


@dataclasses.dataclass(frozen=True)
class MixConfig:
  """sources; num_records (0: all offered); seed; source_field: when set, each output record
  gets this field holding its source's label."""

  sources: tuple[MixSource, ...] = ()
  num_records: int = 0
  seed: int = 0
  source_field: str = ""

  def __post_init__(self):
    require(len(self.sources) >= 1, "sources", "need at least one source")
    require(len(self.sources) <= 255, "sources", f"at most 255 sources, got {len(self.sources)}")
    labels = [s.label for s in self.sources]
    require(len(set(labels)) == len(labels), "sources", f"source labels must be distinct (set name=), got {labels}")
    require(self.num_records >= 0, "num_records", f"must be >= 0, got {self.num_records}")


# ----------------------------------------------------------------------------
# Reading a source
# ----------------------------------------------------------------------------


def source_records(source: MixSource, report: CurationReport | None, *, progress: bool = False) -> Iterator[dict]:
  """The valid records of a source in stored order; malformed ones are counted in `report`."""
  if not source.path.startswith(TFDS_PREFIX):
    for _, record in read_jsonl(source.path, report, progress=progress):
      yield record
    return
  from recipe_jax.data.errors import MalformedRecord
  from recipe_jax.data.sources import tfds_source

  name, split = tfds_name_split(source.path)
  data = tfds_source(name, split=split, data_dir=source.data_dir or None)
  for index in range(len(data)):
    if report is not None:
      report.read += 1
    try:
      record = data[index]
    except MalformedRecord as e:
      if report is not None:
        report.bad(e.reason, (source.path, index))
      continue
    yield record


# ----------------------------------------------------------------------------
# Drawing
# ----------------------------------------------------------------------------


def draw_sources(weights: Sequence[float], limits: Sequence[int], num_records: int, seed: int,
                 *, block: int = 65536) -> np.ndarray:
  """The source of each output slot `[num_records]` (uint8), drawn by weight among sources
  with records left; `num_records` must not exceed `sum(limits)`."""
  weights = np.asarray(weights, np.float64)
  left = np.asarray(limits, np.int64).copy()
  if num_records > left.sum():
    raise ValueError(f"num_records={num_records} exceeds the {left.sum()} records the sources offer")
  rng = np.random.default_rng(seed)
  out = np.empty(num_records, np.uint8)
  done = 0
  while done < num_records:
    active = np.flatnonzero(left > 0)
    p = weights[active] / weights[active].sum()
    picks = active[rng.choice(active.size, size=min(block, num_records - done), p=p)]
    # Accept draws up to the one that empties a source; the rest are redrawn without it.
    accept = picks.size
    for s in active:
      where = np.flatnonzero(picks == s)
      if where.size > left[s]:
        accept = min(accept, int(where[left[s]]))
    out[done:done + accept] = picks[:accept]
    np.subtract.at(left, picks[:accept], 1)
    done += accept
  return out


def _partial_pass(available: int, count: int, seed: int, index: int) -> np.ndarray:
  """Which records (bool `[available]`) the last, partial pass over a source takes."""
  keep = np.zeros(available, bool)
  if count:
    rng = np.random.default_rng([seed, index])
    keep[rng.choice(available, size=count, replace=False)] = True
  return keep


def _take(source: MixSource, available: int, taken: int, seed: int, index: int) -> Iterator[dict]:
  """The records a source contributes, in order: full passes, then the partial pass's subset."""
  full, rest = divmod(taken, available) if available else (0, 0)
  for _ in range(full):
    yield from source_records(source, None)
  if rest:
    keep = _partial_pass(available, rest, seed, index)
    for i, record in enumerate(source_records(source, None)):
      if keep[i]:
        yield record


def mix(config: MixConfig, output_path: str | pathlib.Path, *, progress: bool = False) -> CurationReport:
  """Writes the mixture to `output_path`; returns the report (not written).

  progress: progress bars over the counting pass of each JSONL source on stderr.
  """
  sources = config.sources
  report = CurationReport("mix", inputs=[s.path for s in sources])
  available = []
  for s in sources:
    try:
      available.append(sum(1 for _ in source_records(s, report, progress=progress)))
    except CurationError as e:
      raise CurationError(f"source {s.label}: {e}") from e
  limits = [s.limit(n) for s, n in zip(sources, available)]
  wanted = config.num_records or sum(limits)
  count = min(wanted, sum(limits))
  draws = draw_sources([s.weight for s in sources], limits, count, config.seed)
  taken = np.bincount(draws, minlength=len(sources)).tolist()
  streams = [_take(s, n, t, config.seed, i) for i, (s, n, t) in enumerate(zip(sources, available, taken))]

  def records() -> Iterator[dict]:
    for k in draws:
      record = next(streams[k])
      yield {**record, config.source_field: sources[k].label} if config.source_field else record

  write_jsonl(records(), output_path, report)
  for s, n, t in zip(sources, available, taken):
    if n > t:
      report.removed["not_sampled"] = report.removed.get("not_sampled", 0) + n - t
  report.details["requested"] = config.num_records or None
  report.details["shortfall"] = wanted - count
  report.details["sources"] = [
      {"name": s.label, "path": s.path, "weight": s.weight, "cap": s.cap, "epochs": s.epochs, "available": n,
       "offered": lim, "taken": t, "epochs_used": (t / n) if n else 0.0}
      for s, n, lim, t in zip(sources, available, limits, taken)]
  report.details["config"] = to_dict(config)
  report.details["output"] = str(output_path)
  return report


# ----------------------------------------------------------------------------
# seqio
# ----------------------------------------------------------------------------


def register_seqio_mixture(name: str, sources: Sequence[MixSource], *, split: str = "train") -> Any:
  """Registers one seqio Task per JSONL source (`<name>.<label>`) and a Mixture `name` of them
  weighted like `sources`; returns the Mixture. Existing entries of those names are replaced.

  Each task yields `{"json": <one raw JSON line>}` for the non-blank lines of its file: the
  first `limit_s` of `ceil(epochs_s)` passes, per pass of the task. Lines are not parsed
  here; decode them with `json.loads`.
  """
  import seqio
  import tensorflow as tf

  output_features = {"json": seqio.Feature(seqio.PassThroughVocabulary(1), add_eos=False, dtype=tf.string,
                                           rank=0, required=False)}
  tasks = []
  for source in sources:
    if source.path.startswith(TFDS_PREFIX):
      raise ConfigError(f"source {source.path}: register TFDS data with seqio.TfdsDataSource; "
                        "register_seqio_mixture takes JSONL sources")
    path = pathlib.Path(source.path)
    if not path.is_file():
      raise CurationError(f"{path}: no such file")
    with path.open("rb") as f:
      lines = sum(1 for raw in f if raw.strip())
    limit = source.limit(lines)

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None, *, _path=str(path),
                   _passes=max(1, math.ceil(source.epochs)), _limit=limit) -> tf.data.Dataset:
      del split, shuffle_files, seed  # one file, read in order
      ds = tf.data.TextLineDataset(_path).filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
      return ds.repeat(_passes).take(_limit).map(lambda line: {"json": line})

    task_name = f"{name}.{source.label}"
    seqio.TaskRegistry.remove(task_name)
    tasks.append((seqio.TaskRegistry.add(task_name, source=seqio.FunctionDataSource(dataset_fn, splits=[split]),
                                         output_features=output_features), source.weight))
  seqio.MixtureRegistry.remove(name)
  return seqio.MixtureRegistry.add(name, tasks)


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


def parse_source(spec: str) -> MixSource:
  """`PATH[,weight=W][,cap=C][,epochs=E][,name=N][,data_dir=D]` -> MixSource."""
  path, *options = spec.split(",")
  fields: dict[str, Any] = {}
  for option in options:
    key, sep, value = option.partition("=")
    key = key.strip()
    if not sep or key not in ("weight", "cap", "epochs", "name", "data_dir"):
      raise ConfigError(f"--source {spec!r}: {option!r} is not weight=, cap=, epochs=, name= or data_dir=")
    try:
      fields[key] = {"weight": float, "epochs": float, "cap": int}.get(key, str)(value.strip())
    except ValueError:
      raise ConfigError(f"--source {spec!r}: {key}={value!r} is not a number") from None
  return MixSource(path.strip(), **fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--source", action="append", default=[], metavar="PATH[,weight=W][,cap=C][,epochs=E]",
                      help="a JSONL file or tfds:<name>:<split>, repeatable (or sources from --config)")
  parser.add_argument("--output", required=True, help="JSONL of the mixture (and <output>.report.json)")
  parser.add_argument("--num-records", type=int, default=None, help="records to write (default: all offered)")
  parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the config's, 0)")
  parser.add_argument("--config", help="a file defining get_config() -> MixConfig")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field, e.g. --set source_field=source")


def load_config(args: argparse.Namespace) -> MixConfig:
  extra = tuple(parse_source(s) for s in args.source)
  if args.config:
    config = load_config_file(args.config)
    if not isinstance(config, MixConfig):
      raise ConfigError(f"{args.config}: get_config() returned {type(config).__name__}, not MixConfig")
    config = dataclasses.replace(config, sources=config.sources + extra)
  else:
    if not extra:
      raise ConfigError("sources: give --source at least once, or --config")
    config = MixConfig(sources=extra)
  updates = list(args.set)
  if args.num_records is not None:
    updates.append(f"num_records={args.num_records}")
  if args.seed is not None:
    updates.append(f"seed={args.seed}")
  return override(config, updates)


def run_cli(args: argparse.Namespace) -> CurationReport:
  return mix(load_config(args), args.output, progress=not getattr(args, "no_progress", True))
