"""Preference pairs: records -> rendered (chosen, rejected) rows -> batches of whole pairs.

A preference record holds a prompt and two responses. Accepted layouts:

    {"prompt": str | [messages], "chosen": str | message | [messages], "rejected": ...}
    {"chosen": [messages], "rejected": [messages]}        (two full conversations)

A string prompt is one user turn; a string response is one assistant turn. When
`chosen` / `rejected` are lists that hold a user turn they are read as full
conversations (UltraFeedback, Tülu 3's preference mixtures repeat the prompt
there) and `prompt` is ignored. Messages use the OpenAI layout of
`recipe_jax.data.readers` (reasoning, tool calls, `trainable`).

Each half becomes one `Conversation`, checked by the SFT validators and
rendered by the SFT chat templates with the same loss-mask policy, so a
response's loss mask is exactly what SFT would train on. The two halves must
share everything up to and including the last user turn ("prompt_mismatch"
otherwise) and must differ ("identical_responses").

Rows. A pair is one example of two rows stacked on the pair axis `P`
(0 chosen, 1 rejected), each right-padded to `seq_len`:

    tokens, targets, segment_ids, positions: int32 [2, T];  loss_mask: bool [2, T]
    reference_logps: float32 [2]   (log pi_ref of each response, when given)

with the next-token shift of `recipe_jax.data.packing`, `segment_ids` 1 on
real tokens and 0 on padding. Pairs are never packed together or split, so
both halves of a pair are always in the same batch and micro-batch. A pair
is dropped and counted ("over_length") when either half exceeds `seq_len`,
and ("no_loss_tokens") when either half has no response token after the shift.

Order, hosts, epochs and the drop report follow `recipe_jax.data.pipeline`:
per source a shuffled index slice `host::hosts`, repeated `num_epochs` times,
sources mixed by weight, every drop counted by reason in a `PipelineReport`
that lives inside the iterator state (so a resumed run reports exactly what
an uninterrupted one does). A final short batch is filled with all-padding
pairs (empty loss masks), which the preference losses ignore.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import jax
import numpy as np

from recipe_jax.config import require
from recipe_jax.data.chat_template import RENDERERS
from recipe_jax.data.errors import DropRecord, PipelineReport, RecordFailedError, reason_for
from recipe_jax.data.packing import next_token_example
from recipe_jax.data.pipeline import Source
from recipe_jax.data.readers import RecordError, normalize
from recipe_jax.data.schema import Conversation, last_user_index
from recipe_jax.data.validate import InvalidRecordError, validate

PAIR_FIELDS = ("tokens", "targets", "loss_mask", "segment_ids", "positions")
HALVES = ("chosen", "rejected")
_STATE_FORMAT = 1

# (record, source name, record index) -> {"chosen": {"ids", "loss_mask"}, "rejected": {...}}
PairFn = Callable[[Any, str, int], dict]


# ----------------------------------------------------------------------------
# Records -> conversations -> rendered halves
# ----------------------------------------------------------------------------


def _as_messages(value: Any, role: str, field: str) -> list:
  if isinstance(value, str):
    return [{"role": role, "content": value}]
  if isinstance(value, dict):
    return [value]
  if isinstance(value, list):
    return value
  raise DropRecord("malformed_record", f"{field}: expected a string, a message or a list of messages, "
                   f"got {type(value).__name__}")


def _full_conversation(messages: list) -> bool:
  return any(isinstance(m, dict) and m.get("role") in ("user", "human") for m in messages)


def pair_conversations(record: Any, *, source: str, index: int) -> tuple[Conversation, Conversation]:
  """The chosen and the rejected conversation of a record (layouts: module docstring).

  Raises `DropRecord` ("malformed_record", "prompt_mismatch", "no_response") naming the field.
  """
  if not isinstance(record, dict):
    raise DropRecord("malformed_record", f"record: expected a JSON object, got {type(record).__name__}")
  missing = [k for k in HALVES if k not in record]
  if missing:
    raise DropRecord("malformed_record", f"record: no {' or '.join(repr(k) for k in missing)} key")
  prompt = _as_messages(record["prompt"], "user", "prompt") if "prompt" in record else []
  halves = []
  for name in HALVES:
    messages = _as_messages(record[name], "assistant", name)
    if not _full_conversation(messages):
      messages = prompt + messages
    try:
      halves.append(normalize({"messages": messages, "tools": record.get("tools")}, source=source, index=index))
    except RecordError as e:
      raise DropRecord("malformed_record", f"{name}.{e.field}: {e.problem}") from e
  chosen, rejected = halves
  cut_c, cut_r = last_user_index(chosen.messages), last_user_index(rejected.messages)
  if chosen.messages[:cut_c + 1] != rejected.messages[:cut_r + 1]:
    raise DropRecord("prompt_mismatch", "chosen and rejected differ before the final response")
  for name, conv, cut in (("chosen", chosen, cut_c), ("rejected", rejected, cut_r)):
    if cut < 0 or cut == len(conv.messages) - 1:
      raise DropRecord("no_response", f"{name}: no assistant turn after the last user turn")
  return chosen, rejected


def preference_example_fn(tokenizer, *, template: str, policy: str = "final_response", strict: bool = False,
                          **render_kwargs) -> PairFn:
  """A `pair_fn(record, source, index)` rendering both halves with the SFT template and policy.

  Invalid records raise `DropRecord` with the validator's reason (counted by the
  pipeline); with `strict=True` they raise `InvalidRecordError` instead.
  """
  render = RENDERERS[template]

  def pair_fn(record: Any, source: str, index: int) -> dict:
    try:
      chosen, rejected = pair_conversations(record, source=source, index=index)
      for name, conv in (("chosen", chosen), ("rejected", rejected)):
        reason = validate(conv, policy=policy)
        if reason is not None:
          raise DropRecord(reason, f"{name} conversation")
      out = {}
      for name, conv in (("chosen", chosen), ("rejected", rejected)):
        r = render(conv, tokenizer, policy=policy, **render_kwargs)
        out[name] = {"ids": r.ids, "loss_mask": r.loss_mask}
      if np.array_equal(out["chosen"]["ids"], out["rejected"]["ids"]):
        raise DropRecord("identical_responses", "chosen and rejected render to the same tokens")
      return out
    except DropRecord as e:
      if strict:
        raise InvalidRecordError(e.reason, source, index, e.detail) from e
      raise

  return pair_fn


def pair_rows(pair: Mapping[str, Mapping[str, Any]], seq_len: int) -> dict[str, np.ndarray]:
  """The `[2, seq_len]` rows of one rendered pair (module docstring); raises `DropRecord` if unusable."""
  rows = {k: np.zeros((2, seq_len), bool if k == "loss_mask" else np.int32) for k in PAIR_FIELDS}
  for p, name in enumerate(HALVES):
    ex = next_token_example(pair[name]["ids"], pair[name]["loss_mask"])
    n = len(ex["tokens"])
    if n > seq_len:
      raise DropRecord("over_length", f"{name}: {n} tokens > seq_len {seq_len}")
    if not ex["loss_mask"].any():
      raise DropRecord("no_loss_tokens", f"{name}: the loss mask selects no token after the first")
    for k in ("tokens", "targets", "loss_mask"):
      rows[k][p, :n] = ex[k]
    rows["segment_ids"][p, :n] = 1
    rows["positions"][p, :n] = np.arange(n)
  return rows


# ----------------------------------------------------------------------------
# The pipeline
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreferenceDataConfig:
  """Shape and order of preference batches. `batch_size` is pairs per host (2 rows each)."""

  seq_len: int
  batch_size: int
  seed: int = 0
  num_epochs: int | None = 1
  shuffle: bool = True
  strict: bool = False
  process_index: int | None = None
  process_count: int | None = None
  read_threads: int = 4
  read_buffer: int = 64
  max_consecutive_drops: int = 10_000

  def __post_init__(self):
    require(self.seq_len >= 2, "data.seq_len", f"must be >= 2, got {self.seq_len}")
    require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")
    require(self.num_epochs is None or self.num_epochs >= 1, "data.num_epochs",
            f"must be >= 1 or None (repeat forever), got {self.num_epochs}")
    require(0 <= self.seed < 2**31, "data.seed", f"must be in [0, 2**31), got {self.seed}")
    require(self.max_consecutive_drops >= 1, "data.max_consecutive_drops", "must be >= 1")

  def hosts(self) -> tuple[int, int]:
    count = jax.process_count() if self.process_count is None else self.process_count
    index = jax.process_index() if self.process_index is None else self.process_index
    require(0 <= index < count, "data.process_index", f"{index} not in [0, {count})")
    return index, count


@dataclasses.dataclass(frozen=True)
class DroppedPair:
  source: str
  index: int
  reason: str
  detail: str


class PairReader:
  """Record index -> pair rows (plus `reference_logps` when a table is given), or `DroppedPair`.

  `reference` maps a source name to float32 `[num_records, 2]` reference log-probs
  (NaN where the reference pass dropped the record).
  """

  def __init__(self, source: Source, pair_fn: PairFn, seq_len: int, *, strict: bool = False,
               reference: Mapping[str, np.ndarray] | None = None):
    self.name, self.data, self.pair_fn = source.name, source.data, pair_fn
    self.seq_len, self.strict = seq_len, strict
    self.reference = None if reference is None else reference[source.name]

  def __call__(self, index: int):
    index = int(index)
    try:
      rows = pair_rows(self.pair_fn(self.data[index], self.name, index), self.seq_len)
    except DropRecord as e:
      return DroppedPair(self.name, index, e.reason, e.detail)
    except InvalidRecordError:
      raise
    except Exception as e:  # a record must not stop training; strict mode says otherwise
      if self.strict:
        raise RecordFailedError(self.name, index, e) from e
      return DroppedPair(self.name, index, reason_for(e), f"{type(e).__name__}: {e}")
    if self.reference is not None:
      ref = self.reference[index]
      if not np.all(np.isfinite(ref)):
        raise RuntimeError(f"record {index} of source {self.name!r} has no reference log-probs, but the "
                           "pipeline keeps it: the reference cache does not match this data")
      rows["reference_logps"] = np.asarray(ref, np.float32)
    else:
      rows["reference_logps"] = np.zeros(2, np.float32)
    rows["source"] = self.name
    return rows


def _seed(seed: int, *salt: Any) -> int:
  return zlib.crc32(json.dumps([seed, *salt]).encode()) % 2**32


class PreferencePipeline:
  """Iterates host batches of whole pairs: `PAIR_FIELDS` `[B, 2, T]` and `reference_logps` `[B, 2]`.

  `get_state()` / `set_state()` checkpoint the position (JSON; the drop report is
  inside); `report()` returns the counts as of the current position.
  """

  def __init__(self, sources: Source | Sequence[Source], pair_fn: PairFn, config: PreferenceDataConfig, *,
               reference: Mapping[str, np.ndarray] | None = None):
    self.sources = [sources] if isinstance(sources, Source) else list(sources)
    self.config = config
    names = [s.name for s in self.sources]
    require(len(names) >= 1 and len(set(names)) == len(names), "data.sources",
            f"need at least one source, with unique names: {names}")
    host, hosts = config.hosts()
    parts = []
    for s in self.sources:
      require(s.weight > 0, f"data.sources.{s.name}.weight", f"must be > 0, got {s.weight}")
      records = grain.MapDataset.range(len(s.data))[host::hosts]
      require(len(records) > 0, f"data.sources.{s.name}", f"{len(s.data)} records leave none for host {host}")
      if config.shuffle:
        records = records.shuffle(seed=_seed(config.seed, "shuffle", s.name))
      reader = PairReader(s, pair_fn, config.seq_len, strict=config.strict, reference=reference)
      parts.append(records.repeat(config.num_epochs).map(reader))
    mixed = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, weights=[s.weight for s in self.sources])
    self.dataset = mixed.to_iter_dataset(grain.ReadOptions(num_threads=config.read_threads,
                                                           prefetch_buffer_size=config.read_buffer))
    self._iterator = iter(self.dataset)
    self._report = PipelineReport()
    fields = {k: v for k, v in dataclasses.asdict(config).items()
              if k not in ("read_threads", "read_buffer", "max_consecutive_drops", "strict")}
    fields.update(process_index=host, process_count=hosts,
                  sources=[[s.name, len(s.data), s.weight] for s in self.sources])
    self._fingerprint = json.loads(json.dumps(fields))

  def _next_pair(self) -> dict | None:
    consecutive = 0
    for element in self._iterator:
      if not isinstance(element, DroppedPair):
        self._report.add_kept(element.pop("source"), int(element["segment_ids"].sum()))
        return element
      self._report.add_dropped(element.source, element.index, element.reason, element.detail)
      consecutive += 1
      if consecutive >= self.config.max_consecutive_drops:
        raise RuntimeError(f"{consecutive} pairs in a row were dropped (last: record {element.index} of "
                           f"{element.source!r}, {element.reason}: {element.detail}); {self._report.summary()}")
    return None

  def __iter__(self) -> PreferencePipeline:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    pairs = []
    while len(pairs) < self.config.batch_size and (pair := self._next_pair()) is not None:
      pairs.append(pair)
    if not pairs:
      raise StopIteration
    batch = {k: np.stack([p[k] for p in pairs]) for k in pairs[0]}
    short = self.config.batch_size - len(pairs)
    if short:
      batch = {k: np.concatenate([v, np.zeros((short,) + v.shape[1:], v.dtype)]) for k, v in batch.items()}
    return batch

  def get_state(self) -> dict[str, Any]:
    return {"format": _STATE_FORMAT, "config": self._fingerprint, "iterator": self._iterator.get_state(),
            "report": self._report.to_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Restores a `get_state()` result; raises naming the settings that differ."""
    if state.get("format") != _STATE_FORMAT:
      raise ValueError(f"preference iterator state has format {state.get('format')!r}, "
                       f"this code reads format {_STATE_FORMAT}")
    saved = state["config"]
    differ = sorted(k for k in set(saved) | set(self._fingerprint) if saved.get(k) != self._fingerprint.get(k))
    if differ:
      raise ValueError("preference iterator state was saved with different settings: " + "; ".join(
          f"{k}: saved {saved.get(k)!r}, now {self._fingerprint.get(k)!r}" for k in differ))
    self._iterator.set_state(state["iterator"])
    self._report = PipelineReport.from_state(state["report"])

  def report(self) -> PipelineReport:
    return PipelineReport.from_state(self._report.to_state())
