"""Packed training rows from sampled ids: the RL trainer sees exactly what the engine produced.

Each sample (prompt ids + response ids) becomes one segment of a row. With
`tokens` the whole sequence and `targets` the next token within the segment,
position j scores token j + 1, so the response tokens are the targets at
positions len(prompt) - 1 ... len(prompt) + len(response) - 2; only those carry
loss, the sample's advantage and the engine's log-probs. The engine's expert ids
(one per token fed, prompt and response) go to `replay_experts` `[B, T, L_moe, k]`
(rows first, so micro-batching and batch sharding split them like the rest; the
loss transposes them for `forward`).

Rows are filled first-fit by decreasing length; the row count is rounded up to
one of eight steps per power of two (and a multiple of `rows_multiple`), so a run
compiles a few shapes, not one per step, and pads at most an eighth of the rows.
"""

from __future__ import annotations

import numpy as np

from recipe_jax.stages.rollouts import Sample

FIELDS = ("tokens", "targets", "loss_mask", "segment_ids", "positions", "advantages", "sampler_logprobs")


def num_rows(needed: int, rows_multiple: int) -> int:
  """`needed` rounded up to a multiple of max(rows_multiple, an eighth of the largest power of two
  <= needed): at most eight shapes per doubling of the batch, and at most 1/8 of the rows padding
  (beyond `rows_multiple`)."""
  step = max(rows_multiple, (1 << (max(needed, 1).bit_length() - 1)) // 8)
  step = -(-step // rows_multiple) * rows_multiple
  return max(-(-needed // step) * step, rows_multiple)


def assign_rows(lengths: list[int], seq_len: int, max_segments: int) -> list[list[int]]:
  """First-fit decreasing: lists of sample indices per row, each row's total <= seq_len."""
  rows: list[list[int]] = []
  free: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    if lengths[i] > seq_len:
      raise ValueError(f"a sample of {lengths[i]} tokens does not fit seq_len {seq_len}; raise seq_len to "
                       "at least max_prompt_len + max_new_tokens")
    for r, room in enumerate(free):
      if lengths[i] <= room and len(rows[r]) < max_segments:
        rows[r].append(i)
        free[r] -= lengths[i]
        break
    else:
      rows.append([i])
      free.append(seq_len - lengths[i])
  return rows


def pack_samples(samples: list[Sample], *, seq_len: int, rows_multiple: int = 1, max_segments: int = 64,
                 replay_shape: tuple[int, int] | None = None) -> tuple[dict[str, np.ndarray], list[list[int]]]:
  """Rows holding all `samples` (callers leave out those without `train`), and the layout:
  the sample indices of each row, in segment order. `replay_shape=(L_moe, k)` adds
  `replay_experts`."""
  lengths = [len(s.prompt_ids) + len(s.token_ids) for s in samples]
  layout = assign_rows(lengths, seq_len, max_segments)
  b = num_rows(len(layout), rows_multiple)
  out = {name: np.zeros((b, seq_len), np.float32 if name in ("loss_mask", "advantages", "sampler_logprobs")
                        else np.int32) for name in FIELDS}
  if replay_shape is not None:
    out["replay_experts"] = np.zeros((b, seq_len, *replay_shape), np.int16)  # int32 in the loss
  for r, members in enumerate(layout):
    start = 0
    for seg, i in enumerate(members, start=1):
      s, n = samples[i], lengths[i]
      ids = np.asarray(s.prompt_ids + s.token_ids, np.int32)
      p, t = len(s.prompt_ids), len(s.token_ids)
      span = slice(start, start + n)
      out["tokens"][r, span] = ids
      out["targets"][r, start:start + n - 1] = ids[1:]
      out["segment_ids"][r, span] = seg
      out["positions"][r, span] = np.arange(n)
      scored = slice(start + p - 1, start + p - 1 + t)
      out["loss_mask"][r, scored] = 1.0
      out["advantages"][r, scored] = s.advantage
      out["sampler_logprobs"][r, scored] = s.sampler_logprobs
      if replay_shape is not None:
        if s.expert_ids is None:
          raise ValueError("routing replay is on but the engine returned no expert ids (a dense model?)")
        out["replay_experts"][r, span] = np.transpose(s.expert_ids, (1, 0, 2))
      start += n
  return out, layout


def segment_sums(values: np.ndarray, mask: np.ndarray, segment_ids: np.ndarray,
                 layout: list[list[int]]) -> np.ndarray:
  """Per sample (in `pack_samples` order) the sum of `values * mask` over its segment."""
  total = sum(len(m) for m in layout)
  out = np.zeros(total, np.float64)
  for r, members in enumerate(layout):
    for seg, i in enumerate(members, start=1):
      out[i] = float(np.sum((values[r] * mask[r])[segment_ids[r] == seg]))
  return out


def mini_batches(samples: list[Sample], num_mini_batches: int) -> list[list[Sample]]:
  """Splits a step's samples into `num_mini_batches` contiguous parts of (nearly) equal size."""
  if num_mini_batches < 1:
    raise ValueError(f"num_mini_batches must be >= 1, got {num_mini_batches}")
  bounds = np.linspace(0, len(samples), num_mini_batches + 1).round().astype(int)
  return [samples[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
