"""The addition task as RL prompts: questions with the math verifier's gold answer, no responses.

Train prompts and a fresh held-out set (in the SFT demo's record layout, so
`addition.exact_match` scores it) are written under `<output_dir>/data/` once. The SFT
demo's own held-out questions (`<init_from>/../data/eval.jsonl`, when present) are kept
out of both.
"""

from __future__ import annotations

import json
import pathlib

from recipe_jax.demo import addition


def rl_records(records: list[dict]) -> list[dict]:
  """SFT addition records -> RL prompt records: the user turn plus `reward` (math, the boxed sum)."""
  return [{"messages": [r["messages"][0]],
           "reward": {"verifier": "math", "reference": addition.boxed_answer(r["messages"][-1]["content"])}}
          for r in records]


def prepare(cfg) -> pathlib.Path:
  """Writes `rl_train.jsonl` (prompts) and `rl_eval.jsonl` (held out) under output_dir/data; returns the first."""
  d, root = cfg.demo, pathlib.Path(cfg.output_dir) / "data"
  train = root / "rl_train.jsonl"
  if train.exists():
    return train
  exclude: set[str] = set()
  sft_eval = pathlib.Path(cfg.init_from).parent / "data" / "eval.jsonl"
  if sft_eval.exists():
    exclude = {json.loads(line)["messages"][0]["content"] for line in sft_eval.read_text().splitlines() if line}
  fixed_width = any(q.split()[2].startswith("0") and len(q.split()[2]) > 1 for q in exclude)
  held_out = addition.make_records(d.eval_records, digits=d.digits, seed=d.seed + 101, exclude=exclude,
                                   fixed_width=fixed_width)
  exclude |= {r["messages"][0]["content"] for r in held_out}
  addition.write_jsonl(held_out, root / "rl_eval.jsonl")
  prompts = addition.make_records(d.train_prompts, digits=d.digits, seed=d.seed + 102, exclude=exclude,
                                  fixed_width=fixed_width)
  return addition.write_jsonl(rl_records(prompts), train)
