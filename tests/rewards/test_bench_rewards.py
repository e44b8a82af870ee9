"""The rewards benchmark runs end to end on a few items and scores them as expected."""

from recipe_jax.bench import rewards


def test_rewards_benchmark_scores_each_kind():
  rows = {r["kind"]: r for r in rewards.run(items=4, workers=1)}
  assert rows["math"]["correct"] == 2      # the exact fractions, not the decimals 1e-4 away
  assert rows["code"]["correct"] == 4      # HumanEval canonical solutions pass the sandbox
  assert rows["ifeval"]["correct"] == 4    # the responses follow all three constraints
  assert all(r["items_per_s"] > 0 for r in rows.values())
