"""`init_from`: the checkpoint fixes the architecture; the config chooses how it runs."""

import dataclasses

import jax
import numpy as np
import pytest

from recipe_jax.checkpoint import hf
from recipe_jax.config import ConfigError
from recipe_jax.data.pipeline import PipelineConfig
from recipe_jax.models.stacking import stack_layers
from recipe_jax.parallel.mesh import MeshConfig, make_mesh
from recipe_jax.stages.sft import DataSourceConfig, SftConfig, load_initial_model


@pytest.fixture(scope="module")
def exported(tiny_model, tmp_path_factory):
  cfg, params = tiny_model("tiny-glm")
  path = tmp_path_factory.mktemp("tiny_glm_hf")
  hf.save(path, cfg, params)
  return cfg, params, path


def _config(path, model):
  return SftConfig(model=model, pipeline=PipelineConfig(seq_len=32, batch_size=8), output_dir="unused",
                   steps=1, sources=(DataSourceConfig("unused.jsonl"),), init_from=str(path))


def test_without_a_model_config_the_checkpoint_runs_as_stored(exported):
  cfg, params, path = exported
  got_cfg, got = load_initial_model(_config(path, None), make_mesh(MeshConfig(fsdp=1)))
  assert got_cfg == cfg
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, params)


def test_runtime_fields_come_from_the_config(exported):
  cfg, params, path = exported
  want = cfg.replace(scan_layers=True, remat="full", param_dtype="bfloat16", dtype="bfloat16",
                     router_aux_loss_coef=0.5)
  got_cfg, got = load_initial_model(_config(path, want), make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2)))
  assert got_cfg == want
  assert got["layer_stacks"][1]["moe"]["gate_proj"].dtype == np.dtype("bfloat16")
  assert got["layer_stacks"][1]["moe"]["router"].dtype == np.dtype("float32")  # the router stays float32
  ref = stack_layers(cfg, params)["layer_stacks"][1]["attn"]["q_proj"]
  np.testing.assert_allclose(np.asarray(got["layer_stacks"][1]["attn"]["q_proj"], np.float32), ref, rtol=1e-2)


def test_an_architecture_that_differs_from_the_checkpoint_is_named(exported):
  cfg, _, path = exported
  wrong = cfg.replace(num_layers=4, num_experts_per_tok=1)
  with pytest.raises(ConfigError) as e:
    load_initial_model(_config(path, wrong), make_mesh(MeshConfig(fsdp=1)))
  assert "model.num_layers=4 but the checkpoint has 3" in str(e.value)
  assert "model.num_experts_per_tok=1" in str(e.value)


def test_a_model_or_a_checkpoint_is_required():
  with pytest.raises(ConfigError, match="model"):
    dataclasses.replace(_config("", None))
