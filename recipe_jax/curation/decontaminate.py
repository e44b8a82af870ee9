"""Decontamination of training sets against evaluation sets by word 8-gram overlap.

The definition is Tülu 3's (Lambert et al. 2024, "Tülu 3: Pushing Frontiers in Open
Language Model Post-Training", arXiv:2411.15124, prompt decontamination), applied as is:

- A test token *matches* a training instance when the two share an 8-gram containing it.
- A test instance *overlaps* a training instance when more than half of its tokens
  (`overlap_threshold`, 0.5: exactly half is not an overlap) match that one instance.
- A training set is *contaminated* with respect to an evaluation set when more than 2%
  (`contamination_threshold`: exactly 2% is not) of the evaluation instances overlap some
  instance of the training set.
- An instance shorter than 8 tokens has no 8-gram, so it never matches.

Tokens (`words`): the maximal runs of Unicode word characters (letters, digits, `_`) of the
lower-cased text; whitespace, punctuation and symbols only separate words. "Don't stop!"
is ["don", "t", "stop"], "x^2+1=0" is ["x", "2", "1", "0"]. Measured on prompts by default.

Memory is bounded by the evaluation side. `EvalIndex` maps the hash of every evaluation
8-gram to its postings (evaluation instance, start position); a training instance is
tokenized, its 8-grams looked up, and for each evaluation instance it touches the set of
matched start positions is kept only while that instance is processed. Keys are Python's
64-bit hashes of the word tuples, so two different 8-grams share a key with probability
about 2^-64 per pair (nothing else is approximate). The index takes about 100 bytes per
evaluation 8-gram (`python -m recipe_jax.bench curation`: 10K instances, 330K 8-grams,
32 MiB). The output is each training set with
every instance that overlaps some evaluation instance removed (reason "overlaps:<eval set>",
the first evaluation set, in the order given, that it overlaps).

  reports = decontaminate(["sft.jsonl"], ["gsm8k_test.jsonl", "ifeval.jsonl"], "clean/")
  recipe-jax data decontaminate --train sft.jsonl --eval gsm8k_test.jsonl ifeval.jsonl --output-dir clean/
"""

from __future__ import annotations

import argparse
import math
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from fractions import Fraction

from recipe_jax.curation.records import (MAX_EXAMPLES, CurationError, CurationReport, field_text,
                                         read_jsonl, write_jsonl)

_WORD = re.compile(r"\w+")
# For ASCII text the same tokens, three times faster: every ASCII non-word character becomes a space.
_ASCII_NON_WORD = str.maketrans({c: " " for c in map(chr, range(128))
                                 if not (c.isascii() and (c.isalnum() or c == "_"))})
# A posting packs (eval instance, start position) into one int, (instance + 1) << 32 | start,
# never 0; a gram with one posting stores that int, a gram with several a list of them.
_START_BITS = 32
_START_MASK = (1 << _START_BITS) - 1


def words(text: str) -> list[str]:
  """The word tokens of `text`: runs of letters, digits and `_` (regex `\\w+`), lower-cased."""
  text = text.lower()
  if text.isascii():
    return text.translate(_ASCII_NON_WORD).split()
  return _WORD.findall(text)


def exact_fraction(x: float) -> Fraction:
  """`x` as the decimal it was written as (0.02 -> 1/50), so thresholds compare exactly."""
  return Fraction(repr(float(x)))


def _gram_keys(tokens: Sequence[str], n: int) -> Iterator[int]:
  return map(hash, zip(*(tokens[k:] for k in range(n))))


def covered_tokens(starts: Iterable[int], n: int) -> int:
  """How many positions the n-grams starting at `starts` cover together."""
  covered = reach = 0
  for start in sorted(starts):
    end = start + n
    if end > reach:
      covered += end - max(start, reach)
      reach = end
  return covered


class EvalIndex:
  """The evaluation side: n-gram postings plus each instance's length and overlap bar.

  `build({name: [(line, text), ...]})` indexes every evaluation set; `match(text)` gives the
  matched token count of each evaluation instance a training text touches.
  """

  def __init__(self, *, n: int = 8, overlap_threshold: float = 0.5):
    if n < 1:
      raise CurationError(f"n-gram length must be positive, got {n}")
    if not 0 <= overlap_threshold < 1:
      raise CurationError(f"overlap threshold must be in [0, 1), got {overlap_threshold}")
    self.n = n
    self.overlap_threshold = overlap_threshold
    self._bar = exact_fraction(overlap_threshold)
    self.set_names: list[str] = []
    self.set_sizes: list[int] = []    # instances read per set, short ones included
    self.set_short: list[int] = []    # instances under n tokens (they never match)
    self.instance_set: list[int] = []   # per indexed instance: its set
    self.instance_line: list[int] = []  # its line number in the set's file
    self.instance_length: list[int] = []
    self.instance_needed: list[int] = []  # the fewest matched tokens that are an overlap
    self._postings: dict[int, int | list[int]] = {}

  @classmethod
  def build(cls, eval_sets: Mapping[str, Iterable[tuple[int, str]]], *, n: int = 8,
            overlap_threshold: float = 0.5) -> EvalIndex:
    index = cls(n=n, overlap_threshold=overlap_threshold)
    for name, instances in eval_sets.items():
      index.add_set(name, instances)
    return index

  def add_set(self, name: str, instances: Iterable[tuple[int, str]]) -> None:
    """Indexes one evaluation set given as `(line number, text)` pairs."""
    if name in self.set_names:
      raise CurationError(f"two evaluation sets are named {name!r}")
    set_id = len(self.set_names)
    self.set_names.append(name)
    self.set_sizes.append(0)
    self.set_short.append(0)
    postings = self._postings
    for line, text in instances:
      self.set_sizes[set_id] += 1
      tokens = words(text)
      if len(tokens) < self.n:
        self.set_short[set_id] += 1
        continue
      instance = len(self.instance_length)
      self.instance_set.append(set_id)
      self.instance_line.append(line)
      self.instance_length.append(len(tokens))
      self.instance_needed.append(math.floor(self._bar * len(tokens)) + 1)
      base = (instance + 1) << _START_BITS
      for start, key in enumerate(_gram_keys(tokens, self.n)):
        posting = postings.get(key)
        if posting is None:
          postings[key] = base | start
        elif isinstance(posting, int):
          postings[key] = [posting, base | start]
        else:
          posting.append(base | start)

  @property
  def num_grams(self) -> int:
    return len(self._postings)

  def matched_starts(self, tokens: Sequence[str]) -> dict[int, set[int]]:
    """For each evaluation instance sharing an n-gram with `tokens`: the shared grams' start positions."""
    starts: dict[int, set[int]] = {}
    if len(tokens) < self.n:
      return starts
    for posting in filter(None, map(self._postings.get, _gram_keys(tokens, self.n))):
      for packed in (posting,) if isinstance(posting, int) else posting:
        instance = (packed >> _START_BITS) - 1
        found = starts.get(instance)
        if found is None:
          starts[instance] = {packed & _START_MASK}
        else:
          found.add(packed & _START_MASK)
    return starts

  def overlapping(self, tokens: Sequence[str]) -> list[int]:
    """The evaluation instances (ids, ascending) that this training instance overlaps."""
    n, needed = self.n, self.instance_needed
    hits = []
    for instance, starts in self.matched_starts(tokens).items():
      bar = needed[instance]
      if len(starts) * n >= bar and covered_tokens(starts, n) >= bar:
        hits.append(instance)
    return sorted(hits)

  def match(self, text: str) -> dict[tuple[str, int], int]:
    """`{(eval set, eval line): matched token count}` for every evaluation instance `text` touches."""
    return {(self.set_names[self.instance_set[i]], self.instance_line[i]): covered_tokens(s, self.n)
            for i, s in self.matched_starts(words(text)).items()}


def texts(path: pathlib.Path, field: str, report: CurationReport, *,
          progress: bool = False) -> Iterator[tuple[int, dict, str]]:
  """`(line, record, text)` for each usable record; a missing or non-text field is counted as malformed."""
  usable = 0
  for line, record in read_jsonl(path, report, progress=progress):
    try:
      text = field_text(record, field)
    except KeyError:
      report.bad(f"missing_field:{field}", (str(path), line))
      continue
    except TypeError:
      report.bad(f"not_text:{field}", (str(path), line))
      continue
    usable += 1
    yield line, record, text
  if usable == 0:
    raise CurationError(f"{path}: no record has a text field {field!r}")


def _set_names(paths: Sequence[pathlib.Path], what: str) -> list[str]:
  names = [p.stem for p in paths]
  for name in names:
    if names.count(name) > 1:
      raise CurationError(f"two {what} files are named {name!r}; rename one (sets are named by file stem)")
  return names


def decontaminate(train_paths: Sequence[str | pathlib.Path], eval_paths: Sequence[str | pathlib.Path],
                  output_dir: str | pathlib.Path, *, train_field: str = "prompt", eval_field: str = "prompt",
                  n: int = 8, overlap_threshold: float = 0.5, contamination_threshold: float = 0.02,
                  progress: bool = False) -> list[CurationReport]:
  """Writes `output_dir/<train file name>` (and its `.report.json`) for every training set; returns the reports.

  Each report's `details["eval_sets"][name]` holds, for that (training set, evaluation set)
  pair: the evaluation instances read, how many overlap some training instance and what
  fraction that is, whether the training set is contaminated, how many training instances
  were removed for it, and up to MAX_EXAMPLES (train line, eval line) overlap pairs.
  """
  train_paths = [pathlib.Path(p) for p in train_paths]
  eval_paths = [pathlib.Path(p) for p in eval_paths]
  if not train_paths or not eval_paths:
    raise CurationError("decontamination needs at least one training file and one evaluation file")
  if not 0 <= contamination_threshold < 1:
    raise CurationError(f"contamination threshold must be in [0, 1), got {contamination_threshold}")
  output_dir = pathlib.Path(output_dir)
  outputs = [output_dir / p.name for p in train_paths]
  _set_names(train_paths, "training")
  for path, out in zip(train_paths, outputs):
    if out.resolve() == path.resolve():
      raise CurationError(f"{out}: the output would overwrite its input; choose another --output-dir")

  index = EvalIndex(n=n, overlap_threshold=overlap_threshold)
  eval_reports = []
  for name, path in zip(_set_names(eval_paths, "evaluation"), eval_paths):
    eval_report = CurationReport("decontaminate:eval", inputs=[path])
    index.add_set(name, ((line, text) for line, _, text in texts(path, eval_field, eval_report, progress=progress)))
    eval_reports.append(eval_report)

  settings = {"train_field": train_field, "eval_field": eval_field, "n": n, "overlap_threshold": overlap_threshold,
              "contamination_threshold": contamination_threshold}
  eval_summary = [{"path": str(path), "malformed": dict(r.malformed), "malformed_examples": dict(r.examples)}
                  for path, r in zip(eval_paths, eval_reports)]
  bar = exact_fraction(contamination_threshold)
  reports = []
  for path, out in zip(train_paths, outputs):
    report = _decontaminate_set(path, out, index, train_field=train_field, progress=progress)
    eval_sets = report.details.pop("eval_sets")
    for set_id, stats in enumerate(eval_sets.values()):
      stats["contaminated"] = Fraction(stats["overlapping"], stats["instances"]) > bar
      stats.update(eval_summary[set_id])
    report.details.update({"output": str(out), **settings, "train_tokens": report.details.pop("train_tokens"),
                           "eval_sets": eval_sets})
    report.write(out.with_suffix(".report.json"))
    reports.append(report)
  return reports


def _decontaminate_set(path: pathlib.Path, out: pathlib.Path, index: EvalIndex, *, train_field: str,
                       progress: bool) -> CurationReport:
  """Streams one training set through the index into `out`; per evaluation set: overlaps, removals, pairs."""
  report = CurationReport("decontaminate", inputs=[path])
  overlapping: list[set[int]] = [set() for _ in index.set_names]
  removed = [0] * len(index.set_names)
  pairs: list[list[list[int]]] = [[] for _ in index.set_names]
  tokens_read = 0

  def kept() -> Iterator[dict]:
    nonlocal tokens_read
    for line, record, text in texts(path, train_field, report, progress=progress):
      tokens = words(text)
      tokens_read += len(tokens)
      hits = index.overlapping(tokens)
      if not hits:
        yield record
        continue
      first_set = index.instance_set[hits[0]]
      report.remove(f"overlaps:{index.set_names[first_set]}", (str(path), line))
      removed[first_set] += 1
      for instance in hits:
        set_id = index.instance_set[instance]
        overlapping[set_id].add(instance)
        if len(pairs[set_id]) < MAX_EXAMPLES:
          pairs[set_id].append([line, index.instance_line[instance]])

  _write_atomically(kept(), out, report)
  report.details["train_tokens"] = tokens_read
  report.details["eval_sets"] = {
      name: {"instances": index.set_sizes[i], "shorter_than_n": index.set_short[i],
             "overlapping": len(overlapping[i]), "fraction": len(overlapping[i]) / index.set_sizes[i],
             "removed_training_instances": removed[i], "pairs": pairs[i]}
      for i, name in enumerate(index.set_names)}
  return report


def _write_atomically(records: Iterable[dict], out: pathlib.Path, report: CurationReport) -> None:
  """Writes to `<out>.partial` and renames it, so a failed run leaves no half-written output."""
  partial = out.with_name(out.name + ".partial")
  try:
    write_jsonl(records, partial, report)
  except BaseException:
    partial.unlink(missing_ok=True)
    raise
  partial.replace(out)


def contamination_table(reports: Sequence[CurationReport]) -> str:
  """A markdown table: one row per (training set, evaluation set)."""
  lines = ["| training set | evaluation set | overlapping | of | fraction | contaminated | removed |",
           "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
  for report in reports:
    for name, s in report.details["eval_sets"].items():
      lines.append(f"| {report.inputs[0]} | {name} | {s['overlapping']} | {s['instances']} | "
                   f"{s['fraction']:.2%} | {'yes' if s['contaminated'] else 'no'} | "
                   f"{s['removed_training_instances']} |")
  return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--train", nargs="+", required=True, metavar="JSONL",
                      help="training sets, one file each (output keeps the file name)")
  parser.add_argument("--eval", nargs="+", required=True, metavar="JSONL",
                      help="evaluation sets, one file each, named by file stem")
  parser.add_argument("--output-dir", required=True, help="where the decontaminated training sets go")
  parser.add_argument("--field", default="prompt", help="text field on both sides (default: prompt; "
                      "'response', a dotted path, or a messages list also work)")
  parser.add_argument("--train-field", help="text field of the training records (default: --field)")
  parser.add_argument("--eval-field", help="text field of the evaluation records (default: --field)")
  parser.add_argument("--ngram", type=int, default=8, help="word n-gram length (default 8)")
  parser.add_argument("--overlap-threshold", type=float, default=0.5,
                      help="an eval instance overlaps when MORE than this fraction of its tokens match (0.5)")
  parser.add_argument("--contamination-threshold", type=float, default=0.02,
                      help="a training set is contaminated when MORE than this fraction of an "
                      "evaluation set overlaps (0.02)")


def run_cli(args: argparse.Namespace) -> list[CurationReport]:
  reports = decontaminate(
      args.train, args.eval, args.output_dir, train_field=args.train_field or args.field,
      eval_field=args.eval_field or args.field, n=args.ngram, overlap_threshold=args.overlap_threshold,
      contamination_threshold=args.contamination_threshold, progress=not getattr(args, "no_progress", False))
  print(contamination_table(reports))
  return reports
