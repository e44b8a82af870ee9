"""The attention benchmark's CPU smoke run: every variant runs, agrees with XLA, and is tabulated."""

import pytest

from recipe_jax.bench import attention


def test_attention_benchmark_smoke_run():
  rows = attention.run(device="cpu", seq_lens=(48,), heads=2, kv_heads=1, head_dim=16, dtype="float32",
                       repeats=1)
  assert [r["variant"] for r in rows] == ["pallas (interpret)", "xla"]
  for r in rows:
    assert "error" not in r, r
    assert r["fwd_tflops"] > 0 and r["fwd_bwd_tflops"] > 0 and r["fwd_bwd_GiB"] > 0
  assert rows[0]["max_abs_diff_vs_xla"] < 1e-5
  table = attention.format_table(rows + [{"seq_len": 65536, "variant": "xla", "error": "XlaRuntimeError: OOM"}])
  assert "| 48 | pallas (interpret) |" in table and "| 48 | xla |" in table
  assert "| 65536 | xla | XlaRuntimeError: OOM |" in table


def test_gpu_run_refuses_a_host_without_one():
  with pytest.raises(SystemExit, match="--device gpu but JAX runs on cpu"):
    attention.main(["--device", "gpu"])


def test_causal_flops():
  assert attention.attention_flops(1, 4096, 32, 128, backward=False) == 2 * 4096**2 * 32 * 128
  assert attention.attention_flops(1, 4096, 32, 128, backward=True) == 3.5 * 2 * 4096**2 * 32 * 128
