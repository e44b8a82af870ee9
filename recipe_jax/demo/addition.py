"""A synthetic task generated locally: add two numbers, answer in `\\boxed{}`.

Records are OpenAI-style conversations, so they go through the same readers,
validators, chat templates and packing as real SFT data. Evaluation is greedy
decoding of the prompt and exact match of the last boxed answer.
"""

from __future__ import annotations

import json
import pathlib
import random
import re

import jax
import jax.numpy as jnp
import numpy as np

from recipe_jax.models import ModelConfig, forward

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def problem(rng: random.Random, digits: int, fixed_width: bool = False) -> tuple[str, str]:
  """A question and its answer; `fixed_width` writes operands with leading zeros ("07 + 45"),
  so each digit sits at the same place in every question."""
  a = rng.randint(0, 10 ** digits - 1)
  b = rng.randint(0, 10 ** digits - 1)
  fmt = (lambda v: str(v).zfill(digits)) if fixed_width else str
  return f"What is {fmt(a)} + {fmt(b)}?", str(a + b)


def make_records(n: int, *, digits: int = 3, seed: int = 0, exclude: set[str] = frozenset(),
                 fixed_width: bool = False) -> list[dict]:
  """`n` conversations: a user question and an assistant answer `\\boxed{sum}`.

  Questions in `exclude` are never generated (to keep held-out problems out of training).
  """
  rng = random.Random(seed)
  out = []
  while len(out) < n:
    q, a = problem(rng, digits, fixed_width)
    if q in exclude:
      continue
    out.append({"messages": [{"role": "user", "content": q},
                             {"role": "assistant", "content": f"\\boxed{{{a}}}"}]})
  return out


def write_jsonl(records: list[dict], path: str | pathlib.Path) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return path


def boxed_answer(text: str) -> str | None:
  """The content of the last `\\boxed{...}` in `text` (no nesting in this task)."""
  found = _BOXED.findall(text)
  return found[-1].strip() if found else None


def greedy_generate(cfg: ModelConfig, params, prompts: list[list[int]], *, max_new_tokens: int,
                    stop_id: int, batch_size: int = 64) -> list[list[int]]:
  """Greedy continuation of each prompt by full forward passes (no cache; a plain reference).

  Rows are right-padded to one fixed length, so one compiled forward serves every step.
  """
  width = max(len(p) for p in prompts) + max_new_tokens

  @jax.jit
  def next_tokens(params, tokens, lengths):
    seg = (jnp.arange(width)[None] < lengths[:, None]).astype(jnp.int32)
    logits = forward(cfg, params, tokens, segment_ids=seg).logits
    return jnp.argmax(logits[jnp.arange(tokens.shape[0]), lengths - 1], axis=-1)

  outputs = []
  for start in range(0, len(prompts), batch_size):
    chunk = prompts[start:start + batch_size]
    rows = batch_size
    tokens = np.zeros((rows, width), np.int32)
    lengths = np.ones(rows, np.int32)
    for i, p in enumerate(chunk):
      tokens[i, :len(p)] = p
      lengths[i] = len(p)
    done = np.zeros(rows, bool)
    done[len(chunk):] = True
    new = [[] for _ in chunk]
    for _ in range(max_new_tokens):
      nxt = np.asarray(next_tokens(params, jnp.asarray(tokens), jnp.asarray(lengths)))
      for i in range(len(chunk)):
        if not done[i]:
          new[i].append(int(nxt[i]))
          tokens[i, lengths[i]] = nxt[i]
          lengths[i] += 1
          done[i] = nxt[i] == stop_id
      if done.all():
        break
    outputs.extend(new)
  return outputs


def exact_match(cfg: ModelConfig, params, tokenizer, records: list[dict], *, max_new_tokens: int = 16) -> float:
  """Fraction of records whose greedy answer's boxed value equals the reference."""
  prompts, answers = [], []
  for r in records:
    user = [m for m in r["messages"] if m["role"] != "assistant"]
    prompts.append(tokenizer.apply_chat_template(user, tokenize=True, add_generation_prompt=True,
                                                 enable_thinking=False, return_dict=False))
    answers.append(boxed_answer(r["messages"][-1]["content"]))
  outs = greedy_generate(cfg, params, prompts, max_new_tokens=max_new_tokens,
                         stop_id=tokenizer.convert_tokens_to_ids(tokenizer.eos_token))
  hits = [boxed_answer(tokenizer.decode(o)) == a for o, a in zip(outs, answers)]
  return float(np.mean(hits))
