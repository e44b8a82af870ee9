"""Decontamination follows Tülu 3's definition exactly, at its edges, and accounts for every line."""

import json
import random
import re
import string

import pytest

from recipe_jax.curation.decontaminate import EvalIndex, covered_tokens, decontaminate, words
from recipe_jax.curation.records import CurationError


def seq(prefix: str, n: int, start: int = 0) -> list[str]:
  return [f"{prefix}{i}" for i in range(start, start + n)]


def write(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return path


def test_words_lowercases_and_splits_on_punctuation():
  assert words("Don't STOP!  x^2+1=0,\tsnake_case") == ["don", "t", "stop", "x", "2", "1", "0", "snake_case"]
  assert words("Café déjà-vu: naïve") == ["café", "déjà", "vu", "naïve"]  # the non-ASCII path


def test_ascii_fast_path_equals_the_regex():
  rng = random.Random(0)
  for _ in range(200):
    text = "".join(rng.choices(string.printable, k=rng.randint(0, 80)))
    assert words(text) == re.findall(r"\w+", text.lower())


def test_covered_tokens_is_the_union_of_gram_spans():
  assert covered_tokens([], 8) == 0
  assert covered_tokens([0], 8) == 8
  assert covered_tokens([0, 1, 2], 8) == 10
  assert covered_tokens([0, 20], 8) == 16
  assert covered_tokens([5, 0, 4], 8) == 13


def test_exactly_half_matched_is_not_an_overlap_one_more_token_is():
  index = EvalIndex.build({"ev": [(1, " ".join(seq("e", 20)))]})
  half = " ".join(["pad", *seq("e", 10), "pad"])       # 10 of 20 tokens match
  more = " ".join(["pad", *seq("e", 11), "pad"])       # 11 of 20
  assert index.match(half) == {("ev", 1): 10}
  assert index.overlapping(words(half)) == []
  assert index.match(more) == {("ev", 1): 11}
  assert index.overlapping(words(more)) == [0]
  odd = EvalIndex.build({"ev": [(1, " ".join(seq("e", 21)))]})   # more than 10.5 means 11
  assert odd.overlapping(words(" ".join(seq("e", 10)))) == []
  assert odd.overlapping(words(" ".join(seq("e", 11)))) == [0]


def test_matches_add_up_within_one_training_instance_only():
  index = EvalIndex.build({"ev": [(7, " ".join(seq("e", 30)))]})
  both = " ".join(seq("e", 8) + ["gap"] + seq("e", 8, start=22))   # 8 + 8 = 16 > 15
  assert index.match(both) == {("ev", 7): 16}
  assert index.overlapping(words(both)) == [0]
  assert index.overlapping(words(" ".join(seq("e", 8)))) == []      # each alone: 8 of 30
  assert index.overlapping(words(" ".join(seq("e", 8, start=22)))) == []


def test_instances_shorter_than_eight_tokens_never_match():
  short = " ".join(seq("s", 7))
  index = EvalIndex.build({"ev": [(1, short), (2, " ".join(seq("e", 9)))]})
  assert index.set_sizes == [2] and index.set_short == [1]
  assert index.match(short + " " + short) == {}
  assert index.match(" ".join(seq("e", 7))) == {}    # a 7-token training instance has no 8-gram
  assert index.match(" ".join(seq("e", 8))) == {("ev", 2): 8}


def test_matched_counts_equal_a_brute_force_transcription_of_the_definition():
  rng = random.Random(1)
  vocab = ["a", "b", "c"]  # tiny vocabulary: plenty of shared 8-grams
  evals = [(i, " ".join(rng.choices(vocab, k=rng.randint(5, 30)))) for i in range(30)]
  index = EvalIndex.build({"ev": evals})
  for _ in range(30):
    train = rng.choices(vocab, k=rng.randint(0, 40))
    train_grams = {tuple(train[i:i + 8]) for i in range(len(train) - 7)}
    expected = {}
    for line, text in evals:
      test = text.split()
      matched = sum(any(tuple(test[s:s + 8]) in train_grams for s in range(max(0, j - 7), j + 1)
                        if s + 8 <= len(test)) for j in range(len(test)))
      if matched:
        expected[("ev", line)] = matched
    assert index.match(" ".join(train)) == expected


def test_two_percent_is_clean_and_two_point_zero_one_percent_is_contaminated(tmp_path):
  eval_texts = [" ".join(f"t{i}x{k}" for k in range(8)) for i in range(10000)]
  write(tmp_path / "bench.jsonl", ({"prompt": t} for t in eval_texts))
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  write(tmp_path / "a" / "train.jsonl", [{"prompt": f"copy: {t}"} for t in eval_texts[:200]] +
        [{"prompt": "unrelated text"}])
  write(tmp_path / "b" / "other.jsonl", [{"prompt": t.upper()} for t in eval_texts[:201]])
  at_two, above = decontaminate([tmp_path / "a" / "train.jsonl", tmp_path / "b" / "other.jsonl"],
                                [tmp_path / "bench.jsonl"], tmp_path / "out", progress=False)
  s = at_two.details["eval_sets"]["bench"]
  assert (s["instances"], s["overlapping"], s["fraction"], s["contaminated"]) == (10000, 200, 0.02, False)
  s = above.details["eval_sets"]["bench"]
  assert (s["overlapping"], s["fraction"], s["contaminated"]) == (201, 0.0201, True)
  assert at_two.removed == {"overlaps:bench": 200} and at_two.kept == 1
  assert above.removed == {"overlaps:bench": 201} and above.kept == 0
  assert s["pairs"][:2] == [[1, 1], [2, 2]]
  kept = [json.loads(x) for x in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
  assert kept == [{"prompt": "unrelated text"}]
  written = json.loads((tmp_path / "out" / "train.report.json").read_text())
  assert written["eval_sets"]["bench"]["overlapping"] == 200 and written["train_tokens"] == 200 * 9 + 2


def test_several_evaluation_sets_and_first_set_names_the_reason(tmp_path):
  a, b = " ".join(seq("a", 16)), " ".join(seq("b", 16))
  write(tmp_path / "eva.jsonl", [{"prompt": a}, {"prompt": "filler words only here"}])
  write(tmp_path / "evb.jsonl", [{"prompt": b}])
  write(tmp_path / "train.jsonl", [{"prompt": b}, {"prompt": a + " " + b}, {"prompt": "clean"}])
  (report,) = decontaminate([tmp_path / "train.jsonl"], [tmp_path / "eva.jsonl", tmp_path / "evb.jsonl"],
                            tmp_path / "out")
  assert report.removed == {"overlaps:evb": 1, "overlaps:eva": 1} and report.kept == 1
  assert report.examples["overlaps:evb"] == [(str(tmp_path / "train.jsonl"), 1)]
  sets = report.details["eval_sets"]
  assert sets["eva"]["overlapping"] == 1 and sets["eva"]["fraction"] == 0.5 and sets["eva"]["contaminated"]
  assert sets["evb"]["overlapping"] == 1 and sets["evb"]["pairs"] == [[1, 1], [2, 1]]
  assert sets["evb"]["removed_training_instances"] == 1 and sets["eva"]["removed_training_instances"] == 1


def test_malformed_lines_are_counted_with_line_numbers(tmp_path):
  text = " ".join(seq("e", 12))
  write(tmp_path / "ev.jsonl", [{"question": text}, "{oops", {"other": 1}])
  train = write(tmp_path / "train.jsonl", [
      {"prompt": "fine"}, "not json", "[1, 2]", {"response": "no prompt"}, {"prompt": 5},
      {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}]}, ""])
  (report,) = decontaminate([train], [tmp_path / "ev.jsonl"], tmp_path / "out", eval_field="question")
  assert report.malformed == {"invalid_json": 1, "not_an_object": 1, "missing_field:prompt": 1,
                              "not_text:prompt": 1}
  assert report.examples["invalid_json"] == [(str(train), 2)]
  assert report.examples["missing_field:prompt"] == [(str(train), 4)]
  assert report.removed == {"overlaps:ev": 1} and report.examples["overlaps:ev"] == [(str(train), 6)]
  assert report.read == 6 == report.kept + report.num_removed + report.num_malformed
  eval_stats = report.details["eval_sets"]["ev"]
  assert eval_stats["instances"] == 1
  assert eval_stats["malformed"] == {"invalid_json": 1, "missing_field:question": 1}


def test_unusable_inputs_raise(tmp_path):
  good = write(tmp_path / "good.jsonl", [{"prompt": "some words"}])
  empty = tmp_path / "empty.jsonl"
  empty.write_text("")
  with pytest.raises(CurationError, match="empty"):
    decontaminate([empty], [good], tmp_path / "out")
  assert not (tmp_path / "out" / "empty.jsonl").exists()   # no half-written output
  with pytest.raises(CurationError, match="empty"):
    decontaminate([good], [empty], tmp_path / "out")
  with pytest.raises(CurationError, match="no record has a text field 'question'"):
    decontaminate([good], [good], tmp_path / "out", eval_field="question")
  with pytest.raises(CurationError, match="overwrite"):
    decontaminate([good], [good], tmp_path)
  with pytest.raises(CurationError, match="no such file"):
    decontaminate([tmp_path / "missing.jsonl"], [good], tmp_path / "out")
