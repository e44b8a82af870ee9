"""Verifier throughput: items per second for math, code and instruction-following checks.

Each kind is scored through the reward pool (`rewards.pool.RewardPool`), the way an RL
stage scores a batch: worker processes with per-item deadlines. Math items are the
boxed answers of generated arithmetic problems (half of them wrong); code items are
HumanEval's canonical solutions, graded in the bwrap sandbox; instruction items are
300-word responses checked against three constraints. The pool starts before timing,
so worker start-up is not counted; each kind is timed after one warm-up batch.
"""

from __future__ import annotations

import argparse
import random
import time

from recipe_jax.rewards.pool import Item, RewardPool


def math_items(n: int, seed: int = 0) -> list[Item]:
  rng = random.Random(seed)
  items = []
  for i in range(n):
    a, b = rng.randint(10, 999), rng.randint(2, 99)
    gold = f"\\frac{{{a}}}{{{b}}}"
    answer = gold if i % 2 == 0 else f"{a / b + 1e-4:.6f}"  # off by 1e-4: not the fraction
    items.append(Item("recipe_jax.rewards.math", f"So the answer is \\boxed{{{answer}}}.", gold))
  return items


def code_items(n: int) -> list[Item]:
  from recipe_jax.rewards.code import humaneval_reference, load_humaneval

  problems = load_humaneval()
  chosen = [problems[i % len(problems)] for i in range(n)]
  return [Item("recipe_jax.rewards.code", f"```python\n{p['prompt']}{p['canonical_solution']}\n```",
               humaneval_reference(p)) for p in chosen]


def ifeval_items(n: int, seed: int = 0) -> list[Item]:
  rng = random.Random(seed)
  words = "the model writes a careful answer about rivers mountains and the long history of trade".split()
  reference = {"instructions": [
      {"id": "punctuation:no_comma"},
      {"id": "length_constraints:number_words", "kwargs": {"relation": "at least", "num_words": 250}},
      {"id": "detectable_content:postscript", "kwargs": {"postscript_marker": "P.S."}},
  ]}
  items = []
  for _ in range(n):
    sentences = [" ".join(rng.choice(words) for _ in range(15)).capitalize() + "." for _ in range(20)]
    items.append(Item("recipe_jax.rewards.ifeval", " ".join(sentences) + "\n\nP.S. Thanks.", reference))
  return items


KINDS = {"math": math_items, "code": code_items, "ifeval": ifeval_items}


def run(*, items: int = 64, workers: int = 2, kinds: tuple[str, ...] = tuple(KINDS)) -> list[dict]:
  rows = []
  with RewardPool(num_workers=workers) as pool:
    for kind in kinds:
      batch = KINDS[kind](items)
      pool.score(batch[:workers])  # warm-up: imports and engine start-up in every worker
      start = time.perf_counter()
      scores = pool.score(batch)
      seconds = time.perf_counter() - start
      rows.append({"kind": kind, "items": len(batch), "correct": sum(s.value for s in scores),
                   "seconds": seconds, "items_per_s": len(batch) / seconds})
  return rows


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m recipe_jax.bench rewards", description=__doc__.splitlines()[0])
  parser.add_argument("--items", type=int, default=64, help="items per kind")
  parser.add_argument("--workers", type=int, default=2, help="pool worker processes")
  parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
  args = parser.parse_args(argv)
  rows = run(items=args.items, workers=args.workers, kinds=tuple(args.kinds.split(",")))
  print(f"reward pool with {args.workers} workers, {args.items} items per kind")
  print("| verifier | items | scored 1 | seconds | items/s |\n| --- | ---: | ---: | ---: | ---: |")
  for r in rows:
    print(f"| {r['kind']} | {r['items']} | {r['correct']:.0f} | {r['seconds']:.2f} | {r['items_per_s']:.1f} |")


if __name__ == "__main__":
  main()
