"""Bad input: the exceptions that drop a record, and the report that counts the drops.

The input pipeline never loses a record silently and never stops on one bad
record. A per-record stage (a source reading a line, the caller's `example_fn`
rendering a conversation) either returns an example or raises:

* `DropRecord(reason, detail)`: an expected rejection. The record is skipped and
  counted under `reason` (a short, stable key such as "over_length" or
  "invalid_json"); `detail` says which field or value was wrong.
* anything else: an unexpected failure. By default the record is skipped and
  counted under `"error:<ExceptionType>"`; in strict mode the pipeline raises
  `RecordFailedError`, which names the source and the record index.

`PipelineReport` holds the counts. It is plain data (dicts of ints and short
strings), so it travels inside the iterator state and is restored with it; see
`recipe_jax.data.pipeline` for when a record is counted.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

log = logging.getLogger(__name__)

# How many (index, detail) examples the report keeps per (source, reason).
MAX_EXAMPLES = 5
# Details longer than this are cut, so the report stays small.
MAX_DETAIL_CHARS = 300


class DropRecord(Exception):
  """Skip this record and count it under `reason`; `detail` names the field or value."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason
    self.detail = detail


class MalformedRecord(DropRecord):
  """A source could not read or decode the stored record (invalid JSON, bad bytes)."""


class RecordFailedError(RuntimeError):
  """Strict mode: a record failed with an unexpected exception.

  The message names the source, the record index and the original exception,
  which is also chained as `__cause__`.
  """

  def __init__(self, source: str, index: int, error: BaseException):
    super().__init__(
        f"record {index} of source {source!r} failed with "
        f"{type(error).__name__}: {error}")
    self.source = source
    self.index = index


def reason_for(error: BaseException) -> str:
  """The counter key of an exception: its own reason, or `error:<type>`."""
  if isinstance(error, DropRecord):
    return error.reason
  return f"error:{type(error).__name__}"


@dataclasses.dataclass
class PipelineReport:
  """Records kept and dropped, per source.

  Attributes:
    kept: source -> number of records that reached packing.
    kept_tokens: source -> number of tokens in those records.
    dropped: source -> reason -> number of records skipped.
    examples: "source/reason" -> up to `MAX_EXAMPLES` `[index, detail]` pairs,
      the first ones seen, so a count can be traced back to records.
  """

  kept: dict[str, int] = dataclasses.field(default_factory=dict)
  kept_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
  dropped: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
  examples: dict[str, list[list[Any]]] = dataclasses.field(default_factory=dict)

  def add_kept(self, source: str, num_tokens: int = 0) -> None:
    self.kept[source] = self.kept.get(source, 0) + 1
    self.kept_tokens[source] = self.kept_tokens.get(source, 0) + int(num_tokens)

  def add_dropped(self, source: str, index: int, reason: str, detail: str) -> None:
    by_reason = self.dropped.setdefault(source, {})
    by_reason[reason] = by_reason.get(reason, 0) + 1
    examples = self.examples.setdefault(f"{source}/{reason}", [])
    if len(examples) < MAX_EXAMPLES:
      examples.append([int(index), detail[:MAX_DETAIL_CHARS]])
      log.warning("dropped record %d of source %r (%s): %s", index, source, reason,
                  detail[:MAX_DETAIL_CHARS])

  @property
  def num_kept(self) -> int:
    return sum(self.kept.values())

  @property
  def num_dropped(self) -> int:
    return sum(sum(r.values()) for r in self.dropped.values())

  def dropped_by_reason(self) -> dict[str, int]:
    """Drop counts summed over sources."""
    total: dict[str, int] = {}
    for by_reason in self.dropped.values():
      for reason, n in by_reason.items():
        total[reason] = total.get(reason, 0) + n
    return total

  def to_state(self) -> dict[str, Any]:
    """A fresh JSON-serializable copy (later updates do not show through it)."""
    return {
        "kept": dict(self.kept),
        "kept_tokens": dict(self.kept_tokens),
        "dropped": {s: dict(r) for s, r in self.dropped.items()},
        "examples": {k: [list(e) for e in v] for k, v in self.examples.items()},
    }

  @classmethod
  def from_state(cls, state: dict[str, Any]) -> PipelineReport:
    return cls(**cls(**state).to_state())  # a copy: later counting leaves `state` as it was

  def table(self) -> str:
    """Several lines for the end of a run: totals, then each reason with its count and the
    first records dropped for it (`source[index]`)."""
    lines = [f"records: kept {self.num_kept} of {self.num_kept + self.num_dropped}, "
             f"dropped {self.num_dropped}"]
    rows = sorted(((n, s, r) for s, by in self.dropped.items() for r, n in by.items()), reverse=True)
    width = max((len(f"{s}/{r}") for _, s, r in rows), default=0)
    for n, s, r in rows:
      seen = ", ".join(f"{s}[{i}]" for i, _ in self.examples.get(f"{s}/{r}", []))
      lines.append(f"  {s + '/' + r:<{width}}  {n:>8}  e.g. {seen}")
    return "\n".join(lines)

  def summary(self) -> str:
    """One line for logs: kept and dropped counts with the reasons."""
    reasons = ", ".join(f"{r}={n}" for r, n in sorted(self.dropped_by_reason().items()))
    return f"kept {self.num_kept} records, dropped {self.num_dropped}" + (
        f" ({reasons})" if reasons else "")
