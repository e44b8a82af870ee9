"""Streaming JSONL in and out for the curation tools, and the report each tool writes.

Every tool reads its input record by record (`read_jsonl`), never holding the
whole file, and accounts for every line: a line is either kept, removed for a
named reason, or malformed (not JSON, not an object, missing a field the tool
needs). `CurationReport` holds the counts plus up to `MAX_EXAMPLES` line numbers
per reason, and is written next to the output as JSON.

  report = CurationReport("dedup", inputs=[path])
  kept = (rec for line, rec in read_jsonl(path, report) if keep(line, rec, report))
  write_jsonl(kept, out, report)
  report.write(out.with_suffix(".report.json"))
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

# Line numbers the report keeps per reason (all are counted).
MAX_EXAMPLES = 20


class CurationError(ValueError):
  """An input the tool cannot use at all: missing, unreadable, empty, or every record malformed."""


class CurationReport:
  """What a tool read, kept and removed, and why; `to_dict()` is the JSON the tool writes.

  read: lines with content; kept: records written; removed[reason]: records dropped by
  the tool's rule; malformed[reason]: lines that could not be used (bad JSON, wrong
  type, missing field). read == kept + sum(removed) + sum(malformed) once a tool is done.
  """

  def __init__(self, tool: str, *, inputs: Iterable[str | pathlib.Path] = ()):
    self.tool = tool
    self.inputs = [str(p) for p in inputs]
    self.read = 0
    self.kept = 0
    self.removed: dict[str, int] = {}
    self.malformed: dict[str, int] = {}
    self.examples: dict[str, list[Any]] = {}
    self.details: dict[str, Any] = {}

  def _count(self, table: dict[str, int], reason: str, where: Any) -> None:
    table[reason] = table.get(reason, 0) + 1
    examples = self.examples.setdefault(reason, [])
    if where is not None and len(examples) < MAX_EXAMPLES:
      examples.append(where)

  def remove(self, reason: str, where: Any = None) -> None:
    """Counts a record dropped by the tool's rule; `where` is usually `(path, line)` or a line number."""
    self._count(self.removed, reason, where)

  def bad(self, reason: str, where: Any = None) -> None:
    """Counts a line that could not be used (`reason` e.g. "invalid_json", "missing_field:prompt")."""
    self._count(self.malformed, reason, where)

  @property
  def num_removed(self) -> int:
    return sum(self.removed.values())

  @property
  def num_malformed(self) -> int:
    return sum(self.malformed.values())

  def to_dict(self) -> dict:
    return {"tool": self.tool, "inputs": self.inputs, "read": self.read, "kept": self.kept,
            "removed": dict(sorted(self.removed.items())), "malformed": dict(sorted(self.malformed.items())),
            "examples": self.examples, **self.details}

  def write(self, path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
    return path

  def summary(self) -> str:
    parts = [f"{self.tool}: read {self.read}, kept {self.kept}"]
    if self.removed:
      parts.append("removed " + ", ".join(f"{k} {v}" for k, v in sorted(self.removed.items())))
    if self.malformed:
      parts.append("malformed " + ", ".join(f"{k} {v}" for k, v in sorted(self.malformed.items())))
    return "; ".join(parts)


def read_jsonl(path: str | pathlib.Path, report: CurationReport | None = None, *,
               progress: bool = False) -> Iterator[tuple[int, dict]]:
  """Yields `(line_number, record)` (1-based) for each line holding a JSON object.

  Blank lines are skipped. A line that is not JSON, or not an object, is counted in
  `report.malformed` ("invalid_json" / "not_an_object") with `(path, line)` and skipped.
  Raises CurationError for a missing or unreadable file, an empty one, or one where no
  line was usable.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise CurationError(f"{path}: no such file")
  good = lines = 0
  try:
    with path.open("rb") as f:
      bar = _progress_bar(path, progress)
      for number, raw in enumerate(f, start=1):
        if bar is not None:
          bar.update(len(raw))
        if not raw.strip():
          continue
        lines += 1
        if report is not None:
          report.read += 1
        try:
          record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
          if report is not None:
            report.bad("invalid_json", (str(path), number))
          continue
        if not isinstance(record, dict):
          if report is not None:
            report.bad("not_an_object", (str(path), number))
          continue
        good += 1
        yield number, record
      if bar is not None:
        bar.close()
  except OSError as e:
    raise CurationError(f"{path}: cannot read ({e})") from e
  if lines == 0:
    raise CurationError(f"{path}: the file is empty")
  if good == 0:
    raise CurationError(f"{path}: none of its {lines} lines is a JSON object")


def write_jsonl(records: Iterable[dict], path: str | pathlib.Path, report: CurationReport | None = None) -> int:
  """Writes records one per line (parents created); counts them as kept; returns how many."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  n = 0
  with path.open("w") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")
      n += 1
  if report is not None:
    report.kept += n
  return n


def field_text(record: dict, field: str) -> str:
  """The text of `field`: a string, or a conversation (`messages` list) whose contents are joined.

  `field` may be a dotted path ("reward.reference"). "prompt" on a record without a prompt
  but with `messages` means every non-assistant message; "response" means the assistant
  messages. Raises KeyError (naming the field) when absent, TypeError when not text.
  """
  if field in ("prompt", "response") and field not in record and "messages" in record:
    want_assistant = field == "response"
    return "\n".join(_message_text(m) for m in _messages(record)
                     if (m.get("role") == "assistant") == want_assistant)
  value: Any = record
  for part in field.split("."):
    if not isinstance(value, dict) or part not in value:
      raise KeyError(field)
    value = value[part]
  if isinstance(value, str):
    return value
  if isinstance(value, list) and all(isinstance(m, dict) for m in value):
    return "\n".join(_message_text(m) for m in value)
  raise TypeError(f"field {field!r} is a {type(value).__name__}, not text or a message list")


def _messages(record: dict) -> list[dict]:
  messages = record["messages"]
  if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
    raise TypeError("field 'messages' is not a list of message objects")
  return messages


def _message_text(message: dict) -> str:
  content = message.get("content", "")
  if isinstance(content, list):  # content parts
    return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
  if not isinstance(content, str):
    raise TypeError(f"a message's content is a {type(content).__name__}, not text")
  return content


def _progress_bar(path: pathlib.Path, enabled: bool):
  if not enabled:
    return None
  from tqdm import tqdm
  return tqdm(total=path.stat().st_size, unit="B", unit_scale=True, desc=path.name, file=sys.stderr)
