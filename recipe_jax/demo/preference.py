"""A preference set generated locally over the addition task: chosen = the sum, rejected = a near miss.

Every record is `{"prompt": [user turn], "chosen": [assistant turn], "rejected": [assistant turn]}`
in the layout `recipe_jax.data.preference` reads. The rejected answer is the
correct sum corrupted the way a small model gets sums wrong: off by one or by
ten (a dropped or spurious carry), one digit replaced, two digits swapped, a
digit dropped or repeated. Train and held-out splits share no question, and
questions in `exclude` (the SFT demo's exact-match set) are never used.

Two held-out accuracies are reported by the DPO stage: reward accuracy, the
fraction of pairs whose implicit reward margin against the starting model is
positive (what DPO trains; 0 before training, where every margin is 0), and
likelihood accuracy (`preference_accuracy` below), the fraction whose chosen
answer the model finds more likely per token than the rejected one,
log pi(y_c|x) / |y_c| > log pi(y_r|x) / |y_r|, which needs no reference.
"""

from __future__ import annotations

import pathlib
import random
import re

import numpy as np

from recipe_jax.demo.addition import problem, write_jsonl

CORRUPTIONS = ("plus_one", "minus_one", "plus_ten", "minus_ten", "replace_digit", "swap_digits",
               "drop_digit", "repeat_digit")


def corrupt(answer: str, rng: random.Random) -> str:
  """A wrong non-negative integer near `answer` (a string of digits), by a random corruption."""
  value = int(answer)
  while True:
    kind = rng.choice(CORRUPTIONS)
    digits = list(answer)
    i = rng.randrange(len(digits))
    if kind == "plus_one":
      out = str(value + 1)
    elif kind == "minus_one":
      out = str(value - 1)
    elif kind == "plus_ten":
      out = str(value + 10)
    elif kind == "minus_ten":
      out = str(value - 10)
    elif kind == "replace_digit":
      digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
      out = "".join(digits)
    elif kind == "swap_digits" and len(digits) > 1:
      j = rng.choice([k for k in range(len(digits)) if k != i])
      digits[i], digits[j] = digits[j], digits[i]
      out = "".join(digits)
    elif kind == "drop_digit" and len(digits) > 1:
      out = "".join(digits[:i] + digits[i + 1:])
    elif kind == "repeat_digit":
      out = "".join(digits[:i + 1] + digits[i:])
    else:
      continue
    if out.isdigit() and out != answer and str(int(out)) == out:
      return out


def writes_fixed_width(questions: list[str], digits: int) -> bool:
  """Whether questions write operands with leading zeros ("07 + 45"), as the SFT demo may."""
  operands = [x for q in questions for x in re.findall(r"\d+", q)]
  return any(len(x) == digits and x.startswith("0") and digits > 1 for x in operands)


def make_pairs(n: int, *, digits: int = 2, seed: int = 0, exclude: set[str] = frozenset(),
               fixed_width: bool = False) -> list[dict]:
  """`n` preference records over distinct questions not in `exclude` (operands zero-padded if `fixed_width`)."""
  rng = random.Random(seed)
  seen, out = set(exclude), []
  limit = 10 ** (2 * digits)
  if n > limit - len(exclude):
    raise ValueError(f"{n} distinct {digits}-digit questions requested, at most {limit - len(exclude)} exist")
  while len(out) < n:
    question, answer = problem(rng, digits, fixed_width=True) if fixed_width else problem(rng, digits)
    if question in seen:
      continue
    seen.add(question)
    out.append({"prompt": [{"role": "user", "content": question}],
                "chosen": [{"role": "assistant", "content": f"\\boxed{{{answer}}}"}],
                "rejected": [{"role": "assistant", "content": f"\\boxed{{{corrupt(answer, rng)}}}"}]})
  return out


def write_splits(root: str | pathlib.Path, *, train_pairs: int, eval_pairs: int, digits: int, seed: int,
                 exclude: set[str] = frozenset(), fixed_width: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes `pref_train.jsonl` and `pref_eval.jsonl` under `root` (disjoint questions); returns their paths."""
  root = pathlib.Path(root)
  both = make_pairs(train_pairs + eval_pairs, digits=digits, seed=seed, exclude=exclude, fixed_width=fixed_width)
  return (write_jsonl(both[:train_pairs], root / "pref_train.jsonl"),
          write_jsonl(both[train_pairs:], root / "pref_eval.jsonl"))


def preference_accuracy(logps: np.ndarray, lengths: np.ndarray) -> float:
  """Fraction of pairs (rows of `[N, 2]` arrays) whose chosen half has the higher per-token log-prob."""
  logps, lengths = np.asarray(logps, np.float64), np.asarray(lengths, np.float64)
  if logps.shape != lengths.shape or logps.ndim != 2 or logps.shape[1] != 2 or not len(logps):
    raise ValueError(f"logps {logps.shape} and lengths {lengths.shape} must both be [N > 0, 2]")
  per_token = logps / np.maximum(lengths, 1.0)
  return float(np.mean(per_token[:, 0] > per_token[:, 1]))
