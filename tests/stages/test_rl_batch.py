"""RL rows from sampled ids, group filters and round seeds: plain NumPy, no model."""

import numpy as np
import pytest

from recipe_jax.stages import rl_batch
from recipe_jax.stages.rollouts import RolloutConfig, Sample, keep_group, round_seed


def _sample(prompt, tokens, adv, train=True, layers=0):
  experts = None
  if layers:
    n = len(prompt) + len(tokens)
    experts = np.arange(layers * n * 2, dtype=np.int32).reshape(layers, n, 2)
  return Sample(list(prompt), list(tokens), np.linspace(-1, -0.1, len(tokens)).astype(np.float32), "stop",
                1.0, "correct", advantage=adv, expert_ids=experts, train=train)


def test_rows_score_exactly_the_response_tokens_with_their_logprobs_advantages_and_experts():
  a = _sample([5, 6, 7], [8, 9], 0.5, layers=2)
  b = _sample([1, 2], [3, 4, 10], -1.0, layers=2)
  rows, layout = rl_batch.pack_samples([a, b], seq_len=12, rows_multiple=2, replay_shape=(2, 2))
  assert rows["tokens"].shape == (2, 12) and layout == [[0, 1]]   # one row used, padded to 2
  assert rows["tokens"][0, :10].tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 4, 10]
  assert rows["segment_ids"][0].tolist() == [1] * 5 + [2] * 5 + [0, 0]
  assert rows["positions"][0, :10].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
  # position j predicts token j + 1 within its segment; only response tokens are targets with loss
  assert rows["targets"][0, :10].tolist() == [6, 7, 8, 9, 0, 2, 3, 4, 10, 0]
  assert rows["loss_mask"][0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0]
  np.testing.assert_allclose(rows["sampler_logprobs"][0, 2:4], a.sampler_logprobs)
  np.testing.assert_allclose(rows["sampler_logprobs"][0, 6:9], b.sampler_logprobs)
  assert rows["advantages"][0].tolist() == [0, 0, .5, .5, 0, 0, -1, -1, -1, 0, 0, 0]
  assert rows["replay_experts"].shape == (2, 12, 2, 2)
  np.testing.assert_array_equal(rows["replay_experts"][0, :5], a.expert_ids.transpose(1, 0, 2))
  np.testing.assert_array_equal(rows["replay_experts"][0, 5:10], b.expert_ids.transpose(1, 0, 2))
  sums = rl_batch.segment_sums(rows["sampler_logprobs"], rows["loss_mask"], rows["segment_ids"], layout)
  np.testing.assert_allclose(sums, [a.sampler_logprobs.sum(), b.sampler_logprobs.sum()], rtol=1e-6)


def test_first_fit_decreasing_respects_length_and_segment_limits():
  lengths = [7, 5, 4, 3, 3, 2]
  rows = rl_batch.assign_rows(lengths, seq_len=8, max_segments=2)
  assert all(sum(lengths[i] for i in r) <= 8 and len(r) <= 2 for r in rows)
  assert sorted(i for r in rows for i in r) == list(range(6))
  with pytest.raises(ValueError, match="does not fit seq_len"):
    rl_batch.assign_rows([9], seq_len=8, max_segments=2)
  assert [rl_batch.num_rows(n, 4) for n in (1, 3, 5, 9, 129)] == [4, 4, 8, 12, 144]


def test_mini_batches_cover_every_sample_once():
  parts = rl_batch.mini_batches(list(range(10)), 3)
  assert [len(p) for p in parts] == [3, 4, 3] and sum(parts, []) == list(range(10))


@pytest.mark.parametrize("rewards, dynamic, band, want", [
    ([1, 1, 1, 1], True, None, "all_equal"),
    ([0, 0, 0, 0], True, None, "all_equal"),
    ([1, 1, 1, 1], False, None, None),
    ([1, 0, 0, 0], True, (0.0, 0.8), None),
    ([1, 1, 1, 1, 0], False, (0.0, 0.8), None),         # 0.8 is inside (0, 0.8]
    ([1, 1, 1, 1, 1], False, (0.0, 0.8), "outside_band"),
    ([0, 0, 0, 0, 0], False, (0.0, 0.8), "outside_band"),  # 0 is outside (0, 0.8]
])
def test_group_filters(rewards, dynamic, band, want):
  cfg = RolloutConfig(group_size=len(rewards), dynamic_sampling=dynamic, band=band)
  assert keep_group(np.asarray(rewards, float), cfg) == want


def test_round_seeds_differ_per_step_and_round_and_repeat():
  seeds = {round_seed(0, s, r) for s in range(5) for r in range(3)}
  assert len(seeds) == 15 and round_seed(3, 2, 1) == round_seed(3, 2, 1)
