"""Test setup: eight simulated CPU devices for the sharding tests, CPU platform only."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA compilation cache for the whole session, shared by the pytest-xdist workers (they
# inherit this from the controller) and by the CLI subprocesses: many tests compile the same
# tiny-model programs, and a hit skips the compile. Fresh per session, so nothing is reused
# across runs; set JAX_COMPILATION_CACHE_DIR yourself to keep one.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import tempfile

  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE = tempfile.mkdtemp(prefix="recipe_jax_test_xla_cache_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
else:
  _OWN_CACHE = None


import functools  # noqa: E402

import pytest  # noqa: E402


@functools.lru_cache(maxsize=None)
def _tiny_model(name: str):
  import jax

  from recipe_jax.models import get_preset, init_params

  cfg = get_preset(name)
  params = init_params(cfg, seed=1)
  if cfg.router_selection_bias:  # a non-zero selection bias, so tests can see it
    for i in cfg.moe_layer_ids:
      moe = params["layers"][i]["moe"]
      moe["router_bias"] = 0.05 * jax.random.normal(jax.random.key(i), moe["router_bias"].shape)
  return cfg, params


@pytest.fixture(scope="session")
def tiny_model():
  """`tiny_model(name) -> (config, params)`, created once per test process."""
  return _tiny_model


# The SFT demo run, trained once per test session and shared by the proofs that need a trained
# model (the SFT proof itself, DPO). Under pytest-xdist the workers share one run: the first to
# arrive trains it under a file lock, the others wait and reuse it.
SFT_DEMO_CONFIG = "configs/sft/demo_addition.py"
SFT_DEMO_CI_OVERRIDES = ("progress=False",)


@pytest.fixture(scope="session")
def sft_demo_run(tmp_path_factory):
  """A finished `recipe-jax sft --config configs/sft/demo_addition.py` run directory: hf/ (weights
  and tokenizer), data/eval.jsonl, summary.json (with demo_exact_match), metrics/."""
  import fcntl
  import json
  import pathlib
  import subprocess
  import sys

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # shared by the workers of this session
  out = root / "sft_demo_run"
  with open(root / "sft_demo_run.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (out / "summary.json").exists():
      cmd = [sys.executable, "-m", "recipe_jax.cli", "sft", "--config", SFT_DEMO_CONFIG,
             "--set", f"output_dir={out}"]
      for item in SFT_DEMO_CI_OVERRIDES:
        cmd += ["--set", item]
      env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
      done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).parent.parent)
      if done.returncode != 0:
        raise RuntimeError(f"the SFT demo run failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    json.loads((out / "summary.json").read_text())
  return out


def pytest_sessionfinish(session, exitstatus):
  if _OWN_CACHE and not os.environ.get("PYTEST_XDIST_WORKER"):  # the process that made it
    import shutil

    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(session, config, items):
  """The SFT proof first, so its shared demo run trains while the other worker takes the rest;
  the other users of that run last, when it is ready (they would wait on its lock otherwise)."""
  def rank(item):
    if "sft_demo_run" not in getattr(item, "fixturenames", ()):
      return 1
    return 0 if item.module.__name__.endswith("test_sft_demo") else 2
  items.sort(key=rank)  # stable: the order within each group is kept
