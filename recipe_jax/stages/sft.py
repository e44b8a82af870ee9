"""Supervised fine-tuning, top to bottom: `recipe-jax sft --config configs/sft/<file>.py`.

mesh -> tokenizer -> data (Grain: read, validate, render, pack) -> model (fresh or a
Hugging Face checkpoint) -> train state -> jitted step -> loop (step, log, checkpoint)
-> drop report, Hugging Face export, and the demo task's held-out exact match.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Literal

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.checkpoint.orbax import CheckpointConfig, Checkpointer, abstract_state
from recipe_jax.config import ConfigError, require, to_dict
from recipe_jax.data.pipeline import PipelineConfig, SftPipeline, Source, global_batch
from recipe_jax.data.sources import ArrayRecordSource, JsonlSource, ParquetSource, tfds_source
from recipe_jax.data.validate import sft_example_fn
from recipe_jax.models import ModelConfig, init_params
from recipe_jax.parallel.mesh import BATCH_AXES, MeshConfig, make_mesh
from recipe_jax.stages.sft_objective import SftLossConfig, make_sft_loss, sft_normalizers
from recipe_jax.training import (OptimizerConfig, init_train_state, jit_train_step, learning_rate_schedule,
                                 make_optimizer, make_train_step)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DataSourceConfig:
  path: str
  kind: Literal["jsonl", "parquet", "arrayrecord", "tfds"] = "jsonl"
  weight: float = 1.0
  name: str = ""
  split: str = "train"  # tfds only


@dataclasses.dataclass(frozen=True)
class DemoTaskConfig:
  """The locally generated addition task: data and tokenizer are made if missing."""

  train_records: int = 20_000
  eval_records: int = 200
  digits: int = 3
  fixed_width: bool = False    # operands with leading zeros ("07 + 45")
  tokenizer_vocab: int = 320
  seed: int = 0


# With `init_from`, the checkpoint fixes the architecture; these fields of `SftConfig.model`
# choose how it runs.
# (`router_aux_loss_coef` is a training choice; `initializer_range` does not matter for
# loaded weights.)
RUNTIME_FIELDS = ("dtype", "param_dtype", "moe_impl", "moe_all_to_all", "attention_impl", "remat",
                  "scan_layers", "router_aux_loss_coef", "initializer_range")


@dataclasses.dataclass(frozen=True)
class SftConfig:
  """`model` is the architecture to train from scratch; with `init_from` it may be None (run the
  checkpoint as stored) or name the architecture to check against the checkpoint plus how to run
  it (`RUNTIME_FIELDS`)."""

  model: ModelConfig | None
  pipeline: PipelineConfig
  output_dir: str
  steps: int
  sources: tuple[DataSourceConfig, ...] = ()
  init_from: str = ""          # a Hugging Face checkpoint directory; empty = fresh weights
  tokenizer: str = ""          # a tokenizer directory; empty = init_from's, or the demo's
  template: Literal["qwen3", "glm45"] = "qwen3"
  policy: Literal["all_assistant", "final_response"] = "all_assistant"
  strict: bool = False
  loss: SftLossConfig = SftLossConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  mesh: MeshConfig = MeshConfig()
  num_micro_batches: int = 1
  seed: int = 0
  log_every: int = 10
  checkpoint_every: int = 100
  keep_checkpoints: int = 3
  peak_flops_per_second: float = 459e12  # per chip (TPU v5p bf16); MFU is against chips x this
  progress: bool = True
  export_hf: bool = True
  demo: DemoTaskConfig | None = None

  def __post_init__(self):
    require(self.steps >= 1, "steps", "must be >= 1")
    require(self.num_micro_batches >= 1, "num_micro_batches", "must be >= 1")
    require(self.pipeline.batch_size % self.num_micro_batches == 0, "num_micro_batches",
            f"must divide pipeline.batch_size={self.pipeline.batch_size}")
    require(bool(self.sources) or self.demo is not None, "sources", "name at least one data source")
    require(self.model is not None or bool(self.init_from), "model",
            "give a model config, or init_from a checkpoint")


# ----------------------------------------------------------------------------
# Data and tokenizer
# ----------------------------------------------------------------------------


def open_source(s: DataSourceConfig):
  """The record source a `DataSourceConfig` names."""
  if s.kind == "jsonl":
    return JsonlSource(s.path)
  if s.kind == "parquet":
    return ParquetSource(s.path)
  if s.kind == "arrayrecord":
    return ArrayRecordSource(s.path)
  return tfds_source(s.path, split=s.split)


def prepare_demo(cfg: SftConfig) -> tuple[tuple[DataSourceConfig, ...], str]:
  """Writes the demo's train/eval JSONL and trains its tokenizer, once, under output_dir."""
  from recipe_jax.data.tokenizer import train_tokenizer
  from recipe_jax.demo import addition

  d, root = cfg.demo, pathlib.Path(cfg.output_dir)
  train = root / "data" / "train.jsonl"
  tok_dir = root / "tokenizer"
  if not train.exists():
    held_out = addition.make_records(d.eval_records, digits=d.digits, seed=d.seed + 1,
                                     fixed_width=d.fixed_width)
    questions = {r["messages"][0]["content"] for r in held_out}
    addition.write_jsonl(held_out, root / "data" / "eval.jsonl")
    addition.write_jsonl(addition.make_records(d.train_records, digits=d.digits, seed=d.seed,
                                               fixed_width=d.fixed_width, exclude=questions), train)
  if not (tok_dir / "tokenizer.json").exists():
    texts = [json.dumps(r) for r in addition.make_records(2000, digits=d.digits, seed=d.seed + 2)]
    train_tokenizer(texts, template=cfg.template, vocab_size=d.tokenizer_vocab).save_pretrained(tok_dir)
  return (DataSourceConfig(str(train), name="addition"),), str(tok_dir)


def load_initial_model(cfg: SftConfig, mesh) -> tuple[ModelConfig, dict]:
  """The `init_from` checkpoint on `mesh`, run as `cfg.model`'s `RUNTIME_FIELDS` say.

  Raises ConfigError naming every architecture field where `cfg.model` and the
  checkpoint disagree.
  """
  from recipe_jax.checkpoint import hf

  want = cfg.model
  dtype = want.param_dtype if want is not None else None
  stored, params = hf.load(cfg.init_from, mesh=mesh, dtype=dtype,
                           scan_layers=want.scan_layers if want is not None else False)
  if want is None:
    return stored, params
  runtime = {name: getattr(want, name) for name in RUNTIME_FIELDS}
  differ = [f"model.{f.name}={getattr(want, f.name)!r} but the checkpoint has {getattr(stored, f.name)!r}"
            for f in dataclasses.fields(ModelConfig)
            if f.name not in RUNTIME_FIELDS and getattr(want, f.name) != getattr(stored, f.name)]
  if differ:
    raise ConfigError(f"init_from {cfg.init_from}: the model config does not describe this checkpoint "
                      "(drop `model` to use the checkpoint's own):\n  " + "\n  ".join(differ))
  return stored.replace(**runtime), params


# ----------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------


def run(cfg: SftConfig, *, resume: bool = False) -> dict:
  """Trains; returns a summary dict (final loss, drop report, demo accuracy if any)."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import load_tokenizer

  out_dir = pathlib.Path(cfg.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  mesh = make_mesh(cfg.mesh)

  # --- tokenizer and data -----------------------------------------------------
  sources, tok_path = cfg.sources, cfg.tokenizer or cfg.init_from
  if cfg.demo is not None:
    sources, tok_path = prepare_demo(cfg)
  tokenizer = load_tokenizer(tok_path)
  example_fn = sft_example_fn(tokenizer, template=cfg.template, policy=cfg.policy, strict=cfg.strict)
  pipeline_cfg = dataclasses.replace(cfg.pipeline, strict=cfg.strict or cfg.pipeline.strict)
  pipeline = SftPipeline([Source(s.name or pathlib.Path(s.path).stem, open_source(s), s.weight)
                          for s in sources], example_fn, pipeline_cfg)

  # --- model and train state ----------------------------------------------------
  if cfg.init_from:
    model_cfg, params = load_initial_model(cfg, mesh)
  else:
    model_cfg, params = cfg.model, init_params(cfg.model, mesh=mesh, seed=cfg.seed)
  if len(tokenizer) > model_cfg.vocab_size:
    raise ConfigError(f"model.vocab_size: {model_cfg.vocab_size} is smaller than the tokenizer's "
                      f"{len(tokenizer)} tokens")
  optimizer = make_optimizer(cfg.optimizer)
  state = jax.jit(lambda p: init_train_state(p, optimizer))(params)
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  loss_fn = make_sft_loss(model_cfg, cfg.loss, num_micro_batches=cfg.num_micro_batches, mesh=mesh)
  step_fn = jit_train_step(
      make_train_step(loss_fn, optimizer, normalizers_fn=sft_normalizers,
                      num_micro_batches=cfg.num_micro_batches,
                      learning_rate_fn=learning_rate_schedule(cfg.optimizer)),
      state_shardings=state_shardings, batch_shardings=NamedSharding(mesh, P(BATCH_AXES)))

  # --- resume -------------------------------------------------------------------------
  checkpointer = Checkpointer(CheckpointConfig(str(out_dir / "checkpoints"), every_steps=cfg.checkpoint_every,
                                               keep_last=cfg.keep_checkpoints))
  if checkpointer.steps():
    if not resume:
      raise ConfigError(f"output_dir: {out_dir} already holds checkpoints {checkpointer.steps()}; "
                        "pass --resume to continue, or choose another output_dir")
    restored = checkpointer.restore(abstract_state(state, state_shardings))
    state = restored.state
    pipeline.set_state(restored.data_state)
    print(f"resumed from step {restored.step} of {checkpointer.steps()}", flush=True)

  # --- loop -----------------------------------------------------------------------
  from recipe_jax.metrics import MetricsWriter, train_flops_per_token
  seq_len, rows = cfg.pipeline.seq_len, cfg.pipeline.batch_size * jax.process_count()
  writer = MetricsWriter(out_dir / "metrics", peak_flops_per_second=cfg.peak_flops_per_second * len(mesh.devices.flat),
                         flops_per_token=train_flops_per_token(model_cfg, seq_len), total_steps=cfg.steps,
                         progress=cfg.progress, start_step=int(state.step))
  metrics = {}
  with checkpointer, writer:
    for step in range(int(state.step), cfg.steps):
      batch = global_batch(next(pipeline), mesh)
      state, metrics = step_fn(state, batch)
      writer.write(step + 1, metrics, tokens=rows * seq_len)
      checkpointer.maybe_save(step + 1, state, pipeline.get_state(), to_dict(cfg), force=step + 1 == cfg.steps)
      if (step + 1) % cfg.log_every == 0:
        log.info("step %d loss %.4f %s", step + 1, float(metrics["loss"]), pipeline.report().summary())

  # --- report, export, evaluate -----------------------------------------------------
  report = pipeline.report()
  print(report.table())
  summary = {"steps": int(state.step), "final_loss": float(metrics["loss"]) if metrics else None,
             "data": report.to_state()}
  if cfg.export_hf:
    hf.save(out_dir / "hf", model_cfg, state.params)
    tokenizer.save_pretrained(out_dir / "hf")
  if cfg.demo is not None:
    from recipe_jax.demo import addition
    eval_records = [json.loads(line) for line in (out_dir / "data" / "eval.jsonl").read_text().splitlines()]
    summary["demo_exact_match"] = addition.exact_match(model_cfg, state.params, tokenizer, eval_records)
  (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
  return summary
