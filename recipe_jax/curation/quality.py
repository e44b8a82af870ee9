"""Quality indicators of SFT records under a scoring model, and selection by weighted percentile ranks.

`recipe-jax data score --model DIR --input sft.jsonl --output selected.jsonl [--config FILE]`
renders each record with the SFT chat template and loss-mask policy (the tokens that carry loss
are the response r; everything before the first of them is the prompt q) and computes, with the
scoring model (NebulaExp's indicators; IFD from Li et al. 2024):

  length      |r|, response tokens
  entropy     (1/|r|) sum_t H(p(. | q, r_<t)),  H(p) = -sum_v p_v log p_v
  loss        L(r | q) = -(1/|r|) sum_t log p(r_t | q, r_<t)
  loss_alone  L(r)     = -(1/|r|) sum_t log p(r_t | c, r_<t), c a single document-start token
  ifd         IFD = L(r | q) / L(r)   (the ratio; > 1 means the prompt does not help)

c is the tokenizer's BOS token, else its pad token (Qwen's `<|endoftext|>`), else EOS: one
context token, so both losses score the same |r| tokens. r runs from the first supervised token
to the end; unsupervised tokens inside it (a tool result between two supervised turns) stay in
the context of both rows but are not scored. Records are scored `batch_size` at a
time, both rows of each record in one batch padded to a power-of-two length bucket (so jit
compiles a few shapes); log-probs come from `token_logprobs` and entropies from the logits
`logits_chunk` positions at a time, so `[B, T, V]` float32 logits never exist at once.

Selection: r_i(x) is x's percentile rank on indicator i over all scored records (average rank
of ties, scaled to [0, 1]; flipped when lower is better), s(x) = sum_i w_i r_i(x). Keep the
`keep_top` best, or the best `keep_fraction`; with `stratum_field` (e.g. `category`), each
stratum keeps the same fraction of its own records, or its quota from `stratum_quotas`. Ranks
are global: a stratum's quota takes its best records by the same scores. Ties go to the earlier line.

Selection needs every score, so the tool reads its input twice: a streaming scoring pass keeps
only `(line, indicators, stratum)` per record; a second streaming pass writes the selected
records, in input order, with a `quality` object (the indicators and `score`) added.
Removed: "too_long" (more than `max_len` tokens), "ifd_above_max", "not_selected". Malformed:
the SFT validators' reasons (e.g. "invalid_role_transition"), "missing_field:<stratum_field>".

References: Li, Zhang, Li, Chen, Chen, Cheng, Wang, Zhou, Xiao 2024, "From Quantity to Quality:
Boosting LLM Performance with Self-Guided Data Selection for Instruction Tuning", NAACL 2024,
https://arxiv.org/abs/2308.12032 (IFD; they drop IFD > 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import pathlib
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

from recipe_jax.config import ConfigError, load_typed_config, require, to_dict
from recipe_jax.curation.records import CurationReport, read_jsonl, write_jsonl
from recipe_jax.parallel.mesh import MeshConfig

INDICATORS = ("length", "entropy", "loss", "loss_alone", "ifd")


@dataclasses.dataclass(frozen=True)
class Indicator:
  """One term of the selection score: `weight` times the percentile rank of indicator `name`."""

  name: str
  weight: float = 1.0
  higher_is_better: bool = True

  def __post_init__(self):
    require(self.name in INDICATORS, "indicators", f"{self.name!r} is not one of {list(INDICATORS)}")
    require(self.weight >= 0.0, "indicators", f"weight of {self.name} must be >= 0, got {self.weight}")


@dataclasses.dataclass(frozen=True)
class QualityConfig:
  """Scoring and selection settings (see the module docstring)."""

  template: Literal["qwen3", "glm45"] = "qwen3"
  policy: Literal["all_assistant", "final_response"] = "final_response"
  indicators: tuple[Indicator, ...] = (Indicator("ifd", 1.0, higher_is_better=True),)
  keep_fraction: float = 1.0
  keep_top: int = 0
  stratum_field: str = ""
  stratum_quotas: tuple[tuple[str, int], ...] = ()
  max_ifd: float | None = None
  batch_size: int = 8
  max_len: int = 8192
  min_bucket: int = 64
  logits_chunk: int = 512
  mesh: MeshConfig = MeshConfig(fsdp=1)  # batch rows (2 * batch_size) split over its batch axes

  def __post_init__(self):
    require(bool(self.indicators) and any(i.weight > 0 for i in self.indicators), "indicators",
            "need at least one indicator with a positive weight")
    require(0.0 <= self.keep_fraction <= 1.0, "keep_fraction", f"must be in [0, 1], got {self.keep_fraction}")
    require(self.keep_top >= 0, "keep_top", f"must be >= 0, got {self.keep_top}")
    require(not (self.keep_top and self.stratum_field), "keep_top",
            "a global keep_top does not combine with stratum_field; use stratum_quotas")
    require(not self.stratum_quotas or bool(self.stratum_field), "stratum_quotas", "need a stratum_field")
    for name, quota in self.stratum_quotas:
      require(isinstance(quota, int) and quota >= 0, "stratum_quotas", f"quota of {name!r} must be an int >= 0")
    require(self.max_ifd is None or self.max_ifd > 0, "max_ifd", f"must be > 0, got {self.max_ifd}")
    for name in ("batch_size", "max_len", "min_bucket", "logits_chunk"):
      require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")


# ----------------------------------------------------------------------------
# Selection by weighted percentile ranks
# ----------------------------------------------------------------------------


def percentile_ranks(values: Sequence[float]) -> np.ndarray:
  """Each value's rank in [0, 1] (0 the smallest, 1 the largest; ties share their average rank).

  A single value gets 0.5.
  """
  x = np.asarray(values, np.float64)
  n = x.size
  if n == 0:
    return np.zeros(0)
  if n == 1:
    return np.full(1, 0.5)
  _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
  first = np.concatenate([[0], np.cumsum(counts)[:-1]])  # 0-based rank of each distinct value's first
  return (first + (counts - 1) / 2.0)[inverse] / (n - 1)


def weighted_scores(table: dict[str, np.ndarray], indicators: Sequence[Indicator]) -> np.ndarray:
  """s = sum_i w_i r_i, r_i the (direction-adjusted) percentile rank on indicator i."""
  n = len(next(iter(table.values())))
  s = np.zeros(n)
  for ind in indicators:
    r = percentile_ranks(table[ind.name])
    s += ind.weight * (r if ind.higher_is_better else 1.0 - r)
  return s


def _count(fraction: float, n: int) -> int:
  return int(math.floor(fraction * n + 0.5))


def select(scores: np.ndarray, strata: Sequence[str] | None = None, *, keep_fraction: float = 1.0,
           keep_top: int = 0, quotas: dict[str, int] | None = None) -> np.ndarray:
  """A boolean mask of the records to keep: the best by score, overall or per stratum.

  Without strata: the `keep_top` best (if > 0), else the best round(keep_fraction * n). With
  strata: per stratum, its quota from `quotas`, else round(keep_fraction * its size).
  Ties go to the earlier record.
  """
  scores = np.asarray(scores, np.float64)
  keep = np.zeros(scores.size, bool)
  if strata is None:
    groups = {None: np.arange(scores.size)}
  else:
    lists: dict[str, list[int]] = {}
    for i, name in enumerate(strata):
      lists.setdefault(name, []).append(i)
    groups = {name: np.asarray(members, np.int64) for name, members in lists.items()}
  for name, members in groups.items():
    if strata is None:
      want = keep_top if keep_top else _count(keep_fraction, members.size)
    else:
      want = (quotas or {}).get(name, _count(keep_fraction, members.size))
    best = members[np.argsort(-scores[members], kind="stable")[:want]]
    keep[best] = True
  return keep


# ----------------------------------------------------------------------------
# The scoring model
# ----------------------------------------------------------------------------


def token_entropy(hidden, head, *, chunk_size: int):
  """H(softmax(h_t W)) per position `[B, T]` (float32), `chunk_size` positions of logits at a time."""
  import jax
  import jax.numpy as jnp

  def entropy(h):
    logits = jnp.einsum("btd,dv->btv", h, head.astype(h.dtype), preferred_element_type=jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -(jnp.exp(logp) * logp).sum(-1)

  b, t, _ = hidden.shape
  if t <= chunk_size:
    return entropy(hidden)
  n = -(-t // chunk_size)
  h = jnp.pad(hidden, ((0, 0), (0, n * chunk_size - t), (0, 0)))
  out = jax.lax.map(entropy, h.reshape(b, n, chunk_size, -1).swapaxes(0, 1))
  return out.swapaxes(0, 1).reshape(b, n * chunk_size)[:, :t]


@functools.lru_cache(maxsize=8)
def _stats_fn(model, chunk_size: int, mesh):
  """jit: `(params, tokens, segments, targets, mask) -> (nll sum, entropy sum, tokens)` per row `[R]`."""
  import jax
  import jax.numpy as jnp

  from recipe_jax.losses.logprobs import token_logprobs
  from recipe_jax.models import forward

  def stats(params, tokens, segments, targets, mask):
    out = forward(model, params, tokens, segment_ids=segments, return_hidden=True, mesh=mesh)
    head = params["embed"].T if model.tie_word_embeddings else params["lm_head"]
    logp = token_logprobs(out.hidden_states, head, targets, chunk_size=chunk_size)
    ent = token_entropy(out.hidden_states, head, chunk_size=chunk_size)
    # where, not a product: padding rows attend to nothing, and 0 * NaN would leak
    return (-jnp.where(mask, logp, 0.0).sum(-1), jnp.where(mask, ent, 0.0).sum(-1),
            mask.astype(jnp.float32).sum(-1))

  return jax.jit(stats)


def response_rows(ids: np.ndarray, loss_mask: np.ndarray, context_id: int) -> tuple[tuple, tuple]:
  """`(tokens, targets, mask)` of the conditional row (q + r) and of the response-alone row (c + r)."""
  ids = np.asarray(ids, np.int32)
  mask = np.asarray(loss_mask, bool).copy()
  mask[0] = False  # a first token has no context in the conditional row
  first = int(np.argmax(mask))
  alone = np.concatenate([[context_id], ids[first:]]).astype(np.int32)
  return (ids[:-1], ids[1:], mask[1:]), (alone[:-1], alone[1:], mask[first:])


def bucket_length(n: int, *, min_bucket: int, max_len: int) -> int:
  """The next power of two >= max(n, min_bucket), at most max_len."""
  return min(max(min_bucket, 1 << (max(n, 1) - 1).bit_length()), max_len)


class QualityModel:
  """A Hugging Face checkpoint directory (weights and tokenizer) that scores rendered records."""

  def __init__(self, model_dir: str | pathlib.Path, config: QualityConfig):
    from recipe_jax.checkpoint import hf
    from recipe_jax.data.tokenizer import load_tokenizer
    from recipe_jax.data.validate import sft_example_fn
    from recipe_jax.parallel.mesh import make_mesh

    self.config = config
    self.tokenizer = load_tokenizer(model_dir)
    mesh = make_mesh(config.mesh)
    mesh = None if mesh.size == 1 else mesh
    self.model, self.params = hf.load(model_dir, mesh)
    if len(self.tokenizer) > self.model.vocab_size:
      raise ConfigError(f"{model_dir}: the tokenizer has {len(self.tokenizer)} tokens, the model's "
                        f"vocabulary only {self.model.vocab_size}")
    tok = self.tokenizer
    ids = [i for i in (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id) if i is not None]
    if not ids:
      raise ConfigError(f"{model_dir}: the tokenizer has no BOS, pad or EOS token to start a response alone")
    self.context_id = ids[0]
    self.render = sft_example_fn(tok, template=config.template, policy=config.policy)
    self.stats = _stats_fn(self.model, config.logits_chunk, mesh)

  def score(self, examples: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[dict[str, float]]:
    """Indicators of up to `batch_size` rendered records `(ids, loss_mask)`."""
    c = self.config
    if not 0 < len(examples) <= c.batch_size:
      raise ValueError(f"score takes 1..{c.batch_size} records, got {len(examples)}")
    rows = [row for ids, mask in examples for row in response_rows(ids, mask, self.context_id)]
    width = bucket_length(max(len(r[0]) for r in rows), min_bucket=c.min_bucket, max_len=c.max_len)
    shape = (2 * c.batch_size, width)
    tokens, targets, mask = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape, bool)
    segments = np.zeros(shape, np.int32)  # 0 marks padding
    for i, (t, y, m) in enumerate(rows):
      tokens[i, :len(t)], targets[i, :len(y)], mask[i, :len(m)], segments[i, :len(t)] = t, y, m, 1
    got = self.stats(self.params, tokens, segments, targets, mask)
    nll, ent, count = (np.asarray(a, np.float64) for a in got)
    out = []
    for k in range(len(examples)):
      cond, alone = 2 * k, 2 * k + 1
      n = count[cond]
      loss, loss_alone = nll[cond] / n, nll[alone] / n
      out.append({"length": int(n), "entropy": ent[cond] / n, "loss": loss, "loss_alone": loss_alone,
                  "ifd": loss / max(loss_alone, 1e-12)})
    return out


# ----------------------------------------------------------------------------
# The two passes
# ----------------------------------------------------------------------------


def _stratum(record: dict, field: str) -> str | None:
  value = record
  for part in field.split("."):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return str(value) if isinstance(value, (str, int, float, bool)) else None


def score_records(records: Iterator[tuple[int, dict]], scorer: QualityModel,
                  report: CurationReport) -> Iterator[tuple[int, dict, str | None]]:
  """Yields `(line, indicators, stratum)` for every record that renders and fits (pass one)."""
  from recipe_jax.data.errors import DropRecord

  c = scorer.config
  batch: list[tuple[int, str | None, tuple]] = []
  for line, record in records:
    stratum = None
    if c.stratum_field:
      stratum = _stratum(record, c.stratum_field)
      if stratum is None:
        report.bad(f"missing_field:{c.stratum_field}", line)
        continue
    try:
      example = scorer.render(record, "input", line)
    except DropRecord as e:
      report.bad(e.reason, line)
      continue
    if len(example["ids"]) > c.max_len:
      report.remove("too_long", line)
      continue
    batch.append((line, stratum, (example["ids"], example["loss_mask"])))
    if len(batch) == c.batch_size:
      yield from _score_batch(scorer, batch)
      batch = []
  if batch:
    yield from _score_batch(scorer, batch)


def _score_batch(scorer: QualityModel, batch: list) -> Iterator[tuple[int, dict, str | None]]:
  for (line, stratum, _), scores in zip(batch, scorer.score([b[2] for b in batch])):
    yield line, scores, stratum


def select_file(input_path: str | pathlib.Path, output_path: str | pathlib.Path, config: QualityConfig,
                scorer: QualityModel, *, progress: bool = False) -> CurationReport:
  """Scores `input_path`, selects, and writes the selected records to `output_path`.

  progress: a progress bar over the scoring pass on stderr.
  """
  report = CurationReport("score", inputs=[input_path])
  lines, table, strata = [], {k: [] for k in INDICATORS}, []
  for line, scores, stratum in score_records(read_jsonl(input_path, report, progress=progress), scorer, report):
    if config.max_ifd is not None and scores["ifd"] > config.max_ifd:
      report.remove("ifd_above_max", line)
      continue
    lines.append(line)
    strata.append(stratum)
    for k in INDICATORS:
      table[k].append(scores[k])
  arrays = {k: np.asarray(v, np.float64) for k, v in table.items()}
  total = weighted_scores(arrays, config.indicators) if lines else np.zeros(0)
  keep = select(total, strata if config.stratum_field else None, keep_fraction=config.keep_fraction,
                keep_top=config.keep_top, quotas=dict(config.stratum_quotas))
  row_of = {line: i for i, line in enumerate(lines)}
  for i in np.flatnonzero(~keep):
    report.remove("not_selected", lines[i])

  def selected() -> Iterator[dict]:
    for line, record in read_jsonl(input_path):
      i = row_of.get(line)
      if i is not None and keep[i]:
        yield {**record, "quality": {**{k: float(arrays[k][i]) for k in INDICATORS}, "score": float(total[i])}}

  write_jsonl(selected(), output_path, report)
  report.details["quality"] = _summary(arrays, total, keep, strata if config.stratum_field else None)
  report.details["config"] = to_dict(config)
  report.details["output"] = str(output_path)
  return report


def _summary(arrays: dict[str, np.ndarray], total: np.ndarray, keep: np.ndarray, strata) -> dict:
  def quantiles(x):
    return {q: float(np.quantile(x, p)) for q, p in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))} if x.size else {}

  out = {"scored": int(total.size), "selected": int(keep.sum()),
         "indicators": {k: {"mean": float(v.mean()) if v.size else None, **quantiles(v)} for k, v in arrays.items()},
         "score": quantiles(total), "selected_score_min": float(total[keep].min()) if keep.any() else None}
  if strata is not None:
    names = np.asarray(strata, dtype=object)
    out["strata"] = {s: {"scored": int((names == s).sum()), "selected": int(keep[names == s].sum())}
                     for s in dict.fromkeys(strata)}
  return out


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--input", required=True, help="JSONL of SFT records (messages, or prompt/response)")
  parser.add_argument("--output", required=True, help="JSONL of the selected records (and <output>.report.json)")
  parser.add_argument("--model", required=True, help="scoring model: Hugging Face checkpoint directory with tokenizer")
  parser.add_argument("--config", help="a file from configs/curation/ defining get_config() -> QualityConfig")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field, e.g. --set keep_fraction=0.3 --set stratum_field=category")


def load_config(args: argparse.Namespace) -> QualityConfig:
  return load_typed_config(args.config, QualityConfig, overrides=args.set, default=QualityConfig())


def run_cli(args: argparse.Namespace) -> CurationReport:
  config = load_config(args)
  report = select_file(args.input, args.output, config, QualityModel(args.model, config),
                       progress=not getattr(args, "no_progress", True))
  report.details["model"] = str(args.model)
  return report
