"""Weighted mixtures: exact caps and epochs, weights, seeds, the command line, TFDS sources and the
seqio registry."""

import argparse
import collections
import json

import numpy as np
import pytest

from recipe_jax.config import ConfigError
from recipe_jax.curation import mix
from recipe_jax.curation.mix import MixConfig, MixSource, draw_sources, tfds_name_split


def _source(tmp_path, name, n, *, extra_lines=()):
  path = tmp_path / f"{name}.jsonl"
  lines = [json.dumps({"src": name, "i": i}) for i in range(n)]
  for at, text in extra_lines:
    lines.insert(at, text)
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def _read(path):
  return [json.loads(x) for x in open(path).read().splitlines()]


def test_caps_epochs_and_report(tmp_path):
  a = _source(tmp_path, "a", 100)
  b = _source(tmp_path, "b", 40, extra_lines=[(5, "{broken"), (7, "")])
  c = _source(tmp_path, "c", 50)
  config = MixConfig(sources=(MixSource(a, weight=3.0), MixSource(b, epochs=1.5), MixSource(c, cap=10)),
                     seed=3, source_field="source")
  report = mix.mix(config, tmp_path / "out.jsonl")
  out = _read(tmp_path / "out.jsonl")
  assert len(out) == 100 + 60 + 10 == report.kept
  per = collections.Counter(o["source"] for o in out)
  assert per == {"a": 100, "b": 60, "c": 10}
  b_counts = collections.Counter(o["i"] for o in out if o["src"] == "b")
  assert sorted(collections.Counter(b_counts.values()).items()) == [(1, 20), (2, 20)]  # 1.5 passes over 40
  assert len({o["i"] for o in out if o["src"] == "c"}) == 10
  a_ids = [o["i"] for o in out if o["src"] == "a"]
  assert a_ids == list(range(100))  # one full pass, in file order
  assert report.malformed == {"invalid_json": 1} and report.examples["invalid_json"] == [(b, 6)]
  assert report.removed == {"not_sampled": 40} and report.read == 191
  got = {s["name"]: (s["available"], s["offered"], s["taken"], s["epochs_used"]) for s in report.details["sources"]}
  assert got == {"a": (100, 100, 100, 1.0), "b": (40, 60, 60, 1.5), "c": (50, 10, 10, 0.2)}
  assert report.details["shortfall"] == 0


def test_num_records_follow_weights_and_seed(tmp_path):
  a, b = _source(tmp_path, "a", 100), _source(tmp_path, "b", 100)
  sources = (MixSource(a, weight=3.0), MixSource(b, weight=1.0))
  runs = {}
  for seed in (0, 0, 1):
    mix.mix(MixConfig(sources=sources, num_records=80, seed=seed), tmp_path / f"o{seed}.jsonl")
    runs.setdefault(seed, []).append(open(tmp_path / f"o{seed}.jsonl").read())
  assert runs[0][0] == runs[0][1] and runs[0][0] != runs[1][0]
  out = [json.loads(x) for x in runs[0][0].splitlines()]
  from_a = sum(o["src"] == "a" for o in out)
  assert len(out) == 80 and 45 <= from_a <= 75  # expected 60, binomial sd ~3.9
  a_ids = [o["i"] for o in out if o["src"] == "a"]
  assert a_ids == sorted(set(a_ids)) and a_ids != list(range(from_a))  # a random subset, in file order


def test_a_capped_source_drops_out_and_the_rest_fill(tmp_path):
  a, b = _source(tmp_path, "a", 100), _source(tmp_path, "b", 100)
  sources = (MixSource(a, weight=10.0, cap=20), MixSource(b, weight=1.0))
  report = mix.mix(MixConfig(sources=sources, num_records=90, seed=0), tmp_path / "o.jsonl")
  out = _read(tmp_path / "o.jsonl")
  assert sum(o["src"] == "a" for o in out) == 20 and sum(o["src"] == "b" for o in out) == 70
  last_a = max(k for k, o in enumerate(out) if o["src"] == "a")
  assert last_a < 45  # weight 10:1 spends a's 20 records early, then b fills the rest
  report = mix.mix(MixConfig(sources=sources, num_records=500, seed=0), tmp_path / "o2.jsonl")
  assert report.kept == 120 and report.details["shortfall"] == 380 and report.details["requested"] == 500


def test_draw_sources_respects_limits():
  draws = draw_sources([1.0, 5.0, 2.0], [7, 30, 100], 137, seed=4, block=16)  # small blocks: many redraws
  assert np.bincount(draws, minlength=3).tolist() == [7, 30, 100]
  draws = draw_sources([1.0, 1.0], [1000, 1000], 1000, seed=0)
  assert 430 < np.bincount(draws)[0] < 570
  with pytest.raises(ValueError, match="exceeds"):
    draw_sources([1.0], [3], 4, seed=0)


def test_sources_and_config_validation(tmp_path):
  assert tfds_name_split("tfds:gsm8k:train") == ("gsm8k", "train")
  assert tfds_name_split("tfds:mnist:3.0.1:train") == ("mnist:3.0.1", "train")
  assert MixSource("tfds:gsm8k:train").label == "gsm8k_train" and MixSource("/x/y/math.jsonl").label == "math"
  for bad in ("tfds:gsm8k", "tfds::train", "tfds:gsm8k:"):
    with pytest.raises(ConfigError, match="tfds:<name>:<split>"):
      MixSource(bad)
  with pytest.raises(ConfigError, match="weight"):
    MixSource("a.jsonl", weight=0.0)
  with pytest.raises(ConfigError, match="epochs"):
    MixSource("a.jsonl", epochs=0.0)
  with pytest.raises(ConfigError, match="distinct"):
    MixConfig(sources=(MixSource("x/a.jsonl"), MixSource("y/a.jsonl")))
  assert mix.parse_source("d/a.jsonl,weight=2,cap=5,epochs=1.5,name=alpha") == MixSource(
      "d/a.jsonl", weight=2.0, cap=5, epochs=1.5, name="alpha")
  with pytest.raises(ConfigError, match="not a number"):
    mix.parse_source("a.jsonl,cap=many")
  with pytest.raises(ConfigError, match="weight="):
    mix.parse_source("a.jsonl,wieght=2")


def test_run_cli(tmp_path):
  a, b = _source(tmp_path, "a", 30), _source(tmp_path, "b", 30)
  parser = argparse.ArgumentParser()
  mix.add_arguments(parser)
  args = parser.parse_args(["--source", f"{a},weight=2", "--source", f"{b},cap=5,name=bee", "--output",
                            str(tmp_path / "m.jsonl"), "--num-records", "20", "--seed", "7",
                            "--set", "source_field=from"])
  report = mix.run_cli(args)
  out = _read(tmp_path / "m.jsonl")
  assert len(out) == 20 == report.kept and {o["from"] for o in out} <= {"a", "bee"}
  assert sum(o["from"] == "bee" for o in out) <= 5 and report.details["config"]["seed"] == 7
  assert "mix: read 60, kept 20" in report.summary()


# ---------------------------------------------------------------------------- TFDS and seqio


def test_tfds_source_and_seqio_mixture(tmp_path):
  """One test for everything that imports TensorFlow (seqio, tensorflow_datasets): ~10 s."""
  tfds = pytest.importorskip("tensorflow_datasets")
  pytest.importorskip("seqio")

  class TinyMixPrompts(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"prompt": tfds.features.Text(), "n": tfds.features.Scalar(np.int64)}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i in range(6):
        yield i, {"prompt": f"q{i}", "n": i}

  TinyMixPrompts(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  a = _source(tmp_path, "a", 10)
  sources = (MixSource(a), MixSource("tfds:tiny_mix_prompts:train", epochs=2.0, data_dir=str(tmp_path)))
  report = mix.mix(MixConfig(sources=sources, seed=1, source_field="source"), tmp_path / "t.jsonl")
  out = _read(tmp_path / "t.jsonl")
  from_tfds = [o for o in out if o["source"] == "tiny_mix_prompts_train"]
  assert len(out) == 22 and len(from_tfds) == 12
  assert collections.Counter(o["prompt"] for o in from_tfds) == {f"q{i}": 2 for i in range(6)}
  assert report.read == 16

  # seqio: one task per JSONL source, mixed 3:1.
  heavy, light = _source(tmp_path, "heavy", 50), _source(tmp_path, "light", 50)
  mixture = mix.register_seqio_mixture("curation_test_mix", [MixSource(heavy, weight=3.0, epochs=1.5),
                                                             MixSource(light, cap=20)])
  import seqio
  assert seqio.MixtureRegistry.get("curation_test_mix") is mixture
  assert sorted(t.name for t in mixture.tasks) == ["curation_test_mix.heavy", "curation_test_mix.light"]
  ds = mixture.get_dataset(sequence_length=None, split="train", shuffle=False, seed=0, num_epochs=None)
  records = [json.loads(x["json"]) for x in ds.take(400).as_numpy_iterator()]
  share = sum(r["src"] == "heavy" for r in records) / len(records)
  assert 0.68 <= share <= 0.82  # 0.75 expected; binomial sd ~0.022
  one_pass = {t.name: [json.loads(x["json"])["i"] for x in t.get_dataset(None, split="train", shuffle=False,
                                                                          num_epochs=1).as_numpy_iterator()]
              for t in mixture.tasks}
  assert one_pass["curation_test_mix.light"] == list(range(20))              # cap
  assert one_pass["curation_test_mix.heavy"] == list(range(50)) + list(range(25))  # 1.5 epochs
  with pytest.raises(ConfigError, match="TfdsDataSource"):
    mix.register_seqio_mixture("curation_test_bad", [MixSource("tfds:x:train")])


def test_config_file_with_extra_sources_and_overrides(tmp_path):
  parser = argparse.ArgumentParser()
  mix.add_arguments(parser)
  args = parser.parse_args(["--config", "configs/curation/example_mix.py", "--source", "more.jsonl,weight=0.5",
                            "--output", str(tmp_path / "x.jsonl"), "--num-records", "1000"])
  config = mix.load_config(args)
  assert [s.label for s in config.sources] == ["math_graded", "code", "chat_selected", "more"]
  assert config.num_records == 1000 and config.sources[1].cap == 50_000 and config.sources[2].epochs == 1.5


def test_recipe_jax_data_mix_writes_output_and_report(tmp_path, capsys):
  from recipe_jax.curation import cli

  a, b = _source(tmp_path, "a", 8), _source(tmp_path, "b", 4)
  assert cli.main(["mix", "--source", a, "--source", f"{b},epochs=0.5", "--output", str(tmp_path / "m.jsonl"),
                   "--no-progress"]) == 0
  assert capsys.readouterr().out.strip() == "mix: read 12, kept 10; removed not_sampled 2"
  report = json.loads((tmp_path / "m.report.json").read_text())
  assert [(s["name"], s["taken"], s["epochs_used"]) for s in report["sources"]] == [("a", 8, 1.0), ("b", 2, 0.5)]
  assert cli.main(["mix", "--source", f"{a},weight=-1", "--output", str(tmp_path / "x.jsonl")]) == 2
  assert "weight" in capsys.readouterr().err
