"""Benchmarks: `python -m recipe_jax.bench <name>`. Results go to docs/benchmarks.md."""
