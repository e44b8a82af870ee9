"""Two synthetic domains for the distillation demos: addition and subtraction, answers in `\\boxed{}`.

Subtraction records use the addition demo's layout (`recipe_jax.demo.addition.make_records`:
a user question and an assistant `\\boxed{answer}`), so SFT trains on them and
`addition.exact_match` scores them unchanged. `prepare` writes, once, under one root:

  tokenizer/                  a BPE tokenizer trained on both domains (shared by every model)
  data/<domain>_sft.jsonl     SFT records (for the teachers and the student)
  data/<domain>_eval.jsonl    held-out records: never in SFT data nor in distillation prompts
  data/<domain>_prompts.jsonl distillation prompts: the user turn only; a config maps each
                              file (source) to its domain with `source_domains`

Run: python -m recipe_jax.demo.distill_domains --out runs/distill_demo

`demo_sft_config` describes the SFT runs that make the demos' models from those files
(configs/distill/demo_teacher_*.py, demo_student.py): teachers are the SFT demo's model
(3 layers, width 128) trained 1000 steps on one domain (>= 90% held-out exact match); the
student is shallower (2 layers of width 128) and trained on both domains for 550 steps of a
700-step schedule: 35% held-out exact match on addition, against the teachers' 99%. Weaker
students (10-18% after 400 steps, 1.5% at width 64) did not learn from a short distillation
run: a tiny model's arithmetic appears late in training, and a few hundred distillation
steps do not bring it on (docs/distill.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random

from recipe_jax.demo import addition

DOMAINS = ("addition", "subtraction")


def subtraction_problem(rng: random.Random, digits: int) -> tuple[str, str]:
  """A question "What is a - b?" with a >= b (the answer is never negative) and its answer."""
  a = rng.randint(0, 10 ** digits - 1)
  b = rng.randint(0, a)
  return f"What is {a} - {b}?", str(a - b)


def make_subtraction_records(n: int, *, digits: int = 2, seed: int = 0,
                             exclude: set[str] = frozenset()) -> list[dict]:
  """`n` conversations: a subtraction question and the assistant answer `\\boxed{difference}`."""
  rng = random.Random(seed)
  out = []
  while len(out) < n:
    q, a = subtraction_problem(rng, digits)
    if q in exclude:
      continue
    out.append({"messages": [{"role": "user", "content": q},
                             {"role": "assistant", "content": f"\\boxed{{{a}}}"}]})
  return out


def make_domain_records(domain: str, n: int, *, digits: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
  if domain == "addition":
    return addition.make_records(n, digits=digits, seed=seed, exclude=exclude)
  if domain == "subtraction":
    return make_subtraction_records(n, digits=digits, seed=seed, exclude=exclude)
  raise ValueError(f"domain {domain!r} is not one of {DOMAINS}")


def prompt_records(records: list[dict], domain: str | None = None) -> list[dict]:
  """SFT records -> distillation prompts: the user turn (and `domain`, which picks the teacher, if given)."""
  return [{"messages": [r["messages"][0]], **({"domain": domain} if domain else {})} for r in records]


def prepare(root: str | pathlib.Path, *, digits: int = 2, sft_records: int = 20_000, eval_records: int = 200,
            prompts: int = 4000, tokenizer_vocab: int = 320, seed: int = 0) -> pathlib.Path:
  """Writes the tokenizer and every domain's files under `root` (module docstring); existing files
  are kept. Returns `root`."""
  from recipe_jax.data.tokenizer import train_tokenizer

  root = pathlib.Path(root)
  data = root / "data"
  for k, domain in enumerate(DOMAINS):
    if (data / f"{domain}_prompts.jsonl").exists():
      continue
    base = seed + 1000 * k
    held_out = make_domain_records(domain, eval_records, digits=digits, seed=base + 1)
    exclude = {r["messages"][0]["content"] for r in held_out}
    addition.write_jsonl(held_out, data / f"{domain}_eval.jsonl")
    addition.write_jsonl(make_domain_records(domain, sft_records, digits=digits, seed=base, exclude=exclude),
                         data / f"{domain}_sft.jsonl")
    addition.write_jsonl(prompt_records(make_domain_records(domain, prompts, digits=digits, seed=base + 2,
                                                            exclude=exclude)),
                         data / f"{domain}_prompts.jsonl")
  tok_dir = root / "tokenizer"
  if not (tok_dir / "tokenizer.json").exists():
    texts = [json.dumps(r) for k, domain in enumerate(DOMAINS)
             for r in make_domain_records(domain, 2000, digits=digits, seed=seed + 1000 * k + 3)]
    train_tokenizer(texts, vocab_size=tokenizer_vocab).save_pretrained(tok_dir)
  return root


def demo_sft_config(name: str, domains: tuple[str, ...], *, student: bool, root: str = "runs/distill_demo"):
  """The SFT run that writes `<root>/<name>/hf`: a teacher on `domains`, or the weak student."""
  from recipe_jax.data.pipeline import PipelineConfig
  from recipe_jax.models.presets import get_preset
  from recipe_jax.parallel.mesh import MeshConfig
  from recipe_jax.stages.sft import DataSourceConfig, SftConfig
  from recipe_jax.stages.sft_objective import SftLossConfig
  from recipe_jax.training import OptimizerConfig

  tiny = get_preset("tiny-dense").replace(vocab_size=384, num_heads=4, num_kv_heads=2)
  model = tiny.replace(hidden_size=128, intermediate_size=384, num_layers=2 if student else 3, head_dim=32)
  # the student stops at step 550 of a 700-step schedule: mid-way down its cosine, at a learning
  # rate (3.6e-4) above the distillation's, so distilling does not kick it out of a minimum that
  # a schedule run down to zero would have settled it into (docs/distill.md)
  schedule = 700 if student else 1000
  steps = 550 if student else schedule
  return SftConfig(
      model=model,
      pipeline=PipelineConfig(seq_len=256, batch_size=16, packing="best_fit", seed=0),
      sources=tuple(DataSourceConfig(f"{root}/data/{d}_sft.jsonl", name=d) for d in domains),
      tokenizer=f"{root}/tokenizer",
      output_dir=f"{root}/{name}",
      steps=steps,
      loss=SftLossConfig(normalization="token_mean", logprob_chunk_size=256),
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=30, total_steps=schedule, b2=0.98, weight_decay=0.01,
                                clip_norm=1.0),
      mesh=MeshConfig(fsdp=1),
      log_every=50,
  )


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="runs/distill_demo", help="root directory for tokenizer/ and data/")
  parser.add_argument("--digits", type=int, default=2)
  parser.add_argument("--sft-records", type=int, default=20_000)
  parser.add_argument("--eval-records", type=int, default=200)
  parser.add_argument("--prompts", type=int, default=4000)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  root = prepare(args.out, digits=args.digits, sft_records=args.sft_records, eval_records=args.eval_records,
                 prompts=args.prompts, seed=args.seed)
  print(f"wrote {sorted(str(p.relative_to(root)) for p in root.rglob('*') if p.is_file())}")


if __name__ == "__main__":
  main()
