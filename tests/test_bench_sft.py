"""The SFT throughput benchmark runs (our side, tiny sizes) and reports positive, finite figures."""

import math

from recipe_jax.bench import sft


def test_sft_benchmark_reports_positive_finite_throughput():
  cfg = sft.tiny_qwen3(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                       head_dim=16, vocab_size=128)
  result = sft.run(batch=2, seq_len=32, steps=2, warmup=1, peak_size=128, peak_chain=2, tunix=False, cfg=cfg)
  assert result["header"]["peak_flops_per_second"] > 0
  (row,) = result["rows"]
  for key in ("tokens_per_second", "flops_per_second", "fraction_of_peak"):
    assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
  report = sft.format_report(result)
  assert "| recipe_jax |" in report and "tunix skipped" in report


def test_synthetic_batch_supervises_next_token_within_documents():
  cfg = sft.tiny_qwen3(vocab_size=128)
  b = sft.synthetic_batch(cfg, 2, 8, segments=2)
  assert b["segment_ids"][0].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]
  assert b["positions"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
  assert b["loss_mask"][0].tolist() == [1, 1, 1, 0, 1, 1, 1, 0]
  assert b["targets"][0, :3].tolist() == b["tokens"][0, 1:4].tolist()
