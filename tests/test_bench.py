"""Benchmarks run (tiny sizes) and report the chunked path using less memory."""

from recipe_jax.bench import logprobs


def test_logprobs_benchmark_chunked_uses_less_memory():
  rows = logprobs.run(seq_len=256, width=32, vocab=4096, chunk=32, repeats=1)
  full, chunked = rows
  assert chunked["temp_GiB"] < full["temp_GiB"] / 2
