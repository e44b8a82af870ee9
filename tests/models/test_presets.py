"""Real-size presets: parameter counts from `jax.eval_shape` against the published figures."""

import pytest

from recipe_jax.config import ConfigError
from recipe_jax.models import get_preset, param_counts
from recipe_jax.models.presets import PUBLISHED_COUNTS


@pytest.mark.parametrize("name", sorted(PUBLISHED_COUNTS))
def test_total_parameters_match_published(name):
  total, _, source = PUBLISHED_COUNTS[name]
  got = param_counts(get_preset(name)).total
  # Published totals are rounded to the shown digit; GLM-4.5 excludes its MTP layer.
  assert abs(got - total) / total < 0.01, (name, got, source)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "glm-4.5-air", "glm-4.5"])
def test_active_parameters_match_published(name):
  _, active, source = PUBLISHED_COUNTS[name]
  counts = param_counts(get_preset(name))
  # Qwen counts embeddings in "activated"; the GLM-4.5 report counts the non-embedding ones.
  got = counts.active if name.startswith("qwen") else counts.active_non_embedding
  assert abs(got - active) / active < 0.03, (name, got, source)


def test_exact_counts_for_known_sizes():
  c = param_counts(get_preset("qwen3-8b"))
  assert c.total == 8_190_735_360 and c.active == c.total
  assert param_counts(get_preset("qwen3-0.6b")).active_non_embedding == 440_467_456  # tied head


def test_unknown_preset_lists_presets():
  with pytest.raises(ConfigError, match="qwen3-8b"):
    get_preset("qwen4")
