"""Difficulty grading: band and filter edges, pass rates from a scripted sampler through the real
math verifier, and one end-to-end run of the sampling engine on a tiny checkpoint."""

import argparse
import json

import pytest

from recipe_jax.config import ConfigError
from recipe_jax.curation import grade
from recipe_jax.curation.grade import Band, GradeConfig, Interval, filter_reason, label
from recipe_jax.demo import addition
from recipe_jax.rewards.pool import RewardPool

RUFUS = Interval(0.0, 0.8, low_open=True)
NEBULA_RL = Interval(0.0, 1.0, low_open=True, high_open=True)


def _write(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


def _addition_prompts(n, seed=5):
  out = []
  for r in addition.make_records(n, digits=2, seed=seed):
    answer = addition.boxed_answer(r["messages"][1]["content"])
    out.append({**r, "reward": {"verifier": "math", "reference": answer}})
  return out


# ---------------------------------------------------------------------------- bands and filters


@pytest.mark.parametrize("rate,want", [(0.0, "hard"), (0.2499, "hard"), (0.25, "medium"), (0.4999, "medium"),
                                       (0.5, "easy"), (0.75, "easy"), (1.0, "easy")])
def test_nebulaexp_bands_edges(rate, want):
  assert label(rate, grade.NEBULAEXP_BANDS) == want


@pytest.mark.parametrize("interval,rate,want", [
    (RUFUS, 0.0, "too_hard"), (RUFUS, 0.125, None), (RUFUS, 0.8, None), (RUFUS, 0.8001, "too_easy"),
    (RUFUS, 1.0, "too_easy"), (NEBULA_RL, 0.0, "too_hard"), (NEBULA_RL, 0.2, None), (NEBULA_RL, 0.8, None),
    (NEBULA_RL, 1.0, "too_easy"), (Interval(0.25, 0.5), 0.25, None), (Interval(0.25, 0.5), 0.5, None),
    (None, 0.0, None), (None, 1.0, None)])
def test_learnability_filter_edges(interval, rate, want):
  assert filter_reason(rate, interval) == want


def test_bad_bands_and_intervals_are_rejected():
  with pytest.raises(ConfigError, match="low <= high"):
    Interval(0.6, 0.4)
  with pytest.raises(ConfigError, match="empty"):
    Interval(0.5, 0.5, low_open=True)
  gap = (Band("hard", Interval(0.0, 0.2, high_open=True)), Band("easy", Interval(0.3, 1.0)))
  both = (Band("hard", Interval(0.0, 0.5)), Band("easy", Interval(0.5, 1.0)))
  neither = (Band("hard", Interval(0.0, 0.5, high_open=True)), Band("easy", Interval(0.5, 1.0, low_open=True)))
  short = (Band("hard", Interval(0.0, 0.5, high_open=True)), Band("easy", Interval(0.5, 0.9)))
  for bands, match in ((gap, "must meet"), (both, "exactly one"), (neither, "exactly one"), (short, "end at 1")):
    with pytest.raises(ConfigError, match=match):
      GradeConfig(bands=bands)
  with pytest.raises(ConfigError, match="default_verifier"):
    GradeConfig(default_verifier="no_such_verifier_module")
  with pytest.raises(ConfigError, match="samples"):
    GradeConfig(samples=0)


def test_config_files_load_with_overrides():
  from recipe_jax.config import load_config_file

  nebula = load_config_file("configs/curation/nebulaexp_pass_at_4.py")
  assert nebula.samples == 4 and nebula.filter is None and [b.label for b in nebula.bands] == ["hard", "medium", "easy"]
  rufus = load_config_file("configs/curation/rufus_air_learnability.py", overrides=["filter.high=0.75"])
  assert rufus.teacher_samples == 4 and rufus.filter == Interval(0.0, 0.75, low_open=True)
  pool = load_config_file("configs/curation/nebulaexp_rl_pool.py")
  assert pool.samples == 5 and filter_reason(0.0, pool.filter) == "too_hard" and filter_reason(1.0, pool.filter)


# ---------------------------------------------------------------------------- scripted sampler


class ScriptedSampler:
  """Answers prompt "What is a + b?" correctly in the first `solved(a, b)` of its n samples."""

  def __init__(self, solved):
    self.solved = solved
    self.calls = []

  def prepare(self, messages):
    question = messages[-1]["content"]
    if "?" not in question:
      raise grade.PromptError("prompt_too_long", question[:20])
    return question

  def sample(self, prepared, *, n, seed):
    self.calls.append((len(prepared), n, seed))
    out = []
    for q in prepared:
      a, b = (int(x) for x in q.removeprefix("What is ").removesuffix("?").split(" + "))
      good = self.solved(a, b, n)
      out.append([(f"so \\boxed{{{a + b if j < good else a + b + 1}}}", "stop") for j in range(n)])
    return out


@pytest.fixture(scope="module")
def pool():
  with RewardPool(num_workers=1, deadline_s=60) as p:
    yield p


def test_pass_rates_bands_filter_and_teacher_from_scripted_samples(tmp_path, pool):
  prompts = _addition_prompts(10)
  # The model solves (a % 5) of 4 samples (4 -> capped at 4); the teacher fails when a % 7 == 0.
  model = ScriptedSampler(lambda a, b, n: min(a % 5, n))
  teacher = ScriptedSampler(lambda a, b, n: 0 if a % 7 == 0 else 1)
  bad = ["{not json", json.dumps([1, 2]),
         {"messages": [{"role": "user", "content": "What is 1 + 2?"}]},                       # no reward
         {"prompt": "What is 3 + 4?", "reward": {"verifier": "math"}},                        # no reference
         {"prompt": "What is 3 + 4?", "reward": {"verifier": "nonexistent.module", "reference": "7"}},
         {"reward": {"verifier": "math", "reference": "7"}},                                  # no prompt
         {"prompt": "no question mark", "reward": {"verifier": "math", "reference": "7"}},   # sampler refuses
         {"prompt": "What is 5 + 6?", "reward": {"verifier": "math", "reference": {"not": "a label"}}}]
  src = _write(tmp_path / "in.jsonl", prompts[:4] + bad + prompts[4:])
  config = GradeConfig(samples=4, teacher_samples=2, chunk_prompts=3, filter=RUFUS)
  report = grade.grade_file(src, tmp_path / "out.jsonl", config, model, teacher=teacher, scorer=pool.score)

  out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
  lines = list(range(1, 5)) + list(range(13, 19))  # input lines of the 10 good prompts
  expect = {}
  for line, p in zip(lines, prompts):
    a = int(p["messages"][0]["content"].split()[2])
    expect[line] = (a, min(a % 5, 4) / 4)
  never = [line for line, (a, _) in expect.items() if a % 7 == 0]
  graded = {line: rate for line, (a, rate) in expect.items() if a % 7}
  too_hard = [line for line, rate in graded.items() if rate == 0.0]
  too_easy = [line for line, rate in graded.items() if rate > 0.8]
  kept = [line for line, rate in graded.items() if 0.0 < rate <= 0.8]
  assert [o["pass_rate"] for o in out] == [graded[line] for line in kept]
  for o in out:
    assert o["num_samples"] == 4 and o["num_correct"] == o["pass_rate"] * 4
    assert o["difficulty"] == label(o["pass_rate"], grade.NEBULAEXP_BANDS)
    assert o["teacher_num_correct"] == 1 and o["teacher_pass_rate"] == 0.5
  assert report.removed == {k: len(v) for k, v in (("teacher_never_solves", never), ("too_hard", too_hard),
                                                   ("too_easy", too_easy)) if v}
  assert report.examples.get("too_hard", []) == too_hard and report.examples.get("teacher_never_solves", []) == never
  assert report.malformed == {"invalid_json": 1, "not_an_object": 1, "missing_reward_reference": 2,
                              "unknown_verifier": 1, "missing_prompt": 1, "prompt_too_long": 1,
                              "malformed_reward_reference": 1}
  assert report.examples["malformed_reward_reference"] == [12]  # a dict is no math label: caught before sampling
  assert report.examples["missing_reward_reference"] == [7, 8] and report.examples["unknown_verifier"] == [9]
  assert report.examples["invalid_json"] == [(str(src), 5)]
  assert report.read == report.kept + report.num_removed + report.num_malformed == 18
  details = report.details["grade"]
  assert details["prompts_graded"] == len(graded)
  assert details["verifier_reasons"]["model:correct"] == sum(round(r * 4) for r in graded.values())
  model_finishes = {k: v for k, v in details["finish_reasons"].items() if k.startswith("model:")}
  assert model_finishes == {"model:stop": 4 * len(graded)}
  # Chunks of 3 prompts: each generate call draws n samples with its own seed.
  assert [c[:2] for c in teacher.calls] == [(3, 2), (3, 2), (3, 2), (1, 2)]  # 10 prompts parse
  assert all(n == 4 for _, n, _ in model.calls) and sum(c[0] for c in model.calls) == len(graded)
  assert len({seed for _, _, seed in model.calls}) == len(model.calls)


def test_teacher_and_teacher_samples_must_agree(tmp_path, pool):
  src = _write(tmp_path / "in.jsonl", _addition_prompts(2))
  with pytest.raises(ConfigError, match="teacher"):
    grade.grade_file(src, tmp_path / "o.jsonl", GradeConfig(teacher_samples=4), ScriptedSampler(lambda *a: 1),
                     scorer=pool.score)


def test_run_cli_refuses_a_teacher_filter_without_a_teacher(tmp_path):
  parser = argparse.ArgumentParser()
  grade.add_arguments(parser)
  args = parser.parse_args(["--input", "in.jsonl", "--output", str(tmp_path / "o.jsonl"), "--model", "nowhere",
                            "--config", "configs/curation/rufus_air_learnability.py"])
  with pytest.raises(ConfigError, match="teacher_samples=4"):
    grade.run_cli(args)


# ---------------------------------------------------------------------------- the engine, end to end


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """A tiny random Qwen3 model and an addition-trained tokenizer, saved as one HF directory."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import train_tokenizer
  from recipe_jax.models import get_preset, init_params

  path = tmp_path_factory.mktemp("grade_model")
  texts = [json.dumps(r) for r in addition.make_records(300, digits=2, seed=11)]
  train_tokenizer(texts, vocab_size=320).save_pretrained(path)
  cfg = get_preset("tiny-dense").replace(vocab_size=384)
  hf.save(path, cfg, init_params(cfg, seed=1))
  return path


def test_run_cli_grades_with_the_engine_and_math_verifier(tmp_path, checkpoint):
  prompts = _addition_prompts(5, seed=3)
  long_prompt = {"prompt": "What is " + " + ".join(["12"] * 40) + "?", "reward": {"reference": "480"}}
  rows = prompts[:2] + [{"prompt": "What is 2 + 2?"}, long_prompt] + prompts[2:]
  src = _write(tmp_path / "in.jsonl", rows)
  parser = argparse.ArgumentParser()
  grade.add_arguments(parser)
  args = parser.parse_args(["--input", str(src), "--output", str(tmp_path / "out.jsonl"), "--model", str(checkpoint),
                            "--config", "configs/curation/nebulaexp_pass_at_4.py",
                            "--set", "samples=3", "--set", "max_new_tokens=8", "--set", "slots=4",
                            "--set", "chunk_prompts=2", "--set", "max_prompt_tokens=48",
                            "--set", "reward_workers=1", "--set", "default_verifier=math"])
  report = grade.run_cli(args)

  out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [o["messages"] for o in out] == [p["messages"] for p in prompts]
  for o in out:
    assert 0.0 <= o["pass_rate"] <= 1.0 and o["num_samples"] == 3
    assert o["pass_rate"] == o["num_correct"] / 3
    assert o["difficulty"] == label(o["pass_rate"], grade.NEBULAEXP_BANDS)
  assert report.malformed == {"missing_reward_reference": 1, "prompt_too_long": 1}
  assert report.examples["missing_reward_reference"] == [3] and report.examples["prompt_too_long"] == [4]
  assert report.read == 7 and report.kept == 5 and not report.removed
  details = report.details["grade"]
  assert details["prompts_graded"] == 5 and sum(details["pass_rate_histogram"].values()) == 5
  assert sum(details["finish_reasons"].values()) == 15 and sum(details["verifier_reasons"].values()) == 15
  assert set(details["finish_reasons"]) <= {"model:stop", "model:length"}
  assert report.details["config"]["samples"] == 3 and "grade: read 7, kept 5" in report.summary()
