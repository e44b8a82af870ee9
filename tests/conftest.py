"""Test setup: eight simulated CPU devices for the sharding tests, CPU platform only."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
