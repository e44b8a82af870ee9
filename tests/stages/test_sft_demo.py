"""The SFT proof: `recipe-jax sft` on the locally generated addition task reaches >= 90% held-out
exact match on CPU (the run is the shared `sft_demo_run` fixture, trained once per session)."""

import json


def test_demo_reaches_ninety_percent_held_out_exact_match(sft_demo_run):
  summary = json.loads((sft_demo_run / "summary.json").read_text())
  held_out = [json.loads(line) for line in (sft_demo_run / "data" / "eval.jsonl").read_text().splitlines()]
  train = {json.loads(line)["messages"][0]["content"]
           for line in (sft_demo_run / "data" / "train.jsonl").read_text().splitlines()}
  assert len(held_out) >= 200 and not train & {r["messages"][0]["content"] for r in held_out}
  assert summary["demo_exact_match"] >= 0.90, summary
  assert summary["data"]["dropped"] == {}  # the generated data is all valid
  assert (sft_demo_run / "hf" / "config.json").exists() and (sft_demo_run / "hf" / "tokenizer.json").exists()
