"""The curation benchmark plants overlaps and near misses; decontamination finds exactly the overlaps."""

from recipe_jax.bench import curation


def test_curation_benchmark_finds_every_planted_overlap(tmp_path):
  r = curation.run(train_tokens=20_000, eval_instances=200, planted=6, workdir=tmp_path)
  assert r["train_tokens"] >= 20_000
  assert (r["planted"], r["found"], r["false_positives"]) == (6, 6, 0)   # near misses (floor(L/2) words): not found
  assert r["overlapping_eval"] == 6 and r["contaminated"]                  # 6 of 200 = 3% > 2%
  assert r["tokens_per_s"] > 0 and r["index_grams"] > 0 and r["peak_rss_mib"] > 0


def test_curation_benchmark_below_the_bar_is_clean(tmp_path):
  r = curation.run(train_tokens=5_000, eval_instances=100, planted=2, seed=1, workdir=tmp_path)
  assert (r["found"], r["false_positives"], r["contaminated"]) == (2, 0, False)   # 2% is not contaminated
  assert r["fraction"] == 0.02
