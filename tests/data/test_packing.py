"""Packing invariants with Grain's first-fit and best-fit packers."""

import grain
import numpy as np
import pytest

from recipe_jax.data import packing

T = 32
STRIDE = 1000  # example j holds ids j * STRIDE + 1, j * STRIDE + 2, ...: its tokens name it


def _examples(lengths, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for j, n in enumerate(lengths):
    mask = rng.random(n) < 0.7
    out.append(packing.next_token_example(j * STRIDE + 1 + np.arange(n), mask))
  return out


def _pack(examples, method, bins=4, shuffle_bins=True):
  ds = grain.MapDataset.source(examples).to_iter_dataset()
  return list(packing.pack(ds, seq_len=T, num_packing_bins=bins, method=method,
                           seed=3, shuffle_bins=shuffle_bins))


def _segments(row):
  """Per segment id: (tokens, targets, loss_mask, positions) of that segment."""
  seg = row["segment_ids"]
  used = int(np.count_nonzero(seg))
  assert np.all(seg[:used] > 0) and np.all(seg[used:] == 0), "padding only at the end"
  ids = seg[:used]
  assert ids[0] == 1 and np.all(np.diff(ids) >= 0) and np.all(np.diff(ids) <= 1), (
      "segment ids start at 1 and each segment is one contiguous run")
  return {s: tuple(row[k][seg == s] for k in ("tokens", "targets", "loss_mask", "positions"))
          for s in np.unique(ids)}


def test_next_token_example_shifts_targets_and_mask():
  ex = packing.next_token_example([5, 6, 7, 8], [False, False, True, True])
  np.testing.assert_array_equal(ex["tokens"], [5, 6, 7, 8])
  np.testing.assert_array_equal(ex["targets"], [6, 7, 8, 0])
  np.testing.assert_array_equal(ex["loss_mask"], [False, True, True, False])
  assert ex["tokens"].dtype == np.int32 and ex["targets"].dtype == np.int32


@pytest.mark.parametrize("bad", [([[1, 2]], [[True, True]]), ([1, 2], [True]),
                                 ([1.5, 2.0], [True, True]), ([-1, 2], [True, True])])
def test_next_token_example_rejects_bad_input(bad):
  with pytest.raises(ValueError):
    packing.next_token_example(*bad)


@pytest.mark.parametrize("method", ["first_fit", "best_fit"])
def test_packed_rows_keep_every_token_in_contiguous_segments(method):
  lengths = np.random.default_rng(1).integers(1, T + 1, size=60)
  examples = _examples(lengths)
  rows = _pack(examples, method)
  seen = []
  for row in rows:
    assert set(row) == set(packing.ROW_FIELDS)
    assert all(v.shape == (T,) for v in row.values())
    assert row["tokens"].dtype == np.int32 and row["segment_ids"].dtype == np.int32
    assert row["positions"].dtype == np.int32 and row["loss_mask"].dtype == bool
    pad = row["segment_ids"] == 0
    assert not row["tokens"][pad].any() and not row["targets"][pad].any()
    assert not row["loss_mask"][pad].any() and not row["positions"][pad].any()
    for tokens, targets, mask, positions in _segments(row).values():
      np.testing.assert_array_equal(positions, np.arange(len(tokens)))  # restart at 0
      np.testing.assert_array_equal(targets[:-1], tokens[1:])  # next token, same segment
      assert targets[-1] == 0 and not mask[-1]  # nothing predicted past the segment
      seen.append(int(tokens[0]) // STRIDE)
      ex = examples[seen[-1]]
      np.testing.assert_array_equal(tokens, ex["tokens"])
      np.testing.assert_array_equal(mask, ex["loss_mask"])
  assert sorted(seen) == list(range(len(examples)))  # each example exactly once
  assert sum(int(np.count_nonzero(r["segment_ids"])) for r in rows) == lengths.sum()


def test_grain_raises_on_over_length_examples():
  """Why the pipeline drops over-length records before packing."""
  with pytest.raises(ValueError, match="max length"):
    _pack(_examples([T + 1]), "first_fit")


@pytest.mark.parametrize("seed", range(3))
def test_best_fit_packs_at_least_as_densely_as_first_fit(seed):
  rng = np.random.default_rng(seed)
  # Many short records and some long ones, as in chat data.
  lengths = np.clip(rng.lognormal(np.log(8), 0.8, size=300).astype(int), 2, T)
  examples = _examples(lengths, seed)
  first = _pack(examples, "first_fit", bins=16)
  best = _pack(examples, "best_fit", bins=16)
  used = lengths.sum()
  assert sum(np.count_nonzero(r["segment_ids"]) for r in best) == used
  assert len(best) <= len(first)
  assert used / (len(best) * T) >= used / (len(first) * T)


def test_unshuffled_single_bin_keeps_input_order():
  examples = _examples([10, 10, 10, 20, 5])
  rows = _pack(examples, "first_fit", bins=1, shuffle_bins=False)
  firsts = [[int(s[0][0]) // STRIDE for s in _segments(r).values()] for r in rows]
  assert firsts == [[0, 1, 2], [3, 4]]


def test_pad_rows_adds_padding_rows_only():
  batch = {"tokens": np.ones((2, 4), np.int32), "loss_mask": np.ones((2, 4), bool)}
  padded = packing.pad_rows(batch, 3)
  assert padded["tokens"].shape == (3, 4) and padded["loss_mask"].dtype == bool
  assert not padded["tokens"][2].any() and not padded["loss_mask"][2].any()
  assert packing.pad_rows(batch, 2) is batch
