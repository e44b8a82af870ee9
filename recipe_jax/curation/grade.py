"""Difficulty grading: sample k responses per prompt, verify them, keep each prompt's pass rate.

`recipe-jax data grade --model DIR --input in.jsonl --output out.jsonl [--config FILE]` reads
prompts, samples `samples` responses to each with the sampling engine (a Hugging Face
checkpoint directory with its tokenizer, prompts rendered by the tokenizer's chat template
with thinking off), scores every response with the record's verifier in the reward pool, and
writes each graded record with `pass_rate = num_correct / num_samples` added, a `difficulty`
label from the configured bands, and the learnability filter applied.

A record holds its prompt as `messages` (trailing assistant turns are dropped, so SFT records
grade as they are) or as `prompt` text, and its reward reference as

  "reward": {"verifier": "math", "reference": "42", "options": {...}}

`verifier` is a short name (`VERIFIERS`: math, science, code, ifeval, puzzles) or a module path
with a `score(response, reference, **options) -> Score`; it may be left out when the config
names a `default_verifier`. `options` is optional. A record without a usable reference counts
as malformed ("missing_reward_reference"), never as a prompt nobody solves. A response is
correct when its score is at least `correct_threshold`.

Recipes (configs/curation/):
- NebulaExp grades SFT data by the base model's pass@4: [0, 0.25) hard, [0.25, 0.5) medium,
  [0.5, 1] easy; its RL pool drops pass rates 0 and 1 (5 samples).
- Rufus-Air keeps prompts the current policy solves with rate in (0, 0.8] (learnability), after
  dropping prompts a stronger teacher never solves (correctness; `--teacher DIR`).

Removal reasons: "teacher_never_solves", "too_hard" (below the filter), "too_easy" (above it).
Malformed: "missing_prompt", "invalid_messages", "missing_reward_reference", "unknown_verifier",
"invalid_reward_reference" (the verifier raised on every response), "prompt_too_long" (more than
`max_prompt_tokens`), "sampling_error" (the engine rejected the prompt).

Prompts go to the engine `chunk_prompts` at a time and their records are written before the
next chunk is read. Sample keys derive from `(seed, first prompt of the chunk)` and the prompt's
place in the chunk, so a rerun with the same config draws the same samples.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from recipe_jax.config import ConfigError, load_typed_config, require, to_dict
from recipe_jax.curation.records import CurationReport, read_jsonl, write_jsonl
from recipe_jax.data.errors import DropRecord
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.rewards.reference import VERIFIERS, parse_reward_reference, verifier_module



@dataclasses.dataclass(frozen=True)
class Interval:
  """The pass rates between `low` and `high`; an open end excludes its endpoint."""

  low: float = 0.0
  high: float = 1.0
  low_open: bool = False
  high_open: bool = False

  def __post_init__(self):
    require(0.0 <= self.low <= self.high <= 1.0, "low/high", f"need 0 <= low <= high <= 1, got "
            f"low={self.low}, high={self.high}")
    require(self.low < self.high or not (self.low_open or self.high_open), "low/high",
            f"[{self.low}, {self.high}] with an open end is empty")

  def below(self, rate: float) -> bool:
    return rate < self.low or (self.low_open and rate == self.low)

  def above(self, rate: float) -> bool:
    return rate > self.high or (self.high_open and rate == self.high)

  def __contains__(self, rate: float) -> bool:
    return not (self.below(rate) or self.above(rate))

  def __str__(self) -> str:
    return f"{'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


@dataclasses.dataclass(frozen=True)
class Band:
  """A difficulty label for the pass rates in `interval`."""

  label: str
  interval: Interval


NEBULAEXP_BANDS = (Band("hard", Interval(0.0, 0.25, high_open=True)),
                   Band("medium", Interval(0.25, 0.5, high_open=True)),
                   Band("easy", Interval(0.5, 1.0)))


def check_bands(bands: Sequence[Band]) -> None:
  """Raises ConfigError unless the bands cover [0, 1] once: each pass rate gets one label."""
  if not bands:
    return
  ordered = sorted(bands, key=lambda b: (b.interval.low, b.interval.low_open))
  first, last = ordered[0].interval, ordered[-1].interval
  require(first.low == 0.0 and not first.low_open, "bands", f"must start at [0, got {first}")
  require(last.high == 1.0 and not last.high_open, "bands", f"must end at 1], got {last}")
  for a, b in zip(ordered, ordered[1:]):
    ia, ib = a.interval, b.interval
    require(ia.high == ib.low and ia.high_open != ib.low_open, "bands",
            f"{a.label} {ia} and {b.label} {ib} must meet with exactly one of them holding {ia.high}")
  labels = [b.label for b in bands]
  require(len(set(labels)) == len(labels) and all(labels), "bands", f"labels must be distinct "
          f"and non-empty, got {labels}")


@dataclasses.dataclass(frozen=True)
class GradeConfig:
  """How to grade.

  samples: responses per prompt (k). max_new_tokens, temperature, top_p: sampling settings.
  seed: sampling seed. bands: difficulty labels (empty: none written). filter: pass rates to
  keep (None: keep all). teacher_samples: > 0 drops prompts a teacher (`--teacher`) never
  solves in that many tries. correct_threshold: the score a correct response reaches.
  default_verifier: for records whose reward names none. chunk_prompts: prompts per engine
  call. slots: decode slots. max_prompt_tokens: longer prompts are malformed; the engine's
  cache holds max_prompt_tokens + max_new_tokens. reward_workers, reward_deadline_s: the
  reward pool. mesh: the sampling mesh (default one device; slots must divide its batch shards).
  """

  samples: int = 4
  max_new_tokens: int = 4096
  temperature: float = 1.0
  top_p: float = 1.0
  seed: int = 0
  bands: tuple[Band, ...] = NEBULAEXP_BANDS
  filter: Interval | None = None
  teacher_samples: int = 0
  correct_threshold: float = 1.0
  default_verifier: str = ""
  chunk_prompts: int = 64
  slots: int = 64
  max_prompt_tokens: int = 2048
  reward_workers: int = 4
  reward_deadline_s: float = 60.0
  mesh: MeshConfig = MeshConfig(fsdp=1)

  def __post_init__(self):
    require(self.samples >= 1, "samples", f"must be >= 1, got {self.samples}")
    require(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
    require(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
    require(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
    require(self.teacher_samples >= 0, "teacher_samples", f"must be >= 0, got {self.teacher_samples}")
    require(0.0 < self.correct_threshold <= 1.0, "correct_threshold",
            f"must be in (0, 1], got {self.correct_threshold}")
    for name in ("chunk_prompts", "slots", "max_prompt_tokens", "reward_workers"):
      require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
    require(self.reward_deadline_s > 0, "reward_deadline_s", f"must be > 0, got {self.reward_deadline_s}")
    check_bands(self.bands)
    if self.default_verifier:
      try:
        verifier_module(self.default_verifier)
      except ValueError as e:
        raise ConfigError(f"default_verifier: {e}") from None


def label(rate: float, bands: Sequence[Band]) -> str | None:
  """The label of the band holding `rate` (None without bands)."""
  for band in bands:
    if rate in band.interval:
      return band.label
  return None


def filter_reason(rate: float, interval: Interval | None) -> str | None:
  """"too_hard" / "too_easy" when `rate` falls below / above `interval`, else None."""
  if interval is None:
    return None
  if interval.below(rate):
    return "too_hard"
  if interval.above(rate):
    return "too_easy"
  return None


# ----------------------------------------------------------------------------
# Samplers: prompts in, response texts out
# ----------------------------------------------------------------------------


class PromptError(ValueError):
  """A prompt the sampler cannot take; `reason` is the report's key."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason


class Sampler(Protocol):
  """`prepare` turns a prompt's messages into the sampler's input (raising PromptError);
  `sample` returns, per prepared prompt, `n` pairs `(response text, finish reason)`."""

  def prepare(self, messages: list[dict]) -> Any: ...

  def sample(self, prepared: list[Any], *, n: int, seed: int) -> list[list[tuple[str, str]]]: ...


class EngineSampler:
  """A Hugging Face checkpoint directory (weights and tokenizer) behind the sampling engine."""

  def __init__(self, model_dir: str | pathlib.Path, config: GradeConfig):
    from recipe_jax.checkpoint import hf
    from recipe_jax.data.tokenizer import load_tokenizer
    from recipe_jax.parallel.mesh import make_mesh
    from recipe_jax.sampling.engine import Engine

    self.config = config
    self.tokenizer = load_tokenizer(model_dir)
    mesh = make_mesh(config.mesh)
    mesh = None if mesh.size == 1 else mesh
    model, params = hf.load(model_dir, mesh)
    if len(self.tokenizer) > model.vocab_size:
      raise ConfigError(f"{model_dir}: the tokenizer has {len(self.tokenizer)} tokens, the model's "
                        f"vocabulary only {model.vocab_size}")
    self.stop_ids = tuple(sorted({self.tokenizer.eos_token_id} - {None}))
    self.engine = Engine(model, params, slots=config.slots, stop_token_ids=self.stop_ids, mesh=mesh,
                         max_len=config.max_prompt_tokens + config.max_new_tokens)

  def prepare(self, messages: list[dict]) -> list[int]:
    try:
      ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False,
                                               tokenize=True, return_dict=False)
    except Exception as e:  # a template error on this record's messages
      raise PromptError("invalid_messages", f"{type(e).__name__}: {e}") from e
    if len(ids) > self.config.max_prompt_tokens:
      raise PromptError("prompt_too_long", f"{len(ids)} tokens > max_prompt_tokens={self.config.max_prompt_tokens}")
    return list(ids)

  def sample(self, prepared: list[list[int]], *, n: int, seed: int) -> list[list[tuple[str, str]]]:
    from recipe_jax.sampling.driver import generate

    c = self.config
    out = generate(self.engine, prepared, n=n, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                   top_p=c.top_p, seed=seed)
    texts = self.tokenizer.batch_decode([o.token_ids for o in out], skip_special_tokens=True)
    pairs = [(text, o.finish_reason) for text, o in zip(texts, out)]
    return [pairs[i * n:(i + 1) * n] for i in range(len(prepared))]


# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Prompt:
  line: int
  record: dict
  messages: list[dict]
  verifier: str
  reference: Any
  options: dict
  prepared: dict[str, Any] = dataclasses.field(default_factory=dict)


def _prompt_messages(record: dict) -> list[dict]:
  """The conversation to continue: `messages` without trailing assistant turns, or `prompt`."""
  if "messages" in record:
    messages = record["messages"]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                 for m in messages):
      raise PromptError("invalid_messages", "'messages' is not a list of objects with a role")
    messages = list(messages)
    while messages and messages[-1]["role"] == "assistant":
      messages.pop()
    if not messages:
      raise PromptError("invalid_messages", "no message before the assistant turns")
    return messages
  if isinstance(record.get("prompt"), str) and record["prompt"].strip():
    return [{"role": "user", "content": record["prompt"]}]
  raise PromptError("missing_prompt", "neither 'messages' nor a non-empty 'prompt'")


def _reward(record: dict, default_verifier: str) -> tuple[str, Any, dict]:
  """`(verifier module, reference, options)` of a record, or PromptError naming what is wrong."""
  try:
    ref = parse_reward_reference(record, default_verifier=default_verifier)
  except DropRecord as e:
    raise PromptError(e.reason, e.detail) from None
  return ref.verifier, ref.reference, ref.options


# ----------------------------------------------------------------------------
# Grading
# ----------------------------------------------------------------------------


def chunk_seed(seed: int, first_prompt: int, salt: int = 0) -> int:
  """The generate() seed of the chunk whose first prompt is `first_prompt` (0-based)."""
  return int(np.random.SeedSequence([seed, first_prompt, salt]).generate_state(1)[0] & 0x7FFFFFFF)


class Grader:
  """Grades chunks of prompts: sampling, scoring, bands, filters and the report's statistics.

  scorer: `items -> scores` (a `RewardPool`'s `score`); teacher: a second Sampler for the
  correctness pre-filter (with `config.teacher_samples`).
  """

  def __init__(self, config: GradeConfig, sampler: Sampler, scorer: Callable[[list], list], report: CurationReport,
               *, teacher: Sampler | None = None):
    if (teacher is None) != (config.teacher_samples == 0):
      raise ConfigError(f"teacher_samples={config.teacher_samples} needs a teacher model (--teacher DIR), "
                        "and a teacher needs teacher_samples > 0")
    self.config, self.sampler, self.scorer, self.report, self.teacher = config, sampler, scorer, report, teacher
    self.histogram: collections.Counter = collections.Counter()
    self.difficulty: collections.Counter = collections.Counter()
    self.finish: collections.Counter = collections.Counter()
    self.verdicts: collections.Counter = collections.Counter()
    self.teacher_histogram: collections.Counter = collections.Counter()
    self.graded = 0
    self.prompts_seen = 0

  def parse(self, line: int, record: dict) -> _Prompt | None:
    """A prompt ready to sample, or None after counting why the record is malformed."""
    try:
      messages = _prompt_messages(record)
      prompt = _Prompt(line, record, messages, *_reward(record, self.config.default_verifier))
      prompt.prepared["model"] = self.sampler.prepare(messages)
      if self.teacher is not None:
        prompt.prepared["teacher"] = self.teacher.prepare(messages)
    except PromptError as e:
      self.report.bad(e.reason, line)
      return None
    return prompt

  def _correct(self, sampler: Sampler, which: str, prompts: list[_Prompt], n: int, seed: int) -> list[int | str]:
    """Correct responses per prompt out of `n`, or the malformed reason when there are none to
    count: "sampling_error" (the sampler rejected the prompt) or "invalid_reward_reference"
    (the verifier raised on every response: the reference does not suit it)."""
    from recipe_jax.rewards.pool import Item

    samples = sampler.sample([p.prepared[which] for p in prompts], n=n, seed=seed)
    usable = ["error" not in (reason for _, reason in got) for got in samples]
    items = [Item(p.verifier, text, p.reference, p.options)
             for p, got, ok in zip(prompts, samples, usable) if ok for text, _ in got]
    scores = iter(self.scorer(items))
    counts: list[int | str] = []
    for got, ok in zip(samples, usable):
      self.finish.update(f"{which}:{reason}" for _, reason in got)
      if not ok:
        counts.append("sampling_error")
        continue
      verdicts = [next(scores) for _ in got]
      reasons = [v.reason.split(":")[0] for v in verdicts]
      self.verdicts.update(f"{which}:{r}" for r in reasons)
      if all(r == "verifier_error" for r in reasons):
        counts.append("invalid_reward_reference")
      else:
        counts.append(sum(v.value >= self.config.correct_threshold for v in verdicts))
    return counts

  def grade(self, prompts: list[_Prompt]) -> list[dict]:
    """The kept records of one chunk, in input order, with their grades added."""
    c = self.config
    first = self.prompts_seen
    self.prompts_seen += len(prompts)
    if self.teacher is not None:
      solved = self._correct(self.teacher, "teacher", prompts, c.teacher_samples, chunk_seed(c.seed, first, 1))
      survivors = []
      for p, k in zip(prompts, solved):
        if isinstance(k, str):
          self.report.bad(k, p.line)
          continue
        self.teacher_histogram[f"{k}/{c.teacher_samples}"] += 1
        p.record = {**p.record, "teacher_num_correct": k, "teacher_pass_rate": k / c.teacher_samples}
        if k == 0:
          self.report.remove("teacher_never_solves", p.line)
        else:
          survivors.append(p)
      prompts = survivors
    if not prompts:
      return []
    kept = []
    for p, k in zip(prompts, self._correct(self.sampler, "model", prompts, c.samples, chunk_seed(c.seed, first))):
      if isinstance(k, str):
        self.report.bad(k, p.line)
        continue
      rate = k / c.samples
      self.graded += 1
      self.histogram[f"{k}/{c.samples}"] += 1
      record = {**p.record, "pass_rate": rate, "num_samples": c.samples, "num_correct": k}
      band = label(rate, c.bands)
      if band is not None:
        record["difficulty"] = band
        self.difficulty[band] += 1
      reason = filter_reason(rate, c.filter)
      if reason is not None:
        self.report.remove(reason, p.line)
      else:
        kept.append(record)
    return kept

  def run(self, records: Iterator[tuple[int, dict]]) -> Iterator[dict]:
    """Graded records to write, `chunk_prompts` prompts at a time."""
    chunk: list[_Prompt] = []
    for line, record in records:
      prompt = self.parse(line, record)
      if prompt is not None:
        chunk.append(prompt)
      if len(chunk) == self.config.chunk_prompts:
        yield from self.grade(chunk)
        chunk = []
    if chunk:
      yield from self.grade(chunk)

  def details(self) -> dict:
    c = self.config
    rates = [int(k.split("/")[0]) / c.samples * n for k, n in self.histogram.items()]
    out = {"samples": c.samples, "prompts_graded": self.graded,
           "mean_pass_rate": (sum(rates) / self.graded) if self.graded else None,
           "pass_rate_histogram": dict(sorted(self.histogram.items(), key=lambda kv: int(kv[0].split("/")[0]))),
           "difficulty": dict(self.difficulty), "filter": str(c.filter) if c.filter else None,
           "finish_reasons": dict(self.finish), "verifier_reasons": dict(self.verdicts)}
    if self.teacher is not None:
      out["teacher_histogram"] = dict(self.teacher_histogram)
    return out


def grade_file(input_path: str | pathlib.Path, output_path: str | pathlib.Path, config: GradeConfig,
               sampler: Sampler, *, teacher: Sampler | None = None,
               scorer: Callable[[list], list] | None = None, progress: bool = False) -> CurationReport:
  """Grades `input_path` into `output_path`; returns the report (not written).

  scorer: default a `RewardPool` with the config's workers and deadline, for this call.
  progress: a progress bar over the input on stderr.
  """
  from recipe_jax.rewards.pool import RewardPool

  report = CurationReport("grade", inputs=[input_path])
  pool = None
  if scorer is None:
    pool = RewardPool(num_workers=config.reward_workers, deadline_s=config.reward_deadline_s)
  try:
    grader = Grader(config, sampler, scorer or pool.score, report, teacher=teacher)
    write_jsonl(grader.run(read_jsonl(input_path, report, progress=progress)), output_path, report)
  finally:
    if pool is not None:
      pool.close()
  report.details["grade"] = grader.details()
  report.details["config"] = to_dict(config)
  report.details["output"] = str(output_path)
  return report


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--input", required=True, help="JSONL of prompts with reward references")
  parser.add_argument("--output", required=True, help="JSONL of graded records (and <output>.report.json)")
  parser.add_argument("--model", required=True, help="Hugging Face checkpoint directory with its tokenizer")
  parser.add_argument("--teacher", help="checkpoint directory of the teacher (correctness pre-filter)")
  parser.add_argument("--config", help="a file from configs/curation/ defining get_config() -> GradeConfig")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field, e.g. --set samples=8 --set filter.high=0.75")


def load_config(args: argparse.Namespace) -> GradeConfig:
  return load_typed_config(args.config, GradeConfig, overrides=args.set, default=GradeConfig())


def run_cli(args: argparse.Namespace) -> CurationReport:
  config = load_config(args)
  if bool(args.teacher) != (config.teacher_samples > 0):
    raise ConfigError(f"teacher_samples={config.teacher_samples} and --teacher "
                      f"{args.teacher or '(none)'}: a teacher pre-filter needs both, grading without one neither")
  sampler = EngineSampler(args.model, config)
  teacher = EngineSampler(args.teacher, config) if args.teacher else None
  report = grade_file(args.input, args.output, config, sampler, teacher=teacher,
                      progress=not getattr(args, "no_progress", True))
  report.details["model"] = str(args.model)
  if args.teacher:
    report.details["teacher"] = str(args.teacher)
  return report
