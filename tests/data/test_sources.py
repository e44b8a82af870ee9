"""Record sources read back what was written, name bad records, and survive pickling."""

import json
import pickle
import sys
import types

import numpy as np
import pytest

from recipe_jax.data import sources
from recipe_jax.data.errors import MalformedRecord

RECORDS = [
    {"messages": [{"role": "user", "content": f"question {i}"},
                  {"role": "assistant", "content": "é" * i}],
     "id": i}
    for i in range(7)
]


def _write_jsonl(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return path


def test_jsonl_reads_every_record_across_files_and_skips_blank_lines(tmp_path):
  a = _write_jsonl(tmp_path / "a.jsonl", [json.dumps(r) for r in RECORDS[:4]] + ["", "  "])
  b = _write_jsonl(tmp_path / "b.jsonl", [""] + [json.dumps(r) for r in RECORDS[4:]])
  src = sources.JsonlSource([a, b])
  assert len(src) == len(RECORDS)
  assert [src[i] for i in range(len(src))] == RECORDS
  assert src.where(4) == f"{b}:2"  # first record of b.jsonl sits on its line 2
  with pytest.raises(IndexError, match="out of range"):
    src[len(RECORDS)]


def test_jsonl_malformed_lines_name_file_and_line(tmp_path):
  path = _write_jsonl(tmp_path / "bad.jsonl",
                      [json.dumps(RECORDS[0]), '{"messages": [', "[1, 2]", json.dumps(RECORDS[1])])
  src = sources.JsonlSource(path)
  assert src[0] == RECORDS[0] and src[3] == RECORDS[1]
  with pytest.raises(MalformedRecord, match=f"{path}:2") as bad_json:
    src[1]
  assert bad_json.value.reason == "invalid_json"
  with pytest.raises(MalformedRecord, match=f"{path}:3.*list") as not_object:
    src[2]
  assert not_object.value.reason == "not_an_object"


def test_jsonl_invalid_utf8_is_malformed(tmp_path):
  path = tmp_path / "bytes.jsonl"
  path.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
  src = sources.JsonlSource(path)
  with pytest.raises(MalformedRecord) as e:
    src[1]
  assert e.value.reason == "invalid_json"


def test_jsonl_pickles_and_reads_after(tmp_path):
  src = sources.JsonlSource(_write_jsonl(tmp_path / "a.jsonl", [json.dumps(r) for r in RECORDS]))
  assert src[2] == RECORDS[2]  # opens a file descriptor, which must not travel
  copy = pickle.loads(pickle.dumps(src))
  assert [copy[i] for i in reversed(range(len(copy)))] == RECORDS[::-1]


def test_missing_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    sources.JsonlSource(tmp_path / "nope.jsonl")


def test_parquet_random_access_over_row_groups_and_files(tmp_path):
  pa = pytest.importorskip("pyarrow")
  pq = pytest.importorskip("pyarrow.parquet")
  paths = []
  for name, part in (("a", RECORDS[:5]), ("b", RECORDS[5:])):
    paths.append(tmp_path / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(part), paths[-1], row_group_size=2)
  src = sources.ParquetSource(paths, cache_row_groups=1)
  assert len(src) == len(RECORDS)
  order = np.random.default_rng(0).permutation(len(RECORDS))
  assert [src[int(i)] for i in order] == [RECORDS[i] for i in order]
  assert pickle.loads(pickle.dumps(src))[6] == RECORDS[6]
  only_id = sources.ParquetSource(paths, columns=["id"])
  assert only_id[3] == {"id": 3}


def test_array_record_reads_json_and_names_undecodable_records(tmp_path):
  writer_module = pytest.importorskip("array_record.python.array_record_module")
  path = str(tmp_path / "data.array_record")
  writer = writer_module.ArrayRecordWriter(path, "group_size:1")
  for r in RECORDS:
    writer.write(json.dumps(r).encode())
  writer.write(b"\xff not json")
  writer.close()
  src = sources.ArrayRecordSource(path)
  assert len(src) == len(RECORDS) + 1
  assert [src[i] for i in range(len(RECORDS))] == RECORDS
  with pytest.raises(MalformedRecord, match=f"record {len(RECORDS)}") as e:
    src[len(RECORDS)]
  assert e.value.reason == "undecodable"
  assert pickle.loads(pickle.dumps(src))[1] == RECORDS[1]


def test_tfds_missing_package_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes the import fail
  with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
    sources.tfds_source("my_sft_data", split="train")


def test_tfds_records_are_decoded_to_python(monkeypatch):
  # A stand-in for tfds.data_source: TFDS returns bytes for text and NumPy scalars.
  stored = [{"text": b"caf\xc3\xa9", "turns": np.array([b"a", b"b"], dtype=object),
             "n": np.int64(3)}, {"text": b"\xff"}]
  calls = []

  def data_source(name, *, split, data_dir):
    calls.append((name, split, data_dir))
    return stored

  monkeypatch.setitem(sys.modules, "tensorflow_datasets",
                      types.SimpleNamespace(data_source=data_source))
  src = sources.tfds_source("my_sft_data", split="train[:2]")
  assert calls == [("my_sft_data", "train[:2]", None)]
  assert len(src) == 2
  assert src[0] == {"text": "café", "turns": ["a", "b"], "n": 3}
  with pytest.raises(MalformedRecord, match="my_sft_data/train"):
    src[1]
