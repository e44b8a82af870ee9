"""Metrics: the FLOPs formula against a hand count, JSONL, TensorBoard events, progress bar, resume."""

import json
import pathlib
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event

from recipe_jax.metrics import JSONL_NAME, MetricsWriter, train_flops_per_token
from recipe_jax.models import get_preset

# ----------------------------------------------------------------------------
# FLOPs per token
# ----------------------------------------------------------------------------

# tiny-dense: V=256, D=64, F=128, L=2, N=4 query heads, K=2 kv heads, H=16, qk-norm, untied head.
_D, _V, _L, _N, _K, _H, _F = 64, 256, 2, 4, 2, 16, 128
_ATTN = _D * _N * _H + 2 * _D * _K * _H + _N * _H * _D  # q, k, v, o projections
_NORMS = 2 * _H + 2 * _D                                 # q/k norms, input and post-attention norms
_LM_HEAD = _V * _D


def test_flops_per_token_dense_by_hand():
  per_layer = _ATTN + _NORMS + 3 * _D * _F                # + gate, up, down
  non_embedding = _L * per_layer + _D                     # + final norm
  for t in (128, 1024):
    want = 6 * (non_embedding + _LM_HEAD) + 6 * _L * _N * _H * t  # causal attention: 12 L N H T / 2
    assert train_flops_per_token(get_preset("tiny-dense"), t) == want


def test_flops_per_token_moe_counts_active_experts_only():
  e, k, m = 8, 2, 32                                      # tiny-moe: 8 experts of width 32, top-2
  per_layer = _ATTN + _NORMS + _D * e + k * 3 * _D * m    # router + the two chosen experts
  non_embedding = _L * per_layer + _D
  want = 6 * (non_embedding + _LM_HEAD) + 6 * _L * _N * _H * 256
  assert train_flops_per_token(get_preset("tiny-moe"), 256) == want


def test_tied_head_still_counts_the_head_matmul():
  cfg = get_preset("tiny-dense")
  assert (train_flops_per_token(cfg.replace(tie_word_embeddings=True), 64)
          == train_flops_per_token(cfg, 64))


# ----------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------


def _read_events(path: pathlib.Path) -> list[Event]:
  """The events of one event file (TFRecords: length, its CRC, data, its CRC)."""
  data, i, events = path.read_bytes(), 0, []
  while i < len(data):
    (n,) = struct.unpack("<Q", data[i:i + 8])
    events.append(Event.FromString(data[i + 12:i + 12 + n]))
    i += 12 + n + 4
  return events


def _event_files(directory: pathlib.Path) -> list[pathlib.Path]:
  return sorted(directory.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)


def _scalars(events, tag):
  return [(e.step, v.simple_value) for e in events for v in e.summary.value if v.tag == tag]


def _jsonl(directory):
  return [json.loads(line) for line in (directory / JSONL_NAME).read_text().splitlines()]


def test_rows_derived_metrics_tensorboard_and_progress(tmp_path, capsys):
  # 1000 FLOPs/token, 512 tokens in 0.5 s: 1024 tokens/s, 1.024e6 FLOP/s, a quarter of 4.096e6.
  with MetricsWriter(tmp_path, peak_flops_per_second=4.096e6, flops_per_token=1000, total_steps=10) as w:
    for step in (1, 2, 3):
      row = w.write(step, {"loss": jnp.float32(2.5 / step), "learning_rate": np.float64(1e-4 * step),
                           "grad_norm": 0.5, "loss_tokens": jnp.int32(300)}, tokens=512, seconds=0.5)
      assert row["tokens_per_second"] == 1024.0
      assert row["flops_per_second"] == 1.024e6
      assert row["mfu"] == 0.25

  rows = _jsonl(tmp_path)
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert rows[1]["loss"] == float(np.float32(1.25)) and rows[2]["learning_rate"] == 1e-4 * 3
  assert rows[0]["loss_tokens"] == 300 and isinstance(rows[0]["loss_tokens"], int)
  assert rows[0]["mfu"] == 0.25 and rows[0]["step_seconds"] == 0.5 and "time" in rows[0]

  (events_file,) = _event_files(tmp_path)
  events = _read_events(events_file)
  assert _scalars(events, "loss") == [(1, 2.5), (2, 1.25), (3, pytest.approx(2.5 / 3))]
  assert _scalars(events, "mfu") == [(s, 0.25) for s in (1, 2, 3)]
  assert _scalars(events, "tokens_per_second") == [(s, 1024.0) for s in (1, 2, 3)]

  err = capsys.readouterr().err
  assert "3/10" in err and "mfu=25.0%" in err


def test_measures_seconds_when_not_given(tmp_path):
  with MetricsWriter(tmp_path, peak_flops_per_second=1e9, flops_per_token=10, total_steps=2,
                     progress=False, tensorboard=False) as w:
    row = w.write(1, {"loss": 1.0}, tokens=100)
  assert row["step_seconds"] > 0
  assert row["tokens_per_second"] == pytest.approx(100 / row["step_seconds"])
  assert row["mfu"] == pytest.approx(10 * 100 / row["step_seconds"] / 1e9)


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
  kw = dict(peak_flops_per_second=1e9, flops_per_token=10, total_steps=6, progress=False)
  with MetricsWriter(tmp_path, **kw) as w:
    for step in range(1, 6):
      w.write(step, {"loss": float(step)}, tokens=1, seconds=1.0)
  with open(tmp_path / JSONL_NAME, "a") as f:
    f.write('{"step": 6, "lo')  # a line torn by SIGKILL

  with MetricsWriter(tmp_path, start_step=3, **kw) as w:  # resumed from checkpoint 3
    for step in (4, 5):
      w.write(step, {"loss": 10.0 * step}, tokens=1, seconds=1.0)

  assert [(r["step"], r["loss"]) for r in _jsonl(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0),
                                                                 (5, 50.0)]
  # TensorBoard: the resumed file starts with a purge marker at step 4, then the redone steps.
  first, resumed = map(_read_events, _event_files(tmp_path))
  assert [s for s, _ in _scalars(first, "loss")] == [1, 2, 3, 4, 5]
  purges = [i for i, e in enumerate(resumed) if e.session_log.status == e.session_log.START]
  assert [resumed[i].step for i in purges] == [4]  # TensorBoard hides the old file's steps >= 4
  assert all(not e.summary.value for e in resumed[:purges[0]])
  assert _scalars(resumed, "loss") == [(4, 40.0), (5, 50.0)]


def test_rejects_non_scalars_and_disabled_writer_writes_nothing(tmp_path):
  with MetricsWriter(tmp_path / "a", peak_flops_per_second=1.0, flops_per_token=1.0, total_steps=1,
                     progress=False) as w:
    with pytest.raises(ValueError, match="'logits' has shape"):
      w.write(1, {"logits": np.zeros(3)})
  with MetricsWriter(tmp_path / "b", peak_flops_per_second=1.0, flops_per_token=1.0, total_steps=1,
                     enabled=False) as w:
    assert w.write(1, {"loss": 1.0}, tokens=2, seconds=1.0)["mfu"] == 2.0
  assert not (tmp_path / "b").exists()
