"""The `recipe-jax` command line.

    recipe-jax models                       # presets with parameter counts, then a tiny forward pass
    recipe-jax models --config configs/models/tiny_moe.py --set model.num_layers=4
    recipe-jax models --set mesh.expert=2   # the forward pass expert-parallel over 2 devices
    recipe-jax sft --config configs/sft/demo_addition.py [--set steps=100] [--resume] [--strict]
    recipe-jax dpo --config configs/dpo/demo_addition.py [--set loss.beta=2.0] [--resume] [--strict]
    recipe-jax serve [--config FILE] [--set port=9000]  # JetStream gRPC server, token ids in and out
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from recipe_jax.config import ConfigError, load_config_file, override
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


def cmd_sft(args) -> int:
  import json
  import logging

  from recipe_jax.stages import sft

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  overrides = list(args.set) + (["strict=True"] if args.strict else [])
  cfg = load_config_file(args.config, overrides=overrides)
  if not isinstance(cfg, sft.SftConfig):
    raise ConfigError(f"{args.config} does not define an SftConfig")
  summary = sft.run(cfg, resume=args.resume)
  print(json.dumps({k: v for k, v in summary.items() if k != "data"}, indent=1))
  return 0


def cmd_dpo(args) -> int:
  import json
  import logging

  from recipe_jax.stages import dpo

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  overrides = list(args.set) + (["strict=True"] if args.strict else [])
  cfg = load_config_file(args.config, overrides=overrides)
  if not isinstance(cfg, dpo.DpoConfig):
    raise ConfigError(f"{args.config} does not define a DpoConfig")
  summary = dpo.run(cfg, resume=args.resume)
  print(json.dumps({k: v for k, v in summary.items() if k != "data"}, indent=1))
  return 0


def cmd_compile(args) -> int:
  from recipe_jax.stages import compile as aot
  from recipe_jax.stages.sft import SftConfig

  cfg = load_config_file(args.config, overrides=args.set)
  if not isinstance(cfg, SftConfig):
    raise ConfigError(f"{args.config} does not define an SftConfig")
  compiled, mesh = aot.compile_sft_step(cfg, args.topology)
  print("\n".join(aot.report_lines(compiled, mesh, cfg)))
  return 0


def cmd_serve(args) -> int:
  import logging

  from recipe_jax.models.presets import get_preset
  from recipe_jax.sampling import serve

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  cfg = load_config_file(args.config, overrides=args.set) if args.config else \
      override(serve.ServeConfig(model=get_preset("tiny-moe")), args.set)
  if not isinstance(cfg, serve.ServeConfig):
    raise ConfigError(f"{args.config} does not define a ServeConfig")
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
  sft_cmd = sub.add_parser("sft", help="supervised fine-tuning (configs/sft/)")
  sft_cmd.add_argument("--config", required=True, help="a config file defining get_config() -> SftConfig")
  sft_cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. steps=100 (repeatable)")
  sft_cmd.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint")
  sft_cmd.add_argument("--strict", action="store_true", help="the first invalid record is an error")
  sft_cmd.set_defaults(fn=cmd_sft)
  dpo_cmd = sub.add_parser("dpo", help="preference optimization: DPO, length-normalized DPO, SimPO, IPO "
                           "(configs/dpo/)")
  dpo_cmd.add_argument("--config", required=True, help="a config file defining get_config() -> DpoConfig")
  dpo_cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. loss.beta=2.0 (repeatable)")
  dpo_cmd.add_argument("--resume", action="store_true", help="continue from the latest good checkpoint")
  dpo_cmd.add_argument("--strict", action="store_true", help="the first invalid record is an error")
  dpo_cmd.set_defaults(fn=cmd_dpo)
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
  args = build_parser().parse_args(argv)
  try:
    return args.fn(args)
  except ConfigError as e:
    print(f"recipe-jax: config error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
