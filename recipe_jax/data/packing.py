"""Next-token examples and fixed-length packed rows, using Grain's bin packing.

One example is a token sequence `ids` of length L with a mask saying which
tokens are to be learned. `next_token_example` turns it into three aligned
arrays of length L:

    tokens[t]    = ids[t]                      (model input at position t)
    targets[t]   = ids[t + 1],   0 at t = L-1  (what position t predicts)
    loss_mask[t] = mask[t + 1],  0 at t = L-1  (whether that prediction counts)

So the caller's `mask` is aligned with `ids` ("this token is a completion
token"), and the packed `loss_mask` is aligned with `targets`: the loss at row
position t is `loss_mask[t] * -log p(targets[t] | tokens[..t] of its segment)`.
No prediction crosses a segment boundary, because the shift happens before
packing.

`pack` packs such examples into rows of exactly T tokens with Grain's
`FirstFitPackIterDataset` or `BestFitPackIterDataset`. Grain's conventions,
checked in tests: in a row, the k-th example packed there gets segment id k
(starting at 1); positions run 0, 1, ... within each example; padding cells are
0 in every field, so padding has segment id 0 and a zero loss mask. Grain emits
one field `<name>_segment_ids` / `<name>_positions` per packed field; they are
identical here, and `pack` keeps one copy as `segment_ids` / `positions`.
A row:

    tokens, targets, segment_ids, positions: int32 [T];  loss_mask: bool [T]

Grain reads examples into `num_packing_bins` open rows; when an example fits
none, all open rows are emitted (optionally shuffled) and a new window starts.
More bins pack more densely and read further ahead. Examples longer than T
must be removed first (the pipeline drops and counts them): Grain raises on
them.
"""

from __future__ import annotations

from typing import Literal

import grain
import numpy as np

PACKED_FIELDS = ("tokens", "targets", "loss_mask")
ROW_FIELDS = ("tokens", "targets", "loss_mask", "segment_ids", "positions")
PackingMethod = Literal["first_fit", "best_fit"]


def next_token_example(ids, loss_mask) -> dict[str, np.ndarray]:
  """`tokens`, `targets` and `loss_mask` of one sequence, shifted as in the module docstring.

  Args:
    ids: integer token ids [L], L >= 1.
    loss_mask: bool [L], True where the token at that position is to be learned.

  Returns:
    dict of int32 `tokens` [L], int32 `targets` [L], bool `loss_mask` [L].
  """
  ids = np.asarray(ids)
  mask = np.asarray(loss_mask)
  if ids.ndim != 1 or mask.shape != ids.shape:
    raise ValueError(f"ids and loss_mask must be 1-D of equal length, got shapes "
                     f"{ids.shape} and {mask.shape}")
  if ids.size and not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
  if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
    raise ValueError(f"ids must lie in [0, 2**31), got range [{ids.min()}, {ids.max()}]")
  tokens = ids.astype(np.int32)
  targets = np.zeros_like(tokens)
  targets[:-1] = tokens[1:]
  shifted = np.zeros(tokens.shape, bool)
  shifted[:-1] = mask[1:].astype(bool)
  return {"tokens": tokens, "targets": targets, "loss_mask": shifted}


def _to_row(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {
      "tokens": packed["tokens"],
      "targets": packed["targets"],
      "loss_mask": packed["loss_mask"],
      "segment_ids": packed["tokens_segment_ids"],
      "positions": packed["tokens_positions"],
  }


def pack(examples: grain.IterDataset, *, seq_len: int, num_packing_bins: int,
         method: PackingMethod = "best_fit", seed: int = 0,
         shuffle_bins: bool = True) -> grain.IterDataset:
  """Packs `next_token_example` dicts (extra keys are ignored) into rows of `seq_len`.

  Args:
    examples: IterDataset of dicts with `tokens`, `targets`, `loss_mask` [L],
      L <= seq_len.
    seq_len: T, the row length.
    num_packing_bins: rows filled at once (see module docstring).
    method: "first_fit" (first open row with room) or "best_fit" (the open
      row left fullest).
    seed: seed of the row shuffle inside each window.
    shuffle_bins: shuffle the rows of a window before emitting them.

  Returns:
    IterDataset of rows with `ROW_FIELDS`, each [seq_len].
  """
  if seq_len < 1 or num_packing_bins < 1:
    raise ValueError(f"seq_len and num_packing_bins must be >= 1, got {seq_len}, "
                     f"{num_packing_bins}")
  classes = {"first_fit": grain.experimental.FirstFitPackIterDataset,
             "best_fit": grain.experimental.BestFitPackIterDataset}
  if method not in classes:
    raise ValueError(f"packing method must be one of {sorted(classes)}, got {method!r}")
  packed = classes[method](
      examples,
      length_struct={k: seq_len for k in PACKED_FIELDS},
      num_packing_bins=num_packing_bins,
      seed=seed,
      shuffle_bins=shuffle_bins,
  )
  return packed.map(_to_row)


def pad_rows(batch: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
  """Pads a short final batch with all-padding rows (segment id 0, mask 0) to `batch_size`."""
  rows = len(batch["tokens"])
  if rows == batch_size:
    return batch
  return {k: np.concatenate([v, np.zeros((batch_size - rows,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}


def density(rows: dict[str, np.ndarray]) -> float:
  """Fraction of cells holding tokens (segment id > 0) in a batch of rows."""
  return float(np.mean(rows["segment_ids"] > 0))
