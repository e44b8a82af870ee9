"""Hugging Face checkpoint import/export against transformers' own models (CPU, float32).

Tiny random `Qwen3ForCausalLM`, `Qwen3MoeForCausalLM` and `Glm4MoeForCausalLM`
models get non-trivial norms, biases and selection biases, are saved with
`save_pretrained`, loaded with `checkpoint.hf.load` and compared logit by logit.
"""

import json
import logging
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from recipe_jax.checkpoint import hf  # noqa: E402
from recipe_jax.models import abstract_params, forward  # noqa: E402
from recipe_jax.parallel.mesh import make_mesh  # noqa: E402
from recipe_jax.parallel.sharding import param_shardings, path_str  # noqa: E402

TOL = 1e-4
# One compilation per config beats hundreds of op-by-op dispatches.
_forward = jax.jit(forward, static_argnums=0, static_argnames="mesh")
_COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=256, initializer_range=0.1)
CASES = {
    "qwen3_tied": ("qwen3", dict(num_hidden_layers=2, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 5000.0})),
    "qwen3_moe": ("qwen3_moe", dict(num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                                    moe_intermediate_size=16, norm_topk_prob=False,
                                    mlp_only_layers=[1], router_aux_loss_coef=0.01)),
    "qwen3_moe_step2": ("qwen3_moe", dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                                          moe_intermediate_size=16, norm_topk_prob=True,
                                          decoder_sparse_step=2)),
    "glm": ("glm4_moe", dict(num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2,
                             moe_intermediate_size=16, n_shared_experts=1, n_group=2, topk_group=1,
                             first_k_dense_replace=1, routed_scaling_factor=1.5, attention_bias=True,
                             use_qk_norm=True, partial_rotary_factor=0.5, norm_topk_prob=True)),
    "glm_plain": ("glm4_moe", dict(num_hidden_layers=2, n_routed_experts=4, num_experts_per_tok=2,
                                   moe_intermediate_size=16, n_shared_experts=2, first_k_dense_replace=0,
                                   use_qk_norm=False, norm_topk_prob=False)),
}


def _hf_model(name: str, seed: int = 0):
  family, kw = CASES[name]
  config = transformers.AutoConfig.for_model(family, **_COMMON, **kw, attn_implementation="eager")
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for key, t in [*model.named_parameters(), *model.named_buffers()]:
      if "rotary" in key:
        continue
      noise = torch.randn(t.shape, generator=gen)
      if key.endswith("norm.weight"):
        t.copy_(1 + 0.3 * noise)
      elif key.endswith(".bias") or "correction_bias" in key:
        t.copy_(0.3 * noise)
  return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """`checkpoint(name)` -> (HF model, directory it was saved to), built once per module."""
  built = {}

  def get(name, **save_kw):
    key = (name, tuple(sorted(save_kw.items())))
    if key not in built:
      model = _hf_model(name)
      path = tmp_path_factory.mktemp(name)
      model.save_pretrained(path, **save_kw)
      built[key] = (model, path)
    return built[key]

  return get


def _tokens(batch=2, length=12, seed=0):
  return np.random.default_rng(seed).integers(0, _COMMON["vocab_size"], (batch, length))


def _hf_logits(model, tokens, **kw):
  with torch.no_grad():
    out = model(torch.tensor(tokens), **kw)
  return out


def _max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


@pytest.mark.parametrize("name", list(CASES))
def test_load_matches_transformers(checkpoint, name):
  model, path = checkpoint(name)
  cfg, params = hf.load(path)
  tokens = _tokens()
  ref = _hf_logits(model, tokens).logits.numpy()
  ours = _forward(cfg, params, tokens).logits
  assert ours.dtype == jnp.float32 and ours.shape == ref.shape
  assert _max_diff(ours, ref) <= TOL


def test_config_translation(checkpoint):
  cfg, _ = hf.load(checkpoint("glm")[1])
  assert (cfg.family, cfg.router_score, cfg.router_selection_bias) == ("glm4_moe", "sigmoid", True)
  assert (cfg.router_n_group, cfg.router_topk_group, cfg.first_k_dense) == (2, 1, 1)
  assert (cfg.partial_rotary_factor, cfg.router_scaling_factor, cfg.num_shared_experts) == (0.5, 1.5, 1)
  assert cfg.attention_bias and cfg.qk_norm and cfg.moe_layer_ids == (1, 2)
  cfg, _ = hf.load(checkpoint("qwen3_moe")[1])
  assert (cfg.router_score, cfg.router_selection_bias, cfg.router_n_group) == ("softmax", False, 1)
  assert not cfg.router_norm_topk_prob and cfg.dense_layers == (1,) and cfg.moe_layer_ids == (0, 2)
  assert cfg.router_aux_loss_coef == 0.01
  cfg, _ = hf.load(checkpoint("qwen3_moe_step2")[1])
  assert cfg.moe_layer_step == 2 and cfg.moe_layer_ids == (1,)
  cfg, params = hf.load(checkpoint("qwen3_tied")[1])
  assert cfg.tie_word_embeddings and "lm_head" not in params and cfg.rope_theta == 5000.0


def test_config_rope_spellings():
  family, kw = CASES["qwen3_moe"]
  d = transformers.AutoConfig.for_model(family, **_COMMON, **kw).to_dict()
  d.pop("rope_parameters")
  d["rope_theta"] = 123.0
  assert hf.config_from_hf(d).rope_theta == 123.0  # hub style, top level
  d["rope_parameters"] = {"rope_type": "default", "rope_theta": 77.0}
  assert hf.config_from_hf(d).rope_theta == 77.0   # transformers 5 style wins
  for scaling in ({"rope_type": "yarn", "factor": 4.0}, {"type": "linear", "factor": 2.0}):
    with pytest.raises(hf.CheckpointError, match="rope type"):
      hf.config_from_hf(d | {"rope_scaling": scaling})
  with pytest.raises(hf.CheckpointError, match="model_type"):
    hf.config_from_hf(d | {"model_type": "llama"})
  with pytest.raises(hf.CheckpointError, match="sliding"):
    hf.config_from_hf(d | {"use_sliding_window": True})


@pytest.mark.parametrize("name", list(CASES))
def test_config_round_trip(name):
  family, kw = CASES[name]
  config = transformers.AutoConfig.for_model(family, **_COMMON, **kw)
  cfg = hf.config_from_hf(config.to_dict())
  assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg
  # What transformers makes of our config.json is the same model again.
  again = transformers.AutoConfig.for_model(**hf.config_to_hf(cfg))
  assert hf.config_from_hf(again.to_dict()) == cfg


def test_aux_loss_matches_transformers(checkpoint):
  model, path = checkpoint("qwen3_moe")
  cfg, params = hf.load(path)
  tokens = _tokens()
  ref = _hf_logits(model, tokens, output_router_logits=True).aux_loss
  ours = _forward(cfg, params, tokens).aux_loss
  assert abs(float(ours) - float(ref)) <= 1e-5 and float(ref) > 0


def test_sharded_and_fused_layouts(checkpoint, tmp_path):
  model, _ = checkpoint("glm")
  _, sharded = checkpoint("glm", max_shard_size="40KB")
  assert (sharded / "model.safetensors.index.json").is_file()
  # transformers 5 holds experts fused; a state_dict saved as-is has that layout.
  state = {k: v.contiguous() for k, v in model.state_dict().items()}
  assert "model.layers.1.mlp.experts.gate_up_proj" in state
  save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
  shutil.copy(sharded / "config.json", tmp_path / "config.json")
  tokens = _tokens()
  ref = _hf_logits(model, tokens).logits.numpy()
  for path in (sharded, tmp_path):
    cfg, params = hf.load(path)
    assert _max_diff(_forward(cfg, params, tokens).logits, ref) <= TOL


def test_partial_reads_match_full_reads(checkpoint):
  """`Source.read` of any block equals the block of the full read (heads, head_dim, experts)."""
  _, path = checkpoint("glm")
  cfg, params = hf.load(path)
  files = hf._open(path)
  get = lambda k, s: files[k].read(k, s)
  rng = np.random.default_rng(0)
  for key, source in hf.tensor_map(cfg).items():
    full = params
    for part in key.split("."):
      full = full[int(part) if part.isdigit() else part]
    full = np.asarray(full)
    for _ in range(3):
      index = []
      for n in full.shape:
        a = int(rng.integers(0, n))
        index.append(slice(a, int(rng.integers(a + 1, n + 1))))
      np.testing.assert_array_equal(source.read(get, tuple(index)), full[tuple(index)])


def test_bfloat16_checkpoint(checkpoint, tmp_path):
  _, path = checkpoint("glm")
  _hf_model("glm").to(torch.bfloat16).save_pretrained(tmp_path)
  cfg16, p16 = hf.load(tmp_path)
  assert cfg16.param_dtype == "bfloat16"
  _, p32 = hf.load(tmp_path, dtype=jnp.float32)
  _, ref = hf.load(path)
  assert p16["layers"][1]["moe"]["router"].dtype == jnp.float32  # the router stays float32
  assert p16["embed"].dtype == jnp.bfloat16
  for a, b, r in zip(jax.tree.leaves(p16), jax.tree.leaves(p32), jax.tree.leaves(ref)):
    assert b.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(r.astype(jnp.bfloat16), np.float32))
  hf.save(tmp_path / "again", cfg16, p16)  # bfloat16 parameters are written as BF16
  with safe_open(tmp_path / "again" / "model.safetensors", "pt") as f:
    assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    assert f.get_slice("model.layers.1.mlp.gate.weight").get_dtype() == "F32"
  _, again = hf.load(tmp_path / "again")
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x, np.float32),
                                                          np.asarray(y, np.float32)), p16, again)


def test_mtp_layer_is_skipped(checkpoint, tmp_path, caplog):
  _, path = checkpoint("glm")
  shutil.copytree(path, tmp_path, dirs_exist_ok=True)
  state = load_file(tmp_path / "model.safetensors")
  n = CASES["glm"][1]["num_hidden_layers"]
  state[f"model.layers.{n}.eh_proj.weight"] = torch.zeros(32, 64)
  state[f"model.layers.{n}.mlp.experts.0.up_proj.weight"] = torch.zeros(16, 32)
  save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["num_nextn_predict_layers"] == 1
  with caplog.at_level(logging.INFO, logger="recipe_jax.checkpoint.hf"):
    hf.load(tmp_path)
  assert "multi-token-prediction" in caplog.text
  config["num_nextn_predict_layers"] = 0  # without the MTP declaration they are errors
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(hf.CheckpointError, match=f"model.layers.{n}.eh_proj.weight"):
    hf.load(tmp_path)


def test_bad_checkpoints_list_every_problem(checkpoint, tmp_path):
  _, path = checkpoint("qwen3_moe")
  shutil.copytree(path, tmp_path, dirs_exist_ok=True)
  state = load_file(tmp_path / "model.safetensors")
  missing = ["model.layers.0.mlp.experts.3.down_proj.weight", "model.layers.2.self_attn.k_norm.weight"]
  for k in missing:
    del state[k]
  state["model.layers.0.mlp.extra.weight"] = torch.zeros(4)
  state["model.layers.1.mlp.up_proj.weight"] = torch.zeros(64, 31)
  save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(hf.CheckpointError) as err:
    hf.load(tmp_path)
  message = str(err.value)
  for k in missing + ["model.layers.0.mlp.extra.weight", "model.layers.1.mlp.up_proj.weight"]:
    assert k in message
  assert "4 problems" in message and "(64, 31)" in message


@pytest.mark.parametrize("name", ["qwen3_tied", "qwen3_moe", "glm"])
def test_save_round_trip_through_transformers(checkpoint, tmp_path, name):
  cfg, params = hf.load(checkpoint(name)[1])
  rng = np.random.default_rng(7)  # our own weights, not the ones transformers saved
  params = jax.tree.map(lambda x: x + 0.2 * rng.standard_normal(x.shape, np.float32), params)
  hf.save(tmp_path, cfg, params, max_shard_bytes=64 << 10)
  files = {p.name for p in tmp_path.iterdir()}
  assert "config.json" in files and "model.safetensors.index.json" in files
  model, info = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
  tokens = _tokens(seed=1)
  ours = _forward(cfg, params, tokens).logits
  assert _max_diff(ours, _hf_logits(model.eval(), tokens).logits.numpy()) <= TOL
  cfg2, params2 = hf.load(tmp_path)
  assert cfg2 == cfg
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_save_rejects_wrong_params(checkpoint, tmp_path):
  cfg, params = hf.load(checkpoint("qwen3_tied")[1])
  params = dict(params, lm_head=jnp.zeros((32, 128)))
  with pytest.raises(hf.CheckpointError, match="unexpected parameter lm_head"):
    hf.save(tmp_path, cfg, params)
  with pytest.raises(hf.CheckpointError, match="partial_rotary_factor"):
    hf.save(tmp_path, cfg.replace(partial_rotary_factor=0.5), params)


def test_load_onto_mesh(checkpoint, monkeypatch):
  if jax.device_count() < 8:
    pytest.skip("needs 8 devices (tests/conftest.py sets XLA_FLAGS for 8 CPU devices)")
  model, path = checkpoint("glm")
  mesh = make_mesh((1, 2, 2, 2))
  reads, read = [], hf._SafetensorsFile.read

  def counting_read(self, key, index):
    out = read(self, key, index)
    reads.append((key, out.size))
    return out

  monkeypatch.setattr(hf._SafetensorsFile, "read", counting_read)
  cfg, params = hf.load(path, mesh)
  # The embedding [V, D] is split eight ways (V over tensor, D over fsdp x expert); no read
  # fetches more than an eighth.
  embed = [n for k, n in reads if k == "model.embed_tokens.weight"]
  assert embed and max(embed) == _COMMON["vocab_size"] * _COMMON["hidden_size"] // 8
  # An expert's [M, D] weight is read only by its expert shard, a quarter (tensor x fsdp) at a time.
  expert = [n for k, n in reads if k == "model.layers.1.mlp.experts.5.up_proj.weight"]
  assert len(expert) == 4 and max(expert) == 16 * 32 // 4
  want = param_shardings(cfg, abstract_params(cfg), mesh)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  for (p, x), s in zip(flat, jax.tree.leaves(want)):
    assert x.sharding == s, path_str(p)
  assert any(len(set(x.sharding.spec) - {None}) >= 2 for _, x in flat)
  tokens = _tokens(batch=4)
  ours = _forward(cfg, params, tokens, mesh=mesh).logits
  assert _max_diff(ours, _hf_logits(model, tokens).logits.numpy()) <= TOL


@pytest.mark.parametrize("name", ["glm", "qwen3_moe"])
def test_stacked_layout_loads_and_saves_layer_by_layer(checkpoint, tmp_path, name):
  from recipe_jax.models.stacking import stack_layers, unstack_layers

  model, path = checkpoint(name)
  cfg, params = hf.load(path)
  scfg, stacked = hf.load(path, scan_layers=True)
  assert scfg == cfg.replace(scan_layers=True) and "layers" not in stacked
  jax.tree.map(np.testing.assert_array_equal, stack_layers(cfg, params), stacked)
  if jax.device_count() >= 8:  # read straight onto the shards of a mesh
    _, on_mesh = hf.load(path, make_mesh((1, 2, 2, 2)), scan_layers=True)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), on_mesh, stacked)
  tokens = _tokens(seed=3)
  ref = _hf_logits(model, tokens).logits.numpy()
  assert _max_diff(_forward(scfg, stacked, tokens).logits, ref) <= TOL
  hf.save(tmp_path, scfg, stacked, max_shard_bytes=16 << 10)
  cfg2, params2 = hf.load(tmp_path)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, unstack_layers(scfg, stacked), params2)
