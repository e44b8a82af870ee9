"""`recipe-jax compile`: the SFT train step compiled for TPU v5p on a CPU host."""

import pytest

from recipe_jax.config import ConfigError, load_config_file
from recipe_jax.parallel.tpu import libtpu_available
from recipe_jax.stages import compile as aot


def test_topology_names():
  assert aot.topology_name("v5p-64") == "v5p:2x4x4"
  assert aot.topology_name("v5p:2x2x1") == "v5p:2x2x1"
  with pytest.raises(ConfigError, match="topology"):
    aot.topology_name("v5p-63")


@pytest.mark.skipif(not libtpu_available(), reason="libtpu is not installed (pip install 'jax[tpu]')")
def test_tiny_moe_sft_step_compiles_for_v5p():
  # Scanned layers, as the real configs use (tests/parallel/test_tpu_compile.py compiles the
  # per-layer loop).
  scan = True
  cfg = load_config_file("configs/sft/demo_addition.py", overrides=[
      "model.family=qwen3_moe", "model.num_experts=8", "model.num_experts_per_tok=2",
      "model.moe_intermediate_size=32", "mesh.fsdp=1", "mesh.expert=2", "mesh.tensor=2",
      "num_micro_batches=2", "pipeline.seq_len=128", f"model.scan_layers={scan}", "model.remat=full"])
  compiled, mesh = aot.compile_sft_step(cfg, "v5p:2x2x1")
  lines = aot.report_lines(compiled, mesh, cfg)
  assert "4 TPU v5 chips" in lines[0] and "(fits)" in lines[1]
  assert ("loop body counted once" in lines[2]) == scan and "model FLOPs" in lines[3]
  hlo = compiled.as_text()
  assert "ragged-all-to-all" in hlo  # the TPU dispatch path, chosen by the mesh's platform
  # micro-batches are one while loop; scanned layers add theirs (forward, backward)
  assert hlo.count(" while(") >= (3 if scan else 1)


def test_every_sft_config_builds():
  for name in ("demo_addition", "tulu3_qwen3_8b", "rufus_air_glm45_air"):
    cfg = load_config_file(f"configs/sft/{name}.py")
    assert cfg.steps > 0
