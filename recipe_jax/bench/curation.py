"""Decontamination throughput: training tokens per second against an indexed evaluation set.

A synthetic corpus is generated locally: words drawn uniformly from a generated vocabulary
(so two unrelated texts share no 8-gram), evaluation instances of 20-60 words, training
records of 100-400 words. Into chosen training records we plant spans copied from
evaluation instances: `planted` spans of floor(L/2)+1 words (the fewest that overlap an
instance of L words) and as many near misses of floor(L/2) words (never an overlap). The
run is `decontaminate` end to end (JSON in and out included); it must remove exactly the
planted records. Index memory is measured with tracemalloc on a separate build.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import resource
import string
import tempfile
import time
import tracemalloc

from recipe_jax.curation.decontaminate import EvalIndex, decontaminate, texts
from recipe_jax.curation.records import CurationReport, read_jsonl


def _vocabulary(rng: random.Random, size: int) -> list[str]:
  vocab: set[str] = set()
  while len(vocab) < size:
    vocab.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))))
  return sorted(vocab)


def make_corpus(workdir: pathlib.Path, *, train_tokens: int, eval_instances: int, planted: int,
                seed: int = 0, vocab_size: int = 20000) -> dict:
  """Writes `eval.jsonl` and `train.jsonl`; returns the ids of the records that must be removed."""
  rng = random.Random(seed)
  vocab = _vocabulary(rng, vocab_size)
  eval_texts = [rng.choices(vocab, k=rng.randint(20, 60)) for _ in range(eval_instances)]
  with (workdir / "eval.jsonl").open("w") as f:
    for i, tokens in enumerate(eval_texts):
      f.write(json.dumps({"id": i, "prompt": " ".join(tokens) + "?"}) + "\n")

  mean_length = 250
  expected_records = max(1, train_tokens // mean_length)
  chosen = rng.sample(range(eval_instances), 2 * planted)
  hosts = rng.sample(range(max(2 * planted, int(expected_records * 0.9))), 2 * planted)
  spans = {}  # training record -> the words planted in it
  for k, (instance, host) in enumerate(zip(chosen, hosts)):
    tokens = eval_texts[instance]
    length = len(tokens) // 2 + (1 if k < planted else 0)
    start = rng.randint(0, len(tokens) - length)
    spans[host] = tokens[start:start + length]
  must_remove = {host for k, host in enumerate(hosts) if k < planted}

  written = records = 0
  with (workdir / "train.jsonl").open("w") as f:
    while written < train_tokens or records <= max(hosts):
      tokens = rng.choices(vocab, k=rng.randint(100, 400))
      if records in spans:
        cut = rng.randint(0, len(tokens))
        tokens[cut:cut] = spans[records]
      f.write(json.dumps({"id": records, "prompt": " ".join(tokens) + ".", "response": "ok"}) + "\n")
      written += len(tokens)
      records += 1
  return {"train_records": records, "must_remove": must_remove}


def _index_memory(eval_path: pathlib.Path) -> tuple[int, float]:
  tracemalloc.start()
  index = EvalIndex.build({"eval": ((line, text) for line, _, text in
                                    texts(eval_path, "prompt", CurationReport("bench")))})
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  return index.num_grams, peak / 2**20


def run(*, train_tokens: int = 10_000_000, eval_instances: int = 10_000, planted: int | None = None,
        seed: int = 0, workdir: str | pathlib.Path | None = None) -> dict:
  planted = max(1, eval_instances // 40) if planted is None else planted  # 2.5%: contaminated
  with tempfile.TemporaryDirectory(dir=workdir) as tmp:
    tmp = pathlib.Path(tmp)
    corpus = make_corpus(tmp, train_tokens=train_tokens, eval_instances=eval_instances, planted=planted, seed=seed)
    start = time.perf_counter()
    (report,) = decontaminate([tmp / "train.jsonl"], [tmp / "eval.jsonl"], tmp / "out")
    seconds = time.perf_counter() - start
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kept_ids = {record["id"] for _, record in read_jsonl(tmp / "out" / "train.jsonl")}
    grams, index_mib = _index_memory(tmp / "eval.jsonl")
  removed = set(range(corpus["train_records"])) - kept_ids
  stats = report.details["eval_sets"]["eval"]
  return {"train_tokens": report.details["train_tokens"], "train_records": corpus["train_records"],
          "eval_instances": eval_instances, "planted": planted, "near_misses": planted,
          "found": len(removed & corpus["must_remove"]), "false_positives": len(removed - corpus["must_remove"]),
          "overlapping_eval": stats["overlapping"], "fraction": stats["fraction"],
          "contaminated": stats["contaminated"], "index_grams": grams, "index_mib": index_mib,
          "seconds": seconds, "tokens_per_s": report.details["train_tokens"] / seconds,
          "peak_rss_mib": peak_rss_mib}


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m recipe_jax.bench curation", description=__doc__.splitlines()[0])
  parser.add_argument("--train-tokens", type=int, default=10_000_000, help="training-side words")
  parser.add_argument("--eval-instances", type=int, default=10_000, help="evaluation instances indexed")
  parser.add_argument("--planted", type=int, help="overlapping spans planted (default: 2.5%% of eval)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workdir", help="where the synthetic corpus is written (default: system temp)")
  args = parser.parse_args(argv)
  r = run(train_tokens=args.train_tokens, eval_instances=args.eval_instances, planted=args.planted,
          seed=args.seed, workdir=args.workdir)
  print(f"decontamination, word 8-grams: {r['train_records']} training records against "
        f"{r['eval_instances']} evaluation instances, one process")
  print("| train tokens | eval instances | planted / near misses | found | false positives | eval overlap "
        "| index 8-grams | index MiB | seconds | train tokens/s | peak RSS MiB |")
  print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  print(f"| {r['train_tokens']:,} | {r['eval_instances']:,} | {r['planted']} / {r['near_misses']} | {r['found']} | "
        f"{r['false_positives']} | {r['fraction']:.2%} ({'contaminated' if r['contaminated'] else 'clean'}) | "
        f"{r['index_grams']:,} | {r['index_mib']:.1f} | {r['seconds']:.1f} | {r['tokens_per_s']:,.0f} | "
        f"{r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
  main()
