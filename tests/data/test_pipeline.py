"""The SFT pipeline end to end: every record accounted for, mixtures, hosts, resume, global arrays."""

import json

import jax
import numpy as np
import pytest

from recipe_jax.data.errors import MAX_EXAMPLES, DropRecord, RecordFailedError
from recipe_jax.data.pipeline import PipelineConfig, SftPipeline, Source, global_batch
from recipe_jax.data.sources import JsonlSource
from recipe_jax.parallel.mesh import make_mesh

T = 32
STRIDE = 1000  # record i of source s renders ids (s * SOURCE + i) * STRIDE + 1, ...
SOURCE = 10_000


def _records(n, seed=0, max_len=T + 8):
  lengths = np.random.default_rng(seed).integers(2, max_len, size=n)
  return [{"n": int(x)} for x in lengths]


def _example_fn(record, source, index):
  if "n" not in record:
    raise DropRecord("no_length", f"record has fields {sorted(record)}")
  base = ({"a": 0, "b": 1}.get(source, 0) * SOURCE + index) * STRIDE
  return {"ids": base + 1 + np.arange(record["n"]), "loss_mask": np.ones(record["n"], bool)}


def _config(**kw):
  kw = {"seq_len": T, "batch_size": 4, "read_threads": 2, "read_buffer": 8, **kw}
  return PipelineConfig(**kw)


def _segment_keys(batches):
  """(source index, record index) of every packed segment, in output order."""
  keys = []
  for b in batches:
    for row in range(len(b["tokens"])):
      seg = b["segment_ids"][row]
      for s in np.unique(seg[seg > 0]):
        first = int(b["tokens"][row][seg == s][0]) // STRIDE
        keys.append(divmod(first, SOURCE))
  return keys


@pytest.mark.parametrize("packing", ["first_fit", "best_fit"])
def test_one_epoch_accounts_for_every_record_and_token(packing):
  records = _records(120)
  pipe = SftPipeline(Source("a", records), _example_fn,
                     _config(num_epochs=1, packing=packing))
  batches = list(pipe)
  assert all(b["tokens"].shape == (4, T) for b in batches)
  report = pipe.report()
  too_long = sorted(i for i, r in enumerate(records) if r["n"] > T)
  assert report.dropped == {"a": {"over_length": len(too_long)}} and too_long
  named = [i for i, _ in report.examples["a/over_length"]]
  assert set(named) <= set(too_long) and len(named) == min(len(too_long), MAX_EXAMPLES)
  assert report.num_kept + report.num_dropped == len(records)
  keys = _segment_keys(batches)
  assert sorted(i for _, i in keys) == sorted(set(range(len(records))) - set(too_long))
  packed_tokens = sum(int(np.count_nonzero(b["segment_ids"])) for b in batches)
  assert packed_tokens == report.kept_tokens["a"] == sum(
      r["n"] for r in records if r["n"] <= T)


def test_bad_records_are_dropped_counted_and_named(tmp_path):
  lines = [json.dumps({"n": 5}), "{not json", json.dumps({"n": 6}), json.dumps({"m": 1}),
           json.dumps([1]), json.dumps({"n": "x"}), json.dumps({"n": 7}), "{trailing"]
  path = tmp_path / "data.jsonl"
  path.write_text("\n".join(lines) + "\n")
  # In file order, so the last record read is a bad one: it must be counted too.
  pipe = SftPipeline(Source("a", JsonlSource(path)), _example_fn,
                     _config(num_epochs=1, shuffle=False))
  batches = list(pipe)
  report = pipe.report()
  assert report.kept == {"a": 3}
  assert report.dropped == {"a": {"invalid_json": 2, "no_length": 1, "not_an_object": 1,
                                  "error:TypeError": 1}}
  assert [i for i, _ in report.examples["a/invalid_json"]] == [1, 7]
  assert f"{path}:2" in report.examples["a/invalid_json"][0][1]
  assert report.examples["a/no_length"] == [[3, "record has fields ['m']"]]
  assert report.examples["a/error:TypeError"][0][0] == 5
  assert sorted(i for _, i in _segment_keys(batches)) == [0, 2, 6]


def test_strict_mode_raises_naming_source_and_record():
  records = [{"n": 4}, {"n": "x"}, {"n": 4}]
  pipe = SftPipeline(Source("a", records), _example_fn,
                     _config(num_epochs=1, strict=True, shuffle=False))
  with pytest.raises(RecordFailedError, match="record 1 of source 'a' failed with TypeError"):
    list(pipe)


def test_a_pipeline_that_drops_everything_stops_with_the_report():
  pipe = SftPipeline(Source("a", [{"m": 1}] * 4), _example_fn,
                     _config(max_consecutive_drops=50))
  with pytest.raises(RuntimeError, match="50 records in a row.*no_length=50"):
    next(pipe)


def test_mixture_follows_weights():
  a, b = _records(200, seed=1, max_len=T), _records(200, seed=2, max_len=T)
  pipe = SftPipeline([Source("a", a, 3.0), Source("b", b, 1.0)], _example_fn,
                     _config(batch_size=8))
  keys = _segment_keys(next(pipe) for _ in range(30))
  share_a = sum(s == 0 for s, _ in keys) / len(keys)
  assert abs(share_a - 0.75) < 0.05, share_a


def test_epochs_are_reshuffled_and_complete():
  records = _records(40, max_len=T)
  pipe = SftPipeline(Source("a", records), _example_fn,
                     _config(num_epochs=2, num_packing_bins=1, shuffle_bins=False, seed=5))
  order = [i for _, i in _segment_keys(pipe)]
  first, second = order[:40], order[40:]
  assert sorted(first) == sorted(second) == list(range(40))
  assert first != second and first != sorted(first)


def test_hosts_read_disjoint_slices_that_cover_the_source():
  records = _records(50, max_len=T)
  per_host = []
  for host in range(3):
    pipe = SftPipeline(Source("a", records), _example_fn,
                       _config(num_epochs=1, process_index=host, process_count=3))
    per_host.append({i for _, i in _segment_keys(pipe)})
  assert sum(len(h) for h in per_host) == len(set().union(*per_host)) == len(records)
  assert per_host[1] == set(range(1, 50, 3))


@pytest.mark.parametrize("packing,prefetch", [("first_fit", 0), ("best_fit", 0), ("best_fit", 2)])
def test_resume_from_state_gives_identical_batches_and_report(packing, prefetch):
  a, b = _records(90, seed=3), _records(60, seed=4)
  a[7] = {"m": 0}  # one more drop reason besides over-length

  def make():
    return SftPipeline([Source("a", a, 2.0), Source("b", b, 1.0)], _example_fn,
                       _config(packing=packing, num_packing_bins=6, seed=11,
                               prefetch_batches=prefetch))

  pipe = make()
  for _ in range(5):
    next(pipe)
  state = json.loads(json.dumps(pipe.get_state()))
  report_at_save = pipe.report()
  expected = [next(pipe) for _ in range(12)]  # crosses epochs of both sources
  report_after = pipe.report()

  resumed = make()
  resumed.set_state(state)
  assert resumed.report() == report_at_save
  got = [next(resumed) for _ in range(12)]
  for want, have in zip(expected, got):
    assert want.keys() == have.keys()
    for k in want:
      assert want[k].dtype == have[k].dtype and np.array_equal(want[k], have[k]), k
  assert resumed.report() == report_after
  assert report_after.num_kept > report_at_save.num_kept


def test_state_from_other_settings_is_refused():
  records = _records(20)
  state = SftPipeline(Source("a", records), _example_fn, _config()).get_state()
  other = SftPipeline(Source("a", records), _example_fn, _config(seq_len=64))
  with pytest.raises(ValueError, match="seq_len: saved 32, now 64"):
    other.set_state(state)


@pytest.mark.parametrize("shape", [(2, 2, 2, 1), (1, 2, 1, 4)])
def test_global_batch_shards_rows_over_batch_axes(shape):
  mesh = make_mesh(shape)
  rows = 8
  pipe = SftPipeline(Source("a", _records(60, max_len=T)), _example_fn, _config(batch_size=rows))
  batch = next(pipe)
  arrays = global_batch(batch, mesh)
  batch_shards = shape[0] * shape[1] * shape[2]
  for k, v in arrays.items():
    assert v.shape == (rows, T) and v.dtype == batch[k].dtype
    np.testing.assert_array_equal(np.asarray(v), batch[k])
    assert v.sharding.spec[0] == ("data", "fsdp", "expert")
    shard_rows = {s.data.shape[0] for s in v.addressable_shards}
    assert shard_rows == {rows // batch_shards}
  assert len(jax.devices()) == 8


def test_global_batch_refuses_rows_that_do_not_split():
  mesh = make_mesh((2, 2, 2, 1))
  batch = {"tokens": np.zeros((6, T), np.int32)}
  with pytest.raises(ValueError, match="6 rows"):
    global_batch(batch, mesh)
