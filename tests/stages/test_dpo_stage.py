"""The DPO stage end to end on a tiny model: ln 2 at the start, resume, reference cache reuse and staleness."""

import dataclasses
import json
import logging
import pathlib

import numpy as np
import pytest

from recipe_jax.config import load_config_file
from recipe_jax.data.pipeline import Source
from recipe_jax.data.preference import preference_example_fn
from recipe_jax.data.sources import JsonlSource
from recipe_jax.stages import dpo
from recipe_jax.stages import reference_cache as refs
from recipe_jax.stages.sft import DataSourceConfig

CONFIG = "configs/dpo/demo_addition.py"


def fake_sft_run(root: pathlib.Path, seed: int = 0) -> pathlib.Path:
  """What the SFT demo leaves behind, with a tiny untrained model: hf/ (weights + tokenizer), data/eval.jsonl."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import train_tokenizer
  from recipe_jax.demo.addition import make_records, write_jsonl
  from recipe_jax.models import get_preset, init_params

  tok = train_tokenizer([json.dumps(r) for r in make_records(300, digits=2, seed=7)], vocab_size=300)
  cfg = get_preset("tiny-dense").replace(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=1,
                                         num_heads=2, num_kv_heads=1, head_dim=16)
  hf.save(root / "hf", cfg, init_params(cfg, seed=seed))
  tok.save_pretrained(root / "hf")
  write_jsonl(make_records(6, digits=2, seed=8), root / "data" / "eval.jsonl")
  return root


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  return fake_sft_run(tmp_path_factory.mktemp("sft"))


def _overrides(run: pathlib.Path, out: pathlib.Path, *extra) -> list[str]:
  return [f"init_from={run / 'hf'}", f"output_dir={out}", "demo.train_pairs=48", "demo.eval_pairs=8",
          "data.batch_size=8", "progress=False", "export_hf=False", "log_every=1", *extra]


def _metrics(out: pathlib.Path) -> dict[int, dict]:
  lines = (out / "metrics" / "metrics.jsonl").read_text().splitlines()
  return {r["step"]: r for r in map(json.loads, lines)}


def _plain_config(run: pathlib.Path, out: pathlib.Path, train: pathlib.Path, *extra):
  """The demo config without the demo: a preference file as a plain source, no evaluation."""
  cfg = load_config_file(CONFIG, overrides=_overrides(run, out, *extra))
  return dataclasses.replace(cfg, demo=None, sources=(DataSourceConfig(str(train), name="addition_pairs"),))


def test_stage_starts_at_ln2_resumes_bit_identically_and_caches_the_reference(tiny_run, tmp_path, capsys):
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import load_tokenizer
  from recipe_jax.parallel.mesh import MeshConfig, make_mesh
  from recipe_jax.stages.dpo_objective import make_sequence_logps

  cache = f"reference_cache_dir={tmp_path / 'cache'}"
  # 1. the demo: one epoch of 48 pairs in batches of 8 = 6 steps; the reference pass runs and is cached
  summary = dpo.run(load_config_file(CONFIG, overrides=_overrides(tiny_run, tmp_path / "full", cache)))
  assert "computed and cached" in capsys.readouterr().out
  full = _metrics(tmp_path / "full")
  assert sorted(full) == list(range(1, 7))
  assert abs(full[1]["loss"] - np.log(2.0)) < 1e-4 and abs(full[1]["margin"]) < 1e-4  # policy = reference
  assert summary["data"]["kept"] == {"addition_pairs": 48}
  assert set(summary["demo_after"]) == {"reward_accuracy", "likelihood_accuracy", "exact_match"}
  assert summary["demo_before"]["reward_accuracy"] == 0.0  # every margin is 0 at the start
  cache_file = next((tmp_path / "cache").glob("*.npz"))
  stamp = cache_file.stat().st_mtime_ns

  # 2. the same data as a plain source, interrupted after 3 of 6 steps, then resumed: same losses bit for bit
  train = tmp_path / "full" / "data" / "pref_train.jsonl"
  schedule = ("optimizer.total_steps=6", "checkpoint_every=3", cache)
  dpo.run(_plain_config(tiny_run, tmp_path / "cut", train, "steps=3", *schedule))
  with pytest.raises(Exception, match="--resume"):
    dpo.run(_plain_config(tiny_run, tmp_path / "cut", train, "steps=6", *schedule))
  dpo.run(_plain_config(tiny_run, tmp_path / "cut", train, "steps=6", *schedule), resume=True)
  out = capsys.readouterr().out
  assert "resumed from step 3" in out and "computed" not in out
  cut = _metrics(tmp_path / "cut")
  assert [full[s]["loss"].hex() for s in range(1, 7)] == [cut[s]["loss"].hex() for s in range(1, 7)]
  assert cache_file.stat().st_mtime_ns == stamp  # read twice, never rewritten

  # 3. the cached table equals a direct forward pass of the starting model, pair by pair
  model_cfg, params = hf.load(tiny_run / "hf")
  mesh = make_mesh(MeshConfig(fsdp=1))
  pair_fn = preference_example_fn(load_tokenizer(tiny_run / "hf"), template="qwen3")
  seq_len = load_config_file(CONFIG).data.seq_len
  direct = refs.compute_reference_logps(make_sequence_logps(model_cfg, chunk_size=seq_len, mesh=mesh), params,
                                        [Source("addition_pairs", JsonlSource(train))], pair_fn, seq_len=seq_len,
                                        batch_size=5, mesh=mesh)
  with np.load(cache_file) as f:
    cached = f["source:addition_pairs"]
  assert np.isfinite(cached).all()
  np.testing.assert_allclose(cached, direct["addition_pairs"], rtol=1e-5)

  # 4. other weights (same config and tokenizer): the cache is stale and recomputed
  other = fake_sft_run(tmp_path / "other", seed=1)
  dpo.run(_plain_config(other, tmp_path / "other_out", train, "steps=1", cache))
  assert "computed and cached" in capsys.readouterr().out
  saved = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
  assert saved["weights"] == refs.checkpoint_fingerprint(other / "hf") != refs.checkpoint_fingerprint(tiny_run / "hf")
  with np.load(cache_file) as f:
    assert not np.allclose(f["source:addition_pairs"], cached)


def test_dpo_command_line_is_wired():
  from recipe_jax.cli import build_parser, cmd_stage
  args = build_parser().parse_args(["dpo", "--config", CONFIG, "--set", "loss.beta=2.0", "--resume"])
  assert args.fn is cmd_stage and args.command == "dpo" and args.set == ["loss.beta=2.0"] and args.resume
  cfg = load_config_file(CONFIG, overrides=args.set)
  assert isinstance(cfg, dpo.DpoConfig) and cfg.loss.beta == 2.0
  tulu = load_config_file("configs/dpo/tulu3_qwen3_8b.py")
  assert (tulu.loss.loss_type, tulu.loss.beta, tulu.optimizer.learning_rate, tulu.optimizer.schedule,
          tulu.optimizer.warmup_ratio, tulu.data.num_epochs, tulu.steps) == \
      ("length_normalized", 5.0, 5e-7, "linear", 0.1, 1, 0)
  assert tulu.data.batch_size * 8 == 128  # pairs per host x the 8 hosts of a v5p-64


def test_stale_cache_is_detected_and_recomputed(tmp_path, caplog):
  parts = refs.key_parts(weights="w1", model={"d": 1}, sources=[{"name": "s", "contents": "c1"}],
                         template="qwen3", policy="final_response", seq_len=40, tokenizer="t1")
  calls = []

  def compute(value):
    return lambda: calls.append(value) or {"s": np.full((3, 2), value, np.float32)}

  cache = refs.ReferenceCache(tmp_path, parts)
  assert cache.stale_parts() is None
  tables, cached = refs.reference_logps(cache, compute(1.0), {"s": 3})
  assert not cached and calls == [1.0] and cache.stale_parts() == []
  tables, cached = refs.reference_logps(cache, compute(2.0), {"s": 3})
  assert cached and calls == [1.0] and float(tables["s"][0, 0]) == 1.0
  for changed in ({"weights": "w2"}, {"sources": [{"name": "s", "contents": "c2"}]}, {"policy": "all_assistant"},
                  {"tokenizer": "t2"}):
    kwargs = dict(weights="w1", model={"d": 1}, sources=[{"name": "s", "contents": "c1"}], template="qwen3",
                  policy="final_response", seq_len=40, tokenizer="t1") | changed
    stale = refs.ReferenceCache(tmp_path, refs.key_parts(**kwargs))
    with caplog.at_level(logging.WARNING):
      tables, cached = refs.reference_logps(stale, compute(3.0), {"s": 3})
    assert not cached and float(tables["s"][0, 0]) == 3.0
    assert "stale" in caplog.text
    caplog.clear()
    refs.ReferenceCache(tmp_path, parts).save({"s": np.ones((3, 2), np.float32)})  # back to the first key
  # a table that does not fit the source (the data grew) is not reused either
  tables, cached = refs.reference_logps(refs.ReferenceCache(tmp_path, parts), compute(4.0), {"s": 5})
  assert not cached
