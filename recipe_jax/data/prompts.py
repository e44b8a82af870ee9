"""RL prompts from Grain: conversations plus a reward reference, rendered to prompt token ids.

Each record is a conversation (OpenAI `messages`) and a `reward` field
(`recipe_jax.rewards.reference`). Trailing assistant messages (an SFT record's
answer) are dropped; the rest is rendered with the tokenizer's chat template and
a generation prompt. Records are read, shuffled, repeated and mixed exactly as
the SFT pipeline reads them (`recipe_jax.data.pipeline`), and a bad record (no
user turn, a missing or malformed reward reference, a prompt over
`max_prompt_len`) is skipped and counted in the same `PipelineReport`, which
travels in the iterator state.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from recipe_jax.config import require
from recipe_jax.data.errors import DropRecord, PipelineReport, RecordFailedError, reason_for
from recipe_jax.data.pipeline import Source, _CountDrops, _Dropped, _find_report, _seed, saved_iterator_state
from recipe_jax.data.readers import RecordError, normalize
from recipe_jax.rewards.reference import RewardReference, parse_reward_reference

_STATE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class PromptDataConfig:
  """How prompts are read: `max_prompt_len` tokens at most (longer ones are dropped and counted)."""

  max_prompt_len: int = 512
  seed: int = 0
  shuffle: bool = True
  num_epochs: int | None = None
  strict: bool = False
  read_threads: int = 2
  read_buffer: int = 32
  max_consecutive_drops: int = 10_000
  enable_thinking: bool = False

  def __post_init__(self):
    require(self.max_prompt_len >= 1, "prompts.max_prompt_len", "must be >= 1")
    require(self.num_epochs is None or self.num_epochs >= 1, "prompts.num_epochs", "must be >= 1 or None")


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One RL prompt: its token ids, reward reference, and where it came from."""

  ids: tuple[int, ...]
  reward: RewardReference
  source: str
  index: int


def reward_fields(record: dict, source: str) -> dict:
  """The RL prompt's extra field: its reward reference (DropRecord if missing or malformed)."""
  del source
  return {"reward": parse_reward_reference(record)}


def prompt_example_fn(tokenizer, *, max_prompt_len: int, enable_thinking: bool = False,
                      fields: Callable[[dict, str], dict] = reward_fields):
  """`fn(record, source, index) -> example` rendering a record's prompt; DropRecord on bad input.

  `fields(record, source)` adds the stage's own fields to the example (default: the reward
  reference; distillation adds the prompt's domain) and raises DropRecord to skip a record.
  """

  def example_fn(record: Any, source: str, index: int) -> dict:
    try:
      conv = normalize(record, source=source, index=index)
    except RecordError as e:
      raise DropRecord("malformed_record", f"{e.field}: {e.problem}") from e
    messages = conv.to_template_messages()
    while messages and messages[-1]["role"] == "assistant":
      messages.pop()
    if not any(m["role"] == "user" for m in messages):
      raise DropRecord("no_user_turn", "the conversation has no user message to answer")
    extra = fields(record, source)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                        enable_thinking=enable_thinking, return_dict=False)
    if len(ids) > max_prompt_len:
      raise DropRecord("over_length", f"prompt of {len(ids)} tokens > max_prompt_len {max_prompt_len}")
    return {"tokens": np.asarray(ids, np.int32), "index": index, **extra}

  return example_fn


class _ReadPrompt:

  def __init__(self, source: Source, example_fn, strict: bool):
    self._name, self._data, self._fn, self._strict = source.name, source.data, example_fn, strict

  def __call__(self, index: int):
    index = int(index)
    try:
      example = self._fn(self._data[index], self._name, index)
    except DropRecord as e:
      return _Dropped(self._name, index, e.reason, e.detail)
    except Exception as e:  # one bad record must not stop the run; strict mode says otherwise
      if self._strict:
        raise RecordFailedError(self._name, index, e) from e
      return _Dropped(self._name, index, reason_for(e), f"{type(e).__name__}: {e}")
    example["source"] = self._name
    return example


class PromptPipeline:
  """Iterates `Prompt`s from weighted sources; `take(n)` returns the next n (fewer at the end)."""

  def __init__(self, sources: Source | Sequence[Source], example_fn, config: PromptDataConfig):
    self.sources = [sources] if isinstance(sources, Source) else list(sources)
    names = [s.name for s in self.sources]
    require(len(self.sources) >= 1, "sources", "need at least one prompt source")
    require(len(set(names)) == len(names), "sources", f"names must be unique: {names}")
    parts = []
    for s in self.sources:
      require(s.weight > 0, f"sources.{s.name}.weight", f"must be > 0, got {s.weight}")
      require(len(s.data) > 0, f"sources.{s.name}", "has no records")
      records = grain.MapDataset.range(len(s.data))
      if config.shuffle:
        records = records.shuffle(seed=_seed(config.seed, "prompts", s.name))
      parts.append(records.repeat(config.num_epochs).map(_ReadPrompt(s, example_fn, config.strict)))
    mixed = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, weights=[s.weight for s in self.sources])
    dataset = _CountDrops(mixed.to_iter_dataset(grain.ReadOptions(
        num_threads=config.read_threads, prefetch_buffer_size=config.read_buffer)), config.max_consecutive_drops)
    self.iterator = iter(dataset)
    fields = {k: v for k, v in dataclasses.asdict(config).items()
              if k not in ("read_threads", "read_buffer", "max_consecutive_drops", "strict")}
    fields["sources"] = [[s.name, len(s.data), s.weight] for s in self.sources]
    self._fingerprint = json.loads(json.dumps(fields))

  def take(self, n: int) -> list[Prompt]:
    out = []
    for example in self.iterator:
      out.append(Prompt(tuple(int(t) for t in example["tokens"]), example["reward"], example["source"],
                        example["index"]))
      if len(out) == n:
        break
    return out

  def get_state(self) -> dict[str, Any]:
    return {"format": _STATE_FORMAT, "config": self._fingerprint, "iterator": self.iterator.get_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    self.iterator.set_state(saved_iterator_state(state, self._fingerprint, _STATE_FORMAT, "prompt iterator"))

  def report(self) -> PipelineReport:
    found = _find_report(self.iterator.get_state())
    return PipelineReport() if found is None else PipelineReport.from_state(found)
