"""Dedup removes exact, near and leaked records by its documented rules and verifies similarity exactly."""

import json
import random

import numpy as np
import pytest

from recipe_jax.curation.dedup import (LeakageIndex, MinHashLSH, dedup, exact_key, lsh_bands, normalize,
                                       similarity, word_ngrams)
from recipe_jax.curation.records import CurationError


def write(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return path


def read(path):
  return [json.loads(x) for x in path.read_text().splitlines()]


def text_of(rng, n=100):
  return " ".join(f"w{rng.randrange(100000)}" for _ in range(n))


def test_normalization_and_exact_key():
  assert normalize("  Hello\t\nWORLD  ") == "hello world"
  assert exact_key("Hello   World") == exact_key("hello world\n") != exact_key("hello  worlds")


def test_lsh_bands_reach_the_recall_at_the_threshold():
  bands, rows = lsh_bands(0.8, 64)
  assert (bands, rows) == (12, 5)
  assert 1 - (1 - 0.8 ** rows) ** bands >= 0.99
  assert 1 - (1 - 0.8 ** (rows + 1)) ** (64 // (rows + 1)) < 0.99   # one more row would miss it


def test_minhash_agreement_estimates_jaccard():
  rng = random.Random(0)
  lsh = MinHashLSH(ngram=5, lsh_threshold=0.8, num_perm=256, seed=3)
  base = text_of(rng, 400).split()
  changed = list(base)
  for i in range(0, 400, 20):
    changed[i] = "zz"
  a, b = " ".join(base), " ".join(changed)
  exact = similarity(word_ngrams(a, 5), word_ngrams(b, 5), "jaccard")
  sa, sb = (lsh.signature(lsh.gram_hashes(t)) for t in (a, b))
  assert abs(float(np.mean(sa == sb)) - exact) < 0.1
  again = MinHashLSH(ngram=5, lsh_threshold=0.8, num_perm=256, seed=3)
  assert np.array_equal(again.signature(again.gram_hashes(a)), sa)   # deterministic


def test_exact_duplicates_keep_the_first_and_name_it(tmp_path):
  a = write(tmp_path / "a.jsonl", [{"prompt": "Sort the LIST.", "id": 1}, {"prompt": "other", "id": 2}])
  b = write(tmp_path / "b.jsonl", [{"prompt": "  sort the list. ", "id": 3}, {"prompt": "Sort the list!", "id": 4}])
  report = dedup([a, b], tmp_path / "out.jsonl", near=False)
  assert [r["id"] for r in read(tmp_path / "out.jsonl")] == [1, 2, 4]
  assert report.removed == {"exact_duplicate": 1}
  assert report.examples["exact_duplicate"] == [{"path": str(b), "line": 1, "duplicate_of": [str(a), 1]}]
  assert json.loads((tmp_path / "out.report.json").read_text())["kept"] == 3


def test_near_duplicates_follow_the_exact_jaccard_threshold(tmp_path):
  rng = random.Random(1)
  base = text_of(rng).split()
  variants = []
  for changes in (1, 2, 3, 4, 6, 10):   # one changed word removes up to 5 of the 96 five-grams
    words = list(base)
    for i in rng.sample(range(100), changes):
      words[i] = f"new{i}"
    variants.append(" ".join(words))
  records = [{"prompt": " ".join(base)}] + [{"prompt": v} for v in variants] + [{"prompt": text_of(rng)}]
  path = write(tmp_path / "in.jsonl", records)
  report = dedup([path], tmp_path / "out.jsonl")
  kept_texts = [r["prompt"] for r in read(tmp_path / "out.jsonl")]
  first = word_ngrams(" ".join(base), 5)
  for variant in variants:   # compared with the kept records before it; the base is the closest
    scores = [similarity(word_ngrams(variant, 5), word_ngrams(k, 5), "jaccard") for k in kept_texts
              if records.index({"prompt": k}) < records.index({"prompt": variant})]
    assert (variant in kept_texts) == (max(scores) < 0.8)
  assert any(similarity(word_ngrams(v, 5), first, "jaccard") < 0.8 for v in variants)   # both sides occur
  assert any(similarity(word_ngrams(v, 5), first, "jaccard") >= 0.8 for v in variants)
  assert report.removed["near_duplicate"] == len(records) - len(kept_texts)
  example = report.examples["near_duplicate"][0]
  assert example["duplicate_of"] == [str(path), 1] and example["jaccard"] >= 0.8
  assert report.details["near"]["candidates_verified"] >= report.removed["near_duplicate"]


def test_containment_catches_a_record_inside_a_kept_one(tmp_path):
  rng = random.Random(2)
  long_text = text_of(rng, 120)
  inner = " ".join(long_text.split()[:100])   # with 2 extra words: Jaccard 96/118, containment 96/98
  path = write(tmp_path / "in.jsonl", [{"prompt": long_text}, {"prompt": inner + " extra words"}])
  assert dedup([path], tmp_path / "j.jsonl", near_threshold=0.9).kept == 2
  report = dedup([path], tmp_path / "c.jsonl", near_threshold=0.9, metric="containment")
  assert report.kept == 1 and report.examples["near_duplicate"][0]["containment"] >= 0.9


def test_leakage_by_prefix_and_by_character_windows(tmp_path):
  rng = random.Random(3)
  boiler = "The first line of the input contains a single integer t, the number of test cases."
  problem = "Given an array of n integers, find the longest strictly increasing run. " + text_of(rng, 40)
  ev = write(tmp_path / "lcb.jsonl", [{"question": problem + " " + boiler}])
  train = write(tmp_path / "train.jsonl", [
      {"prompt": problem.upper() + "  " + boiler},                       # same statement: prefix hash
      {"prompt": "Story time. " + problem + " Output the answer."},       # shifted copy: 60-char windows
      {"prompt": text_of(rng, 60) + " " + boiler},                       # shares only the boilerplate
      {"prompt": "completely unrelated"}])
  report = dedup([train], tmp_path / "out.jsonl", leakage_evals=[ev], leakage_field="question")
  assert report.removed == {"leak_prefix:lcb": 1, "leak_ngram:lcb": 1}
  assert [e["line"] for e in (report.examples["leak_prefix:lcb"] + report.examples["leak_ngram:lcb"])] == [1, 2]
  assert report.kept == 2 and report.details["leakage_eval_sets"]["lcb"]["instances"] == 1
  strict = dedup([train], tmp_path / "strict.jsonl", leakage_evals=[ev], leakage_field="question",
                 window_fraction=0.0)   # any shared window leaks: the boilerplate one too
  assert strict.removed == {"leak_prefix:lcb": 1, "leak_ngram:lcb": 2}


def test_leakage_index_short_texts_need_equality():
  index = LeakageIndex(prefix_chars=200)
  index.add_set("ev", ["Add two numbers."])
  assert index.check("add  two NUMBERS.") == "leak_prefix:ev"
  assert index.check("Add two numbers. Then subtract them.") is None


def test_malformed_and_unusable_inputs(tmp_path):
  path = write(tmp_path / "in.jsonl", [{"prompt": "a"}, "nope", {"x": 1}, {"prompt": ["bad"]}, {"prompt": "A"}])
  report = dedup([path], tmp_path / "out.jsonl")
  assert report.malformed == {"invalid_json": 1, "missing_field:prompt": 1, "not_text:prompt": 1}
  assert report.examples["missing_field:prompt"] == [(str(path), 3)]
  assert report.removed == {"exact_duplicate": 1} and report.kept == 1
  assert report.read == report.kept + report.num_removed + report.num_malformed
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(CurationError, match="empty"):
    dedup([empty], tmp_path / "e.jsonl")
  assert not (tmp_path / "e.jsonl").exists()
  with pytest.raises(CurationError, match="overwrite"):
    dedup([path], path)
  with pytest.raises(CurationError, match="metric"):
    dedup([path], tmp_path / "m.jsonl", metric="cosine")
