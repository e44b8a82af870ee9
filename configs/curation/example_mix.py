"""An SFT mixture: three JSONL sources by weight, one capped, one repeated 1.5 times.

Run: recipe-jax data mix --config configs/curation/example_mix.py --output data/mix.jsonl
Paths are placeholders for your curated files (e.g. the outputs of `data grade` and `data score`);
`--set num_records=N` writes N records instead of every record the sources offer.
"""

from recipe_jax.curation.mix import MixConfig, MixSource


def get_config() -> MixConfig:
  return MixConfig(
      sources=(MixSource("data/math_graded.jsonl", weight=3.0),
               MixSource("data/code.jsonl", weight=2.0, cap=50_000),
               MixSource("data/chat_selected.jsonl", weight=1.0, epochs=1.5)),
      num_records=0, seed=0, source_field="source")
