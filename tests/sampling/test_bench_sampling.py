"""The sampling benchmark runs at tiny sizes: finite positive rates, equal token counts, and the
one-request-at-a-time loop gives the driver's greedy tokens. Tunix's side runs only where it imports."""

import math

import pytest

from recipe_jax.bench import sampling
from recipe_jax.models import get_preset


def test_sampling_benchmark_reports_both_of_our_loops():
  result = sampling.run(presets=("tiny-moe",), prompts=3, min_prompt=2, max_prompt=9, new_tokens=4, slots=2,
                        repeats=1, tunix=sampling.tunix_unavailable() is None)
  ours = [r for r in result["rows"] if r["implementation"].startswith("recipe_jax")]
  assert [r["implementation"] for r in ours] == ["recipe_jax driver (2 slots)", "recipe_jax one request at a time"]
  for row in result["rows"]:
    assert row["preset"] == "tiny-moe" and row["tokens"] == 3 * 4
    assert math.isfinite(row["tokens_per_second"]) and row["tokens_per_second"] > 0
  assert ours[1]["greedy_agreement"] == 1.0
  report = sampling.format_report(result)
  assert "| tiny-moe | recipe_jax driver (2 slots) | 12 |" in report
  if result["skipped"] is not None:
    assert f"tunix skipped: {result['skipped']}" in report
  else:
    assert len(result["rows"]) == 3


def test_prompts_avoid_tunix_padding_and_bad_lengths_are_refused():
  cfg = get_preset("tiny-dense")
  prompts = sampling.make_prompts(cfg, 20, 1, 5, seed=3)
  assert all(1 <= len(p) <= 5 for p in prompts)
  assert all(1 <= t < cfg.vocab_size for p in prompts for t in p)
  assert prompts == sampling.make_prompts(cfg, 20, 1, 5, seed=3)
  with pytest.raises(ValueError, match="min_len <= max_len"):
    sampling.make_prompts(cfg, 2, 6, 5)


def test_id_tokenizer_round_trips_and_never_ends_early():
  tok = sampling.IdTokenizer(256)
  assert tok.encode(tok.decode([5, 0, 255])) == [5, 0, 255]
  assert tok.eos_id() == 256 and tok.bos_id() == 0 == tok.pad_id()
