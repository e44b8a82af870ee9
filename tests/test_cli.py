"""The `recipe-jax` command line."""

import re

from recipe_jax.cli import main


def test_models_lists_presets_and_runs_a_forward_pass(capsys):
  assert main(["models", "--set", "batch_size=2", "--set", "seq_len=8"]) == 0
  out = capsys.readouterr().out
  assert re.search(r"glm-4\.5-air\s+glm4_moe\s+46\s+8/128\s+106\.85B\s+13\.42B\s+12\.18B", out)
  assert re.search(r"qwen3-30b-a3b\s+qwen3_moe\s+48\s+8/128\s+30\.53B\s+3\.35B", out)
  assert "logits (2, 8, 256) float32, finite: True" in out
  diff = float(re.search(r"dense reference\| = (\S+)", out).group(1))
  assert diff < 1e-5


def test_unknown_override_is_a_clear_error(capsys):
  assert main(["models", "--set", "model.num_layrs=2"]) == 2
  assert "unknown key 'num_layrs'" in capsys.readouterr().err
