"""The DPO proof: on the SFT demo model, held-out preference accuracy >= 95%, exact match kept within 2 points.

Preference accuracy is the implicit reward accuracy against the starting model (0 before
training, where every margin is 0); the model's own likelihood ranking of the pairs must stay
>= 95% too.

`sft_demo_run` (tests/conftest.py) is a finished `recipe-jax sft --config configs/sft/demo_addition.py`
run directory: hf/ (weights and tokenizer) and data/eval.jsonl (the exact-match set).
"""

import json
import time

from recipe_jax.config import load_config_file
from recipe_jax.stages import dpo


def test_dpo_on_the_sft_demo_model(sft_demo_run, tmp_path):
  cfg = load_config_file("configs/dpo/demo_addition.py",
                         overrides=[f"init_from={sft_demo_run / 'hf'}", f"output_dir={tmp_path}", "progress=False",
                                    "export_hf=False"])
  start = time.perf_counter()
  summary = dpo.run(cfg)
  seconds = time.perf_counter() - start
  before, after = summary["demo_before"], summary["demo_after"]
  print(json.dumps({"seconds": round(seconds, 1), "before": before, "after": after}))
  assert before["reward_accuracy"] == 0.0 and after["reward_accuracy"] >= 0.95
  assert after["likelihood_accuracy"] >= 0.95
  assert after["exact_match"] >= before["exact_match"] - 0.02
  assert summary["data"]["dropped"] == {}

