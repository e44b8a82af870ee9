"""The `recipe-jax` command line.

    recipe-jax models                       # presets with parameter counts, then a tiny forward pass
    recipe-jax models --config configs/models/tiny_moe.py --set model.num_layers=4
    recipe-jax models --set mesh.expert=2   # the forward pass expert-parallel over 2 devices
    recipe-jax sft --config configs/sft/demo_addition.py [--set steps=100] [--resume] [--strict]
    recipe-jax dpo --config configs/dpo/demo_addition.py [--set loss.beta=2.0] [--resume] [--strict]
    recipe-jax rl --config configs/rl/demo_addition.py [--set rollout.group_size=16] [--resume]
    recipe-jax distill --config configs/distill/demo_opd.py [--resume]
    recipe-jax data decontaminate|dedup|grade|score|mix ...   # data curation (recipe-jax data --help)
    recipe-jax serve [--config FILE] [--set port=9000]  # JetStream gRPC server, token ids in and out
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from recipe_jax.config import ConfigError, load_config_file, load_typed_config, override
from recipe_jax.models.config import ModelConfig
from recipe_jax.parallel.mesh import MeshConfig


@dataclasses.dataclass(frozen=True)
class ForwardDemoConfig:
  """One forward pass of a model on random tokens (the `models` command)."""

  model: ModelConfig
  mesh: MeshConfig = MeshConfig(fsdp=1)
  batch_size: int = 8
  seq_len: int = 64
  seed: int = 0

  def __post_init__(self):
    if self.batch_size < 1 or self.seq_len < 1:
      raise ConfigError("batch_size and seq_len must be positive")


def default_demo_config() -> ForwardDemoConfig:
  from recipe_jax.models.presets import get_preset
  return ForwardDemoConfig(model=get_preset("tiny-moe"))


def _fmt(n: float) -> str:
  for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if n >= scale:
      return f"{n / scale:.2f}{unit}"
  return str(int(n))


def cmd_models(args) -> int:
  import jax
  import jax.numpy as jnp

  from recipe_jax.models import PRESETS, forward, init_params, param_counts
  from recipe_jax.parallel.mesh import make_mesh

  print(f"{'preset':<15}{'family':<11}{'layers':>7}{'experts':>10}{'total':>10}{'active':>10}"
        f"{'active w/o emb':>16}")
  for name, cfg in PRESETS.items():
    c = param_counts(cfg)
    experts = f"{cfg.num_experts_per_tok}/{cfg.num_experts}" if cfg.is_moe else "-"
    print(f"{name:<15}{cfg.family:<11}{cfg.num_layers:>7}{experts:>10}{_fmt(c.total):>10}"
          f"{_fmt(c.active):>10}{_fmt(c.active_non_embedding):>16}")

  demo = load_config_file(args.config, overrides=args.set) if args.config else \
      override(default_demo_config(), args.set)
  cfg = demo.model
  mesh = make_mesh(demo.mesh, jax.devices())
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  print(f"\nforward pass: {cfg.family} model, {cfg.num_layers} layers, batch {demo.batch_size} x "
        f"{demo.seq_len} tokens, mesh {sizes}, moe_impl={cfg.moe_impl}")
  params = init_params(cfg, mesh=mesh, seed=demo.seed)
  tokens = jax.random.randint(jax.random.key(demo.seed + 1), (demo.batch_size, demo.seq_len), 0,
                              cfg.vocab_size)
  run = jax.jit(lambda p, t: forward(cfg, p, t, mesh=mesh))
  start = time.perf_counter()
  out = jax.block_until_ready(run(params, tokens))
  first = time.perf_counter() - start
  start = time.perf_counter()
  out = jax.block_until_ready(run(params, tokens))
  second = time.perf_counter() - start
  print(f"logits {tuple(out.logits.shape)} {out.logits.dtype}, finite: {bool(jnp.isfinite(out.logits).all())}; "
        f"compile+run {first:.2f}s, run {second * 1e3:.1f}ms")
  if cfg.is_moe:
    ref = jax.jit(lambda p, t: forward(cfg.replace(moe_impl="dense"), p, t))(params, tokens)
    diff = float(jnp.abs(ref.logits - out.logits).max())
    print(f"expert ids {tuple(out.expert_ids.shape)}, aux loss {float(out.aux_loss):.4f}, "
          f"tokens per expert (layer 0) {out.expert_load[0].astype(int).tolist()}")
    print(f"max |logits - dense reference| = {diff:.2e}")
  return 0


# stage command -> (module, config class name, what its config file defines)
_STAGES = {"sft": ("recipe_jax.stages.sft", "SftConfig"), "dpo": ("recipe_jax.stages.dpo", "DpoConfig"),
           "rl": ("recipe_jax.stages.rl", "RlConfig"), "distill": ("recipe_jax.stages.distill", "DistillConfig")}


def cmd_stage(args) -> int:
  """sft / dpo / rl: load the config, check its type, run the stage, print the summary."""
  import importlib
  import json
  import logging

  module_name, class_name = _STAGES[args.command]
  stage = importlib.import_module(module_name)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  overrides = list(args.set) + (["strict=True"] if getattr(args, "strict", False) else [])
  cfg = load_typed_config(args.config, getattr(stage, class_name), overrides=overrides)
  summary = stage.run(cfg, resume=args.resume)
  print(json.dumps({k: v for k, v in summary.items() if k not in ("data", "prompts")}, indent=1))
  return 0


def cmd_compile(args) -> int:
  from recipe_jax.stages import compile as aot
  from recipe_jax.stages.sft import SftConfig

  cfg = load_typed_config(args.config, SftConfig, overrides=args.set)
  compiled, mesh = aot.compile_sft_step(cfg, args.topology)
  print("\n".join(aot.report_lines(compiled, mesh, cfg)))
  return 0


def cmd_serve(args) -> int:
  import logging

  from recipe_jax.models.presets import get_preset
  from recipe_jax.sampling import serve

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  cfg = load_typed_config(args.config, serve.ServeConfig, overrides=args.set,
                          default=serve.ServeConfig(model=get_preset("tiny-moe")))
  serve.run(cfg)
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="recipe-jax", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  models = sub.add_parser("models", help="list model presets and run a tiny forward pass")
  models.add_argument("--config", help="a config file from configs/models/ (default: tiny MoE)")
  models.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config field, e.g. model.num_layers=2 (repeatable)")
  models.set_defaults(fn=cmd_models)
  stages = (("sft", "supervised fine-tuning (configs/sft/)", "steps=100"),
            ("dpo", "preference optimization: DPO, length-normalized DPO, SimPO, IPO (configs/dpo/)",
             "loss.beta=2.0"),
            ("rl", "RL with verifiable rewards: GRPO, GSPO (configs/rl/)", "rollout.group_size=16"),
            ("distill", "on-policy distillation: OPD, multi-teacher MOPD (configs/distill/)",
             "sampling.samples_per_prompt=8"))
  for name, help_text, example in stages:
    stage = sub.add_parser(name, help=help_text)
    stage.add_argument("--config", required=True, help=f"a config file defining get_config() -> "
                       f"{_STAGES[name][1]}")
    stage.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help=f"override a config field, e.g. {example} (repeatable)")
    stage.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint")
    if name not in ("rl", "distill"):
      stage.add_argument("--strict", action="store_true", help="the first invalid record is an error")
    stage.set_defaults(fn=cmd_stage)
  data = sub.add_parser("data", help="data curation: decontaminate, dedup, grade, score, mix "
                        "(recipe-jax data --help)", add_help=False)
  data.add_argument("data_args", nargs=argparse.REMAINDER)
  comp = sub.add_parser("compile", help="compile a stage's train step for a TPU topology, ahead of time")
  comp.add_argument("--config", required=True, help="an SFT config file")
  comp.add_argument("--topology", default="v5p:2x2x1", help="v5p-8 ... v5p-512, or a chip grid like v5p:2x2x1")
  comp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
  comp.set_defaults(fn=cmd_compile)
  serve_cmd = sub.add_parser("serve", help="serve a model with JetStream's orchestrator over gRPC (token ids)")
  serve_cmd.add_argument("--config", help="a config file defining get_config() -> ServeConfig "
                         "(default: tiny MoE, random weights)")
  serve_cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config field, e.g. port=9001 (repeatable)")
  serve_cmd.set_defaults(fn=cmd_serve)
  return parser


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv[:1] == ["data"]:  # the curation tools parse their own arguments (and --help)
    from recipe_jax.curation import cli as curation_cli
    return curation_cli.main(argv[1:])
  args = build_parser().parse_args(argv)
  try:
    return args.fn(args)
  except ConfigError as e:
    print(f"recipe-jax: config error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
