"""Data curation: decontamination, deduplication, difficulty grading, quality scores, mixtures.

Each tool streams its JSONL input and writes its output plus a JSON report of what it
removed and why (`recipe_jax.curation.records`); `recipe-jax data <tool>` runs them.
"""
