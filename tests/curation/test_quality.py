"""Quality indicators: IFD and losses against plain forward passes of a tiny model, percentile
ranks against their definition, and weighted / stratified selection on constructed scores."""

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.config import ConfigError
from recipe_jax.curation import quality
from recipe_jax.curation.quality import Indicator, QualityConfig, percentile_ranks, select, weighted_scores
from recipe_jax.demo import addition


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


# ---------------------------------------------------------------------------- ranks and selection


def test_percentile_ranks_match_their_definition():
  rng = np.random.default_rng(0)
  for n in (2, 3, 10, 57):
    x = rng.integers(0, 6, size=n).astype(float)  # many ties
    want = [(sum(xj < xi for xj in x) + (sum(xj == xi for xj in x) - 1) / 2) / (n - 1) for xi in x]
    np.testing.assert_allclose(percentile_ranks(x), want, atol=1e-12)
  np.testing.assert_allclose(percentile_ranks([3.0, 1.0, 2.0, 2.0]), [1.0, 0.0, 0.5, 0.5])
  assert percentile_ranks([7.0]).tolist() == [0.5] and percentile_ranks([]).size == 0


def test_weighted_scores_use_direction_and_weights():
  table = {"ifd": np.array([0.9, 0.5, 0.7]), "loss": np.array([1.0, 3.0, 2.0])}
  s = weighted_scores(table, [Indicator("ifd", 2.0), Indicator("loss", 1.0, higher_is_better=False)])
  # ifd ranks [1, 0, .5]; loss ranks [0, 1, .5] flipped to [1, 0, .5]
  np.testing.assert_allclose(s, [3.0, 0.0, 1.5])


def test_select_top_fraction_and_strata():
  scores = np.array([0.9, 0.5, 0.9, 0.1, 0.7])
  assert np.flatnonzero(select(scores, keep_top=2)).tolist() == [0, 2]
  assert np.flatnonzero(select(scores, keep_fraction=0.5)).tolist() == [0, 2, 4]  # round(2.5) = 3
  assert not select(scores, keep_fraction=0.0).any() and select(scores, keep_fraction=1.0).all()
  ties = np.array([0.5, 0.5, 0.5])
  assert np.flatnonzero(select(ties, keep_top=2)).tolist() == [0, 1]  # ties to the earlier record
  strata = ["a", "b", "a", "b", "a"]
  assert np.flatnonzero(select(scores, strata, keep_fraction=0.5)).tolist() == [0, 1, 2]
  assert np.flatnonzero(select(scores, strata, keep_fraction=0.5, quotas={"b": 0, "a": 3})).tolist() == [0, 2, 4]
  assert np.flatnonzero(select(scores, strata, keep_fraction=0.0, quotas={"b": 5})).tolist() == [1, 3]


def test_config_rejects_bad_settings():
  for bad, match in ((dict(indicators=(Indicator("ifd", 0.0),)), "positive"),
                     (dict(keep_fraction=1.5), "keep_fraction"),
                     (dict(keep_top=3, stratum_field="category"), "keep_top"),
                     (dict(stratum_quotas=(("a", 1),)), "stratum_field"), (dict(max_ifd=0.0), "max_ifd")):
    with pytest.raises(ConfigError, match=match):
      QualityConfig(**bad)
  with pytest.raises(ConfigError, match="not one of"):
    Indicator("perplexity")


class ConstantScorer:
  """Stands in for QualityModel: renders nothing, scores each record from its own `fake` field."""

  def __init__(self, config):
    self.config = config

  def render(self, record, source, line):
    from recipe_jax.data.errors import DropRecord
    if "fake" not in record:
      raise DropRecord("no_supervised_assistant")
    return {"ids": np.zeros(record["fake"]["len"], np.int32), "loss_mask": np.ones(record["fake"]["len"], bool)}

  def score(self, examples):
    raise AssertionError("replaced below")


def test_two_pass_selection_with_constructed_scores(tmp_path):
  rows = [{"id": i, "category": "ab"[i % 2], "fake": {"len": 5, "ifd": ifd, "loss": loss}}
          for i, (ifd, loss) in enumerate([(0.9, 2.0), (0.2, 1.0), (1.3, 0.5), (0.6, 3.0), (0.4, 0.1), (0.8, 1.5)])]
  rows.insert(3, {"id": "broken", "category": "a"})
  rows.append({"id": "long", "category": "a", "fake": {"len": 50, "ifd": 0.5, "loss": 1.0}})
  src = _write(tmp_path / "in.jsonl", rows)
  config = QualityConfig(indicators=(Indicator("ifd", 1.0), Indicator("loss", 1.0, higher_is_better=False)),
                         stratum_field="category", keep_fraction=0.5, max_ifd=1.0, max_len=20, batch_size=2)
  scorer = ConstantScorer(config)
  by_len = iter(r["fake"] for r in rows if "fake" in r and r["fake"]["len"] <= 20)
  scorer.score = lambda ex: [dict(length=5, entropy=1.0, loss_alone=1.0, **next(by_len)) for _ in ex]
  report = quality.select_file(src, tmp_path / "out.jsonl", config, scorer)
  out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
  # Scored (max_ifd drops id 2): ids 0,1,3,4,5 with ifd ranks [1, 0, .5, .25, .75] and loss
  # ranks (lower better) [.25, .75, 0, 1, .5]; totals [1.25, .75, .5, 1.25, 1.25].
  # a: ids 0, 4 -> keep round(1) = id 0 (tie with 4, earlier). b: ids 1, 3, 5 -> keep 2: 5, then 1.
  assert [o["id"] for o in out] == [0, 1, 5]
  np.testing.assert_allclose([o["quality"]["score"] for o in out], [1.25, 0.75, 1.25])
  assert report.removed == {"ifd_above_max": 1, "not_selected": 2, "too_long": 1}
  assert report.malformed == {"no_supervised_assistant": 1} and report.examples["no_supervised_assistant"] == [4]
  assert report.read == report.kept + report.num_removed + report.num_malformed == 8
  assert report.details["quality"]["strata"] == {"a": {"scored": 2, "selected": 1}, "b": {"scored": 3, "selected": 2}}


# ---------------------------------------------------------------------------- the tiny model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A tiny random Qwen3 model and an addition-trained tokenizer, saved as one HF directory."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import train_tokenizer
  from recipe_jax.models import get_preset, init_params

  path = tmp_path_factory.mktemp("quality_model")
  texts = [json.dumps(r) for r in addition.make_records(300, digits=2, seed=11)]
  train_tokenizer(texts, vocab_size=320).save_pretrained(path)
  cfg = get_preset("tiny-dense").replace(vocab_size=384)
  hf.save(path, cfg, init_params(cfg, seed=1))
  return path


def _records():
  rows = [{**r, "category": "ab"[i % 2]} for i, r in enumerate(addition.make_records(5, digits=2, seed=4))]
  long_answer = "Adding the tens and then the ones gives " + "the sum " * 6 + "\\boxed{99}"
  rows.append({"messages": [{"role": "user", "content": "What is 90 + 9?"},
                            {"role": "assistant", "content": long_answer}], "category": "b"})
  rows.append({"prompt": "What is 1 + 1?", "response": "two " * 80, "category": "a"})  # too long
  rows.append({"messages": [{"role": "user", "content": "What is 2 + 2?"}], "category": "a"})  # no answer
  return rows


@pytest.fixture(scope="module")
def plain_indicators(checkpoint):
  """`record -> indicators` from full-vocabulary forward passes (one jitted width, right-padded:
  causal, so the padding never reaches a scored position), summed in float64."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import load_tokenizer
  from recipe_jax.data.validate import sft_example_fn
  from recipe_jax.models import forward

  cfg, params = hf.load(checkpoint)
  tok = load_tokenizer(checkpoint)
  assert tok.bos_token_id is None and tok.pad_token == "<|endoftext|>"
  render = sft_example_fn(tok, template="qwen3", policy="final_response")
  width = 128
  logits_fn = jax.jit(lambda t: jax.nn.log_softmax(forward(cfg, params, t).logits[0].astype(jnp.float32), -1))

  def row_logp(seq):
    assert len(seq) <= width
    return np.asarray(logits_fn(jnp.asarray([list(seq) + [0] * (width - len(seq))], jnp.int32)), np.float64)

  def indicators(record):
    ex = render(record, "t", 0)
    ids, mask = np.asarray(ex["ids"]), np.asarray(ex["loss_mask"])
    first = int(np.argmax(mask))
    logp = row_logp(ids)
    scored = [t for t in range(1, len(ids)) if mask[t]]  # token t is predicted at position t - 1
    nll = -sum(logp[t - 1, ids[t]] for t in scored)
    entropy = sum(-(np.exp(logp[t - 1]) * logp[t - 1]).sum() for t in scored)
    alone = np.concatenate([[tok.pad_token_id], ids[first:]])
    logp_alone = row_logp(alone)
    nll_alone = -sum(logp_alone[j, alone[j + 1]] for j in range(len(alone) - 1) if mask[first + j])
    n = len(scored)
    assert n == int(mask.sum())
    return {"length": n, "loss": nll / n, "loss_alone": nll_alone / n, "entropy": entropy / n}

  return indicators


def _run(tmp_path, checkpoint, rows, name, *sets):
  src = _write(tmp_path / f"{name}.jsonl", rows)
  parser = argparse.ArgumentParser()
  quality.add_arguments(parser)
  args = parser.parse_args(["--input", str(src), "--output", str(tmp_path / f"{name}.out.jsonl"),
                            "--model", str(checkpoint), "--set", "batch_size=2", "--set", "min_bucket=16",
                            "--set", "max_len=160", "--set", "logits_chunk=16", *sum((["--set", s] for s in sets), [])])
  report = quality.run_cli(args)
  return report, [json.loads(x) for x in (tmp_path / f"{name}.out.jsonl").read_text().splitlines()]


def test_ifd_is_the_ratio_of_independently_computed_losses(tmp_path, checkpoint, plain_indicators):
  rows = _records()
  report, out = _run(tmp_path, checkpoint, rows, "all")
  assert [o["messages"] for o in out] == [r["messages"] for r in rows[:6]]
  assert report.removed == {"too_long": 1} and report.examples["too_long"] == [7]
  assert report.malformed == {"invalid_role_transition": 1} and report.examples["invalid_role_transition"] == [8]
  assert report.read == 8 and report.kept == 6
  for o, r in zip(out, rows):
    got, want = o["quality"], plain_indicators(r)
    assert got["length"] == want["length"]
    for k in ("loss", "loss_alone", "entropy"):
      np.testing.assert_allclose(got[k], want[k], rtol=2e-5, err_msg=k)
    np.testing.assert_allclose(got["ifd"], want["loss"] / want["loss_alone"], rtol=4e-5)
    np.testing.assert_allclose(got["ifd"], got["loss"] / got["loss_alone"], rtol=1e-12)
  assert out[5]["quality"]["length"] > 2 * out[0]["quality"]["length"]  # the long row used a wider bucket

  # Stratified on the same scores, with the batch split over two devices: each category keeps
  # its better half by IFD (the only indicator).
  extra = {"messages": rows[0]["messages"]}  # no category: malformed, so the scored set is unchanged
  report2, kept = _run(tmp_path, checkpoint, rows + [extra], "strata", "stratum_field=category",
                       "keep_fraction=0.5", "mesh.fsdp=2")
  want = []
  for cat in "ab":
    members = [i for i, r in enumerate(rows[:6]) if r["category"] == cat]
    best = sorted(members, key=lambda i: -out[i]["quality"]["ifd"])[:int(len(members) / 2 + 0.5)]
    want += best
  assert [k["messages"] for k in kept] == [rows[i]["messages"] for i in sorted(want)]
  for k, i in zip(kept, sorted(want)):
    np.testing.assert_allclose(k["quality"]["ifd"], out[i]["quality"]["ifd"], rtol=1e-5)
  assert report2.malformed == {"invalid_role_transition": 1, "missing_field:category": 1}
  assert report2.removed == {"too_long": 1, "not_selected": 6 - len(want)}


def test_nebulaexp_quality_config_loads_with_overrides():
  from recipe_jax.config import load_config_file

  cfg = load_config_file("configs/curation/nebulaexp_quality.py", overrides=["keep_fraction=0.3"])
  assert cfg.keep_fraction == 0.3 and cfg.stratum_field == "category" and cfg.max_ifd == 1.0
  assert {i.name: (i.weight, i.higher_is_better) for i in cfg.indicators}["loss"] == (1.0, False)
