"""`python -m recipe_jax.bench <name> [options]`."""

import sys

BENCHMARKS = {
    "attention": "recipe_jax.bench.attention",
    "curation": "recipe_jax.bench.curation",
    "logprobs": "recipe_jax.bench.logprobs",
    "rl": "recipe_jax.bench.rl",
    "rewards": "recipe_jax.bench.rewards",
    "sampling": "recipe_jax.bench.sampling",
    "sft": "recipe_jax.bench.sft",
}


def main() -> None:
  if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
    print(f"usage: python -m recipe_jax.bench {{{','.join(BENCHMARKS)}}} [options]")
    sys.exit(2)
  import importlib
  importlib.import_module(BENCHMARKS[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
  main()
