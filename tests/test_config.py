"""Typed configs: validation on construction, dotted overrides, config files."""

import dataclasses

import pytest

from recipe_jax.cli import ForwardDemoConfig
from recipe_jax.config import ConfigError, load_config_file, override
from recipe_jax.models import get_preset
from recipe_jax.models.config import ModelConfig
from recipe_jax.parallel.mesh import MeshConfig


@pytest.mark.parametrize("changes,field", [
    (dict(num_heads=6, num_kv_heads=4), "num_kv_heads"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok"),
    (dict(router_n_group=3), "router_n_group"),
    (dict(router_topk_group=5, router_n_group=4), "router_topk_group"),
    (dict(partial_rotary_factor=0.0), "partial_rotary_factor"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(first_k_dense=9), "first_k_dense"),
])
def test_inconsistent_fields_name_the_field(changes, field):
  with pytest.raises(ConfigError, match=f"^{field}:"):
    get_preset("tiny-glm").replace(**changes)


def test_group_limited_top_k_must_fit_in_the_kept_groups():
  # 8 experts in 4 groups of 2, one group kept: at most 2 selectable experts.
  with pytest.raises(ConfigError, match="num_experts_per_tok"):
    get_preset("tiny-glm").replace(router_n_group=4, router_topk_group=1, num_experts_per_tok=3)


def test_config_is_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    get_preset("tiny-moe").num_layers = 3


def test_overrides_apply_nested_and_typed():
  demo = ForwardDemoConfig(model=get_preset("tiny-moe"))
  out = override(demo, ["model.num_layers=4", "model.router_score=sigmoid", "mesh.expert=2",
                        "model.dense_layers=(0,)", "seq_len=16", "model.rope_theta=1e4"])
  assert out.model.num_layers == 4 and out.model.router_score == "sigmoid"
  assert out.mesh == MeshConfig(fsdp=1, expert=2) and out.seq_len == 16
  assert out.model.dense_layers == (0,) and out.model.rope_theta == 10000.0
  assert demo.model.num_layers == 2  # the original is untouched


@pytest.mark.parametrize("item,message", [
    ("model.num_layrs=2", "unknown key 'num_layrs'"),
    ("modle.num_layers=2", "unknown key 'modle'"),
    ("model.num_layers=two", "expected an integer"),
    ("model.router_score=relu", "not one of"),
    ("model.qk_norm=maybe", "expected true or false"),
    ("model.num_layers", "expected key=value"),
    ("seed.x=1", "has no fields"),
])
def test_bad_overrides_are_rejected(item, message):
  with pytest.raises(ConfigError, match=message):
    override(ForwardDemoConfig(model=get_preset("tiny-moe")), [item])


def test_override_runs_validation():
  with pytest.raises(ConfigError, match="num_experts_per_tok"):
    override(get_preset("tiny-moe"), {"num_experts_per_tok": 99})


def test_config_files_load(tmp_path):
  cfg = load_config_file("configs/models/tiny_glm.py", overrides=["model.num_layers=5"])
  assert cfg.model.num_layers == 5 and cfg.mesh.tensor == 2
  with pytest.raises(ConfigError, match="does not exist"):
    load_config_file(tmp_path / "missing.py")
  bad = tmp_path / "bad.py"
  bad.write_text("X = 1\n")
  with pytest.raises(ConfigError, match="get_config"):
    load_config_file(bad)


def test_every_config_file_builds():
  import pathlib
  files = sorted(pathlib.Path("configs").rglob("*.py"))
  assert files
  for f in files:
    cfg = load_config_file(f)
    if hasattr(cfg, "model"):  # DPO configs take the architecture from init_from
      assert isinstance(cfg.model, ModelConfig), f
    elif hasattr(cfg, "init_from"):  # stages that start from a checkpoint
      assert cfg.init_from, f
