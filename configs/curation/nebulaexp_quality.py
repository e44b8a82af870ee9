"""NebulaExp SFT quality selection: percentile-ranked indicators from a scoring model, weighted.

Run: recipe-jax data score --config configs/curation/nebulaexp_quality.py \
       --model SCORER_HF_DIR --input sft.jsonl --output selected.jsonl
NebulaExp computes length, entropy, loss and IFD = L(r | q) / L(r) with a scoring model and
samples by s = sum_i w_i r_i over percentile ranks r_i; it does not publish the weights or the
kept share, so these are ours: IFD counts most (the prompt should matter to the response, Li et
al. 2024), then lower loss and higher entropy equally, a small weight on longer responses; keep
the best half of each `category`, and drop IFD > 1 (the prompt does not help at all; Li et al.).
Hardware: one forward pass of the scorer per record and two rows per record; batch 8, 8K tokens.
"""

from recipe_jax.curation.quality import Indicator, QualityConfig


def get_config() -> QualityConfig:
  return QualityConfig(
      template="qwen3", policy="final_response",
      indicators=(Indicator("ifd", 2.0, higher_is_better=True),
                  Indicator("loss", 1.0, higher_is_better=False),
                  Indicator("entropy", 1.0, higher_is_better=True),
                  Indicator("length", 0.5, higher_is_better=True)),
      keep_fraction=0.5, stratum_field="category", max_ifd=1.0, batch_size=8, max_len=8192)
