"""Deduplication (exact and near) and a leakage check against evaluation sets.

Records stream through three filters in this order; the first one that fires names the
removal reason, and only surviving records join the kept set later records are compared to.

1. Leakage (`LeakageIndex`, Rufus-Air's coding-RL rule: "exact prefix hash and character
   60-gram overlap"). Texts are normalized (`normalize`: lower-cased, whitespace runs
   collapsed to one space, stripped). "leak_prefix:<eval>" when the SHA-256 of the first
   `prefix_chars` (default 200) normalized characters equals an evaluation instance's (a
   text shorter than that is hashed whole, so a short statement leaks only when equal).
   "leak_ngram:<eval>" when the record shares character `window_chars`-grams (default 60)
   with one evaluation instance and the shared windows are at least `window_fraction`
   (default 0.5) of the smaller of the two window sets; 0 means any shared window. The
   fraction keeps boilerplate sentences common to many problem statements ("The first line
   contains a single integer t ...") from counting as leaks. A window shared by several
   evaluation instances is credited to the first of them.
2. Exact duplicates: SHA-256 of the normalized text (Rufus-Air's rule); the first copy is
   kept, later ones are removed as "exact_duplicate" with the line they repeat.
3. Near duplicates: word n-gram sets (default 5-grams, the words of
   `decontaminate.words`; a text shorter than n words is one gram) compared by Jaccard
   |A∩B|/|A∪B| or containment |A∩B|/|A| (A: the later record) against the kept records;
   similarity >= `threshold` (default 0.8) is "near_duplicate". Candidates come from
   MinHash-LSH (`MinHashLSH`, numpy, fixed seed) and are verified exactly: the candidate's
   text is read back from its file (byte offsets are indexed up front) and both n-gram
   sets are compared, so no similarity is estimated. LSH bands are picked so a pair at the
   threshold is a candidate with probability >= 0.99; for containment the bands target the
   Jaccard c/(2-c) of two equal-length texts, so a short record contained in a much longer
   kept one can be missed.

Memory: per kept record its SHA-256 digest, `bands` LSH bucket entries and its location,
about 1.1 KB at 64 permutations (tracemalloc on 5,000 records: 1M kept take ~1.1 GB); 8
bytes per input line for the offsets; and the evaluation side's prefix hashes and window
hashes (about 70 bytes per evaluation character, measured). Never the kept texts.

  recipe-jax data dedup --input a.jsonl b.jsonl --output out.jsonl --leakage-eval lcb_v6.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from recipe_jax.curation.decontaminate import _set_names, _write_atomically, exact_fraction, texts, words
from recipe_jax.curation.records import CurationError, CurationReport, field_text

_MASK32 = np.uint64(0xFFFFFFFF)


def _splitmix64(z: np.ndarray) -> np.ndarray:
  """The splitmix64 output mix (Steele, Lea and Flood 2014), elementwise on uint64; products wrap."""
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def normalize(text: str) -> str:
  """Lower-cased, whitespace runs collapsed to one space, ends stripped."""
  return " ".join(text.lower().split())


def exact_key(text: str) -> bytes:
  return hashlib.sha256(normalize(text).encode()).digest()


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
  """The set of word n-grams (a text of fewer than n words is one gram; no words, no grams)."""
  tokens = words(text)
  if len(tokens) < n:
    return {tuple(tokens)} if tokens else set()
  return set(zip(*(tokens[k:] for k in range(n))))


def similarity(new: set, kept: set, metric: str) -> float:
  shared = len(new & kept)
  if metric == "containment":
    return shared / len(new) if new else 0.0
  union = len(new | kept)
  return shared / union if union else 0.0


def lsh_bands(threshold: float, num_perm: int, recall: float = 0.99) -> tuple[int, int]:
  """(bands, rows): the most rows per band for which a pair at `threshold` is a candidate with prob >= recall."""
  for rows in range(num_perm, 0, -1):
    bands = num_perm // rows
    if 1 - (1 - threshold ** rows) ** bands >= recall:
      return bands, rows
  return num_perm, 1


class MinHashLSH:
  """MinHash signatures of word n-gram sets, bucketed by bands; ids are ints given by the caller."""

  def __init__(self, *, ngram: int, lsh_threshold: float, num_perm: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    self.ngram = ngram
    self._seeds = rng.integers(0, 1 << 64, size=(num_perm, 1), dtype=np.uint64, endpoint=False)
    self.bands, self.rows = lsh_bands(lsh_threshold, num_perm)
    self._row_weights = rng.integers(1, 1 << 63, size=self.rows, dtype=np.uint64) | np.uint64(1)
    self._buckets: list[dict[int, int | list[int]]] = [{} for _ in range(self.bands)]

  def gram_hashes(self, text: str) -> np.ndarray:
    """Distinct 32-bit hashes of the word n-grams (CRC-32 of each word, combined polynomially)."""
    tokens = words(text)
    if not tokens:
      return np.zeros(0, np.uint64)
    word_hash = np.fromiter((zlib.crc32(w.encode()) for w in tokens), np.uint64, len(tokens))
    n = min(self.ngram, len(tokens))
    grams = np.zeros(len(tokens) - n + 1, np.uint64)
    for k in range(n):
      grams = (grams * np.uint64(1000003) + word_hash[k:len(tokens) - n + 1 + k]) & _MASK32
    return np.unique(grams)

  def signature(self, hashes: np.ndarray) -> np.ndarray:
    """Per permutation i: min over grams h of splitmix64(h + seed_i), a strong 64-bit mixer.

    (A linear (a h + b) mod p family with 32-bit a and h reduces only a few bits and its
    permutations come out correlated: the Jaccard estimate was off by 0.2 at 256 of them.)
    """
    sig = np.full(self._seeds.shape[0], np.iinfo(np.uint64).max, np.uint64)
    for lo in range(0, len(hashes), 4096):
      np.minimum(sig, _splitmix64(hashes[None, lo:lo + 4096] + self._seeds).min(axis=1), out=sig)
    return sig

  def band_keys(self, sig: np.ndarray) -> list[int]:
    """One 64-bit key per band: the band's rows combined polynomially (wrapping), deterministic."""
    bands = sig[:self.bands * self.rows].reshape(self.bands, self.rows)
    return (bands * self._row_weights).sum(axis=1, dtype=np.uint64).tolist()

  def candidates(self, sig: np.ndarray) -> list[int]:
    found: set[int] = set()
    for bucket, key in zip(self._buckets, self.band_keys(sig)):
      ids = bucket.get(key)
      if ids is None:
        continue
      if isinstance(ids, int):
        found.add(ids)
      else:
        found.update(ids)
    return sorted(found)

  def insert(self, record_id: int, sig: np.ndarray) -> None:
    for bucket, key in zip(self._buckets, self.band_keys(sig)):
      ids = bucket.get(key)
      if ids is None:
        bucket[key] = record_id  # most buckets hold one record: an int, not a list
      elif isinstance(ids, int):
        bucket[key] = [ids, record_id]
      else:
        ids.append(record_id)


class LeakageIndex:
  """Prefix hashes and character-window hashes of evaluation instances (see the module docstring)."""

  def __init__(self, *, prefix_chars: int = 200, window_chars: int = 60, window_fraction: float = 0.5):
    if prefix_chars < 1 or window_chars < 1 or not 0 <= window_fraction <= 1:
      raise CurationError(f"bad leakage settings: prefix_chars={prefix_chars}, window_chars={window_chars}, "
                          f"window_fraction={window_fraction}")
    self.prefix_chars, self.window_chars = prefix_chars, window_chars
    self._fraction = exact_fraction(window_fraction)
    self.set_names: list[str] = []
    self.set_sizes: list[int] = []
    self._instance_set: list[int] = []
    self._instance_windows: list[int] = []
    self._prefixes: dict[bytes, int] = {}
    self._windows: dict[int, int] = {}

  def _window_hashes(self, normalized: str) -> set[int]:
    w = self.window_chars
    return {hash(normalized[i:i + w]) for i in range(len(normalized) - w + 1)}

  def _prefix_key(self, normalized: str) -> bytes:
    return hashlib.sha256(normalized[:self.prefix_chars].encode()).digest()

  def add_set(self, name: str, instances: Iterable[str]) -> None:
    set_id = len(self.set_names)
    self.set_names.append(name)
    self.set_sizes.append(0)
    for text in instances:
      self.set_sizes[set_id] += 1
      normalized = normalize(text)
      instance = len(self._instance_set)
      self._instance_set.append(set_id)
      self._prefixes.setdefault(self._prefix_key(normalized), instance)
      windows = self._window_hashes(normalized)
      self._instance_windows.append(len(windows))
      for h in windows:
        self._windows.setdefault(h, instance)

  def check(self, text: str) -> str | None:
    """The leakage reason for `text` ("leak_prefix:<eval>" / "leak_ngram:<eval>"), or None."""
    normalized = normalize(text)
    instance = self._prefixes.get(self._prefix_key(normalized))
    if instance is not None:
      return f"leak_prefix:{self.set_names[self._instance_set[instance]]}"
    windows = self._window_hashes(normalized)
    shared: dict[int, int] = {}
    for instance in filter(lambda i: i is not None, map(self._windows.get, windows)):
      shared[instance] = shared.get(instance, 0) + 1
    for instance, count in sorted(shared.items(), key=lambda kv: (-kv[1], kv[0])):
      if count >= self._fraction * min(len(windows), self._instance_windows[instance]):
        return f"leak_ngram:{self.set_names[self._instance_set[instance]]}"
    return None


class _LineReader:
  """Reads a given line of an input file back by byte offset (offsets indexed up front: 8 bytes a line)."""

  def __init__(self, paths: Sequence[pathlib.Path]):
    self.paths = list(paths)
    self.offsets: list[array] = []
    for path in self.paths:
      offsets, position = array("q"), 0
      if path.is_file():
        with path.open("rb") as f:
          for raw in f:
            offsets.append(position)
            position += len(raw)
      self.offsets.append(offsets)
    self._files: dict[int, object] = {}

  def record(self, file_index: int, line: int) -> dict:
    f = self._files.get(file_index)
    if f is None:
      f = self._files[file_index] = self.paths[file_index].open("rb")
    f.seek(self.offsets[file_index][line - 1])
    return json.loads(f.readline())

  def close(self) -> None:
    for f in self._files.values():
      f.close()


class KeptSet:
  """The records kept so far: exact digests, MinHash-LSH buckets, and where each one sits in the inputs."""

  def __init__(self, paths: Sequence[pathlib.Path], *, field: str, near: bool, metric: str, threshold: float,
               ngram: int, num_perm: int, seed: int):
    self.paths, self.field, self.metric, self.ngram = paths, field, metric, ngram
    self._bar = exact_fraction(threshold)
    lsh_threshold = threshold if metric == "jaccard" else threshold / (2 - threshold)
    self.lsh = MinHashLSH(ngram=ngram, lsh_threshold=lsh_threshold, num_perm=num_perm, seed=seed) if near else None
    self._reader = _LineReader(paths) if near else None
    self._digests: dict[bytes, int] = {}
    self._file, self._line = array("i"), array("q")
    self.candidates_verified = 0

  def location(self, kept_id: int) -> list:
    return [str(self.paths[self._file[kept_id]]), self._line[kept_id]]

  def exact_duplicate_of(self, digest: bytes) -> list | None:
    kept_id = self._digests.get(digest)
    return None if kept_id is None else self.location(kept_id)

  def near_duplicate_of(self, text: str) -> tuple[np.ndarray | None, tuple[list, float] | None]:
    """(the text's signature, (location, similarity) of the first kept record at or over the threshold)."""
    if self.lsh is None:
      return None, None
    hashes = self.lsh.gram_hashes(text)
    if not len(hashes):
      return None, None
    sig, grams = self.lsh.signature(hashes), None
    for candidate in self.lsh.candidates(sig):
      self.candidates_verified += 1
      grams = grams if grams is not None else word_ngrams(text, self.ngram)
      other = field_text(self._reader.record(self._file[candidate], self._line[candidate]), self.field)
      score = similarity(grams, word_ngrams(other, self.ngram), self.metric)
      if score >= self._bar:
        return sig, (self.location(candidate), score)
    return sig, None

  def add(self, digest: bytes, sig: np.ndarray | None, file_index: int, line: int) -> None:
    kept_id = len(self._file)
    self._file.append(file_index)
    self._line.append(line)
    self._digests[digest] = kept_id
    if sig is not None:
      self.lsh.insert(kept_id, sig)

  def close(self) -> None:
    if self._reader is not None:
      self._reader.close()


def dedup(input_paths: Sequence[str | pathlib.Path], output_path: str | pathlib.Path, *, field: str = "prompt",
          near: bool = True, near_threshold: float = 0.8, ngram: int = 5, metric: str = "jaccard",
          num_perm: int = 64, seed: int = 0, leakage_evals: Sequence[str | pathlib.Path] = (),
          leakage_field: str | None = None, prefix_chars: int = 200, window_chars: int = 60,
          window_fraction: float = 0.5, progress: bool = False) -> CurationReport:
  """Writes the inputs, in order, minus leaks and duplicates to `output_path` (plus its `.report.json`)."""
  paths = [pathlib.Path(p) for p in input_paths]
  output_path = pathlib.Path(output_path)
  if not paths:
    raise CurationError("dedup needs at least one input file")
  if any(output_path.resolve() == p.resolve() for p in paths):
    raise CurationError(f"{output_path}: the output would overwrite an input")
  if metric not in ("jaccard", "containment"):
    raise CurationError(f"near-duplicate metric must be 'jaccard' or 'containment', got {metric!r}")
  if not 0 < near_threshold <= 1 or ngram < 1 or num_perm < 1:
    raise CurationError(f"bad near-duplicate settings: threshold={near_threshold}, ngram={ngram}, "
                        f"num_perm={num_perm}")
  report = CurationReport("dedup", inputs=paths)
  leakage = _leakage_index(leakage_evals, leakage_field or field, report, prefix_chars=prefix_chars,
                           window_chars=window_chars, window_fraction=window_fraction) if leakage_evals else None
  kept = KeptSet(paths, field=field, near=near, metric=metric, threshold=near_threshold, ngram=ngram,
                 num_perm=num_perm, seed=seed)

  def kept_records() -> Iterator[dict]:
    for file_index, path in enumerate(paths):
      for line, record, text in texts(path, field, report, progress=progress):
        where = {"path": str(path), "line": line}
        if leakage is not None and (reason := leakage.check(text)):
          report.remove(reason, where)
          continue
        digest = exact_key(text)
        if (first := kept.exact_duplicate_of(digest)) is not None:
          report.remove("exact_duplicate", {**where, "duplicate_of": first})
          continue
        sig, near_duplicate = kept.near_duplicate_of(text)
        if near_duplicate is not None:
          report.remove("near_duplicate", {**where, "duplicate_of": near_duplicate[0],
                                           metric: round(near_duplicate[1], 4)})
          continue
        kept.add(digest, sig, file_index, line)
        yield record

  try:
    _write_atomically(kept_records(), output_path, report)
  finally:
    kept.close()
  lsh = kept.lsh
  report.details.update({
      "output": str(output_path), "field": field,
      "near": {"enabled": near, "metric": metric, "threshold": near_threshold, "ngram": ngram,
               "num_perm": num_perm, "bands": lsh.bands if lsh else None, "rows": lsh.rows if lsh else None,
               "seed": seed, "candidates_verified": kept.candidates_verified},
      "leakage": None if leakage is None else {"prefix_chars": prefix_chars, "window_chars": window_chars,
                                              "window_fraction": window_fraction,
                                              "field": leakage_field or field}})
  report.write(output_path.with_suffix(".report.json"))
  return report


def _leakage_index(eval_paths: Sequence[str | pathlib.Path], field: str, report: CurationReport,
                   **settings) -> LeakageIndex:
  """Indexes the evaluation sets; their sizes and malformed lines go to `report.details["leakage_eval_sets"]`."""
  leakage = LeakageIndex(**settings)
  eval_paths = [pathlib.Path(p) for p in eval_paths]
  summary = report.details["leakage_eval_sets"] = {}
  for name, path in zip(_set_names(eval_paths, "evaluation"), eval_paths):
    eval_report = CurationReport("dedup:eval", inputs=[path])
    leakage.add_set(name, (text for _, _, text in texts(path, field, eval_report)))
    summary[name] = {"path": str(path), "instances": leakage.set_sizes[-1], "malformed": eval_report.malformed}
  return leakage


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--input", nargs="+", required=True, metavar="JSONL", help="input files, read in order")
  parser.add_argument("--output", required=True, help="the deduplicated JSONL")
  parser.add_argument("--field", default="prompt", help="text field compared (default: prompt)")
  parser.add_argument("--no-near", action="store_true", help="exact duplicates only")
  parser.add_argument("--near-threshold", type=float, default=0.8, help="near-duplicate similarity >= this (0.8)")
  parser.add_argument("--near-metric", choices=("jaccard", "containment"), default="jaccard",
                      help="n-gram set similarity (default jaccard)")
  parser.add_argument("--ngram", type=int, default=5, help="word n-gram length for near duplicates (5)")
  parser.add_argument("--num-perm", type=int, default=64, help="MinHash permutations (64)")
  parser.add_argument("--seed", type=int, default=0, help="MinHash seed (0)")
  parser.add_argument("--leakage-eval", nargs="+", default=[], metavar="JSONL",
                      help="evaluation sets to check leakage against, named by file stem")
  parser.add_argument("--leakage-field", help="text field of the evaluation records (default: --field)")
  parser.add_argument("--prefix-chars", type=int, default=200, help="normalized prefix length hashed (200)")
  parser.add_argument("--window-chars", type=int, default=60, help="character n-gram length (60)")
  parser.add_argument("--window-fraction", type=float, default=0.5,
                      help="shared windows / the smaller window set that is a leak (0.5; 0 = any shared)")


def run_cli(args: argparse.Namespace) -> CurationReport:
  return dedup(args.input, args.output, field=args.field, near=not args.no_near,
               near_threshold=args.near_threshold, ngram=args.ngram, metric=args.near_metric,
               num_perm=args.num_perm, seed=args.seed, leakage_evals=args.leakage_eval,
               leakage_field=args.leakage_field, prefix_chars=args.prefix_chars,
               window_chars=args.window_chars, window_fraction=args.window_fraction,
               progress=not getattr(args, "no_progress", False))
