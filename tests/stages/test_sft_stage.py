"""The SFT stage end to end: command line, kill and resume, drop reports, strict mode."""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from recipe_jax.config import load_config_file
from recipe_jax.data.tokenizer import train_tokenizer
from recipe_jax.demo.addition import make_records, write_jsonl
from recipe_jax.stages import sft

CONFIG = "configs/sft/demo_addition.py"
SMALL = ["steps=8", "checkpoint_every=2", "demo.train_records=600", "demo.eval_records=4",
         "pipeline.seq_len=64", "pipeline.batch_size=8", "progress=False", "export_hf=False", "log_every=1"]


def _sft(out_dir, *extra, resume=False):
  cmd = [sys.executable, "-m", "recipe_jax.cli", "sft", "--config", CONFIG, "--set", f"output_dir={out_dir}"]
  for item in SMALL + list(extra):
    cmd += ["--set", item]
  if resume:
    cmd.append("--resume")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
  return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _losses(out_dir):
  rows = [json.loads(line) for line in (pathlib.Path(out_dir) / "metrics" / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows}


def test_killed_run_resumes_with_identical_losses(tmp_path):
  full = _sft(tmp_path / "full")
  assert full.wait(timeout=600) == 0, full.stdout.read()
  killed = _sft(tmp_path / "killed")
  metrics = tmp_path / "killed" / "metrics" / "metrics.jsonl"
  deadline = time.time() + 600
  while time.time() < deadline:
    if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
      break
    time.sleep(0.2)
  killed.send_signal(signal.SIGKILL)
  killed.wait()
  resumed = _sft(tmp_path / "killed", resume=True)
  out = resumed.stdout.read()
  assert resumed.wait(timeout=600) == 0, out
  assert "resumed from step" in out
  a, b = _losses(tmp_path / "full"), _losses(tmp_path / "killed")
  assert sorted(a) == sorted(b) == list(range(1, 9))
  assert [a[s].hex() if isinstance(a[s], float) else a[s] for s in a] == \
         [b[s].hex() if isinstance(b[s], float) else b[s] for s in a]


def test_existing_checkpoints_need_resume(tmp_path):
  cfg = load_config_file(CONFIG, overrides=[f"output_dir={tmp_path}"] + SMALL[:1] + SMALL[2:] + ["steps=2"])
  sft.run(cfg)
  with pytest.raises(Exception, match="--resume"):
    sft.run(cfg)


def _custom_data(tmp_path, bad_record: str):
  recs = make_records(60, digits=2)
  tok = train_tokenizer([json.dumps(r) for r in recs], vocab_size=300)
  tok.save_pretrained(tmp_path / "tok")
  path = write_jsonl(recs, tmp_path / "train.jsonl")
  with path.open("a") as f:
    f.write(bad_record + "\n")
  return str(path), str(tmp_path / "tok")


def test_invalid_records_are_dropped_and_counted_or_fatal_with_strict(tmp_path):
  bad = json.dumps({"messages": [{"role": "user", "content": "1+1?"}, {"role": "user", "content": "again"}]})
  path, tok = _custom_data(tmp_path, bad)
  base = [f"output_dir={tmp_path / 'run'}", f"tokenizer={tok}", "steps=3", "pipeline.seq_len=64",
          "pipeline.batch_size=8", "pipeline.num_epochs=1", "progress=False", "export_hf=False"]
  cfg = dataclasses.replace(load_config_file(CONFIG, overrides=base), demo=None,
                            sources=(sft.DataSourceConfig(path),))
  summary = sft.run(cfg)
  assert summary["data"]["dropped"]["train"] == {"invalid_role_transition": 1}
  assert summary["data"]["examples"]["train/invalid_role_transition"][0][0] == 60
  strict = dataclasses.replace(cfg, strict=True, output_dir=str(tmp_path / "strict"))
  with pytest.raises(Exception, match="invalid_role_transition"):
    sft.run(strict)
