"""SFT train-step throughput: tokens/s and FLOP/s against this machine's measured matmul peak, ours and Tunix's.

Both implementations train the same tiny Qwen3 (same sizes, float32) on the same
synthetic packed batch `[B, T]` (each row holds `--segments` documents; tokens attend
within their document; every next-token target inside a document is supervised)
with AdamW after global-norm clipping. A step's FLOPs are
`train_flops_per_token(config, T) * B * T` for both, so the FLOP/s column is the
token rate times one constant. The peak is measured in the same process: a jitted
chain of float32 `[n, n] @ [n, n]` products on the same device, `2 n^3` FLOPs each.

The Tunix side (`google-tunix`, its `tunix.models.qwen3` model and the train step
of its `PeftTrainer`) runs only when `import tunix` works in this environment;
otherwise a line says why it was skipped.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from recipe_jax.metrics import train_flops_per_token
from recipe_jax.models import ModelConfig, get_preset, init_params
from recipe_jax.stages.sft_objective import SftLossConfig, make_sft_loss, sft_normalizers
from recipe_jax.training.optimizer import OptimizerConfig, make_optimizer
from recipe_jax.training.step import init_train_state, jit_train_step, make_train_step

LEARNING_RATE = 1e-4


def tiny_qwen3(*, hidden_size: int = 256, intermediate_size: int = 768, num_layers: int = 4,
               num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 64,
               vocab_size: int = 4096) -> ModelConfig:
  return get_preset("tiny-dense").replace(
      hidden_size=hidden_size, intermediate_size=intermediate_size, num_layers=num_layers,
      num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_size)


def synthetic_batch(cfg: ModelConfig, batch: int, seq_len: int, *, segments: int = 2, seed: int = 0) -> dict:
  """Packed rows of `segments` equal documents of random tokens; all in-document targets supervised."""
  if seq_len % segments:
    raise ValueError(f"seq_len={seq_len} does not split into {segments} segments")
  length = seq_len // segments
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, (batch, seq_len), dtype=np.int32)
  segment_ids = np.repeat(np.arange(1, segments + 1, dtype=np.int32), length)[None].repeat(batch, 0)
  positions = np.tile(np.arange(length, dtype=np.int32), segments)[None].repeat(batch, 0)
  last = positions == length - 1                    # no next token inside the document
  targets = np.where(last, 0, np.roll(tokens, -1, axis=1)).astype(np.int32)
  loss_mask = (~last).astype(np.float32)
  return {k: jnp.asarray(v) for k, v in dict(tokens=tokens, targets=targets, loss_mask=loss_mask,
                                               segment_ids=segment_ids, positions=positions).items()}


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure_matmul_peak(*, n: int = 2048, chain: int = 4, repeats: int = 3) -> float:
  """FLOP/s of a jitted chain of `chain` float32 `[n, n] @ [n, n]` products (median of `repeats`)."""
  kx, kw = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (n, n), jnp.float32)
  w = jax.random.normal(kw, (n, n), jnp.float32) / math.sqrt(n)   # keeps the chain's scale steady

  @jax.jit
  def matmuls(x, w):
    return jax.lax.fori_loop(0, chain, lambda _, y: jnp.dot(y, w, precision="highest"), x)

  jax.block_until_ready(matmuls(x, w))
  return 2 * n**3 * chain / _median_seconds(lambda: matmuls(x, w), repeats)


def _throughput(name: str, seconds_per_step: float, tokens: int, flops_per_token: int, peak: float) -> dict:
  flops = flops_per_token * tokens / seconds_per_step
  return {"implementation": name, "seconds_per_step": seconds_per_step,
          "tokens_per_second": tokens / seconds_per_step, "flops_per_second": flops,
          "fraction_of_peak": flops / peak}


def _time_steps(step: Callable[[], object], steps: int, warmup: int) -> float:
  """Seconds per step: `warmup` untimed steps (compilation included), then `steps` back to back."""
  for _ in range(max(warmup, 1)):
    jax.block_until_ready(step())
  start = time.perf_counter()
  out = None
  for _ in range(steps):
    out = step()
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / steps


def time_recipe_jax(cfg: ModelConfig, batch: dict, *, steps: int, warmup: int) -> float:
  """Seconds per step of our SFT train step (sum-normalized masked NLL, clipped AdamW, donated state)."""
  optimizer = make_optimizer(OptimizerConfig(learning_rate=LEARNING_RATE, schedule="constant"))
  loss_fn = make_sft_loss(cfg, SftLossConfig(logprob_chunk_size=batch["tokens"].shape[1]))
  train_step = jit_train_step(make_train_step(loss_fn, optimizer, normalizers_fn=sft_normalizers))
  state = init_train_state(init_params(cfg, seed=0), optimizer)

  def step():
    nonlocal state
    state, metrics = train_step(state, batch)
    return metrics["loss"]

  return _time_steps(step, steps, warmup)


def tunix_unavailable() -> str | None:
  """Why the Tunix side cannot run here, or None when it can."""
  try:
    import tunix  # noqa: F401
    from tunix.models.qwen3 import model as _  # noqa: F401
    from tunix.sft import peft_trainer as _  # noqa: F401, F811
  except Exception as e:  # ImportError, or an import-time error from a version mismatch
    return f"{type(e).__name__}: {e}"
  return None


def tunix_inputs(batch: dict) -> dict:
  """Our packed batch as the keyword inputs of Tunix's default SFT loss.

  Tunix predicts `input_tokens[:, 1:]` from the logits at `[:, :-1]`, weighted by
  `input_mask[:, 1:]`, so our `loss_mask[:, t]` (target `t + 1` supervised) moves
  one to the right. Documents are kept apart by a `[B, T, T]` segment-causal mask.
  """
  seg = batch["segment_ids"]
  t = seg.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))
  mask = causal[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
  input_mask = jnp.concatenate([jnp.zeros_like(batch["loss_mask"][:, :1]), batch["loss_mask"][:, :-1]], axis=1)
  return {"input_tokens": batch["tokens"], "input_mask": input_mask, "positions": batch["positions"],
          "attention_mask": mask}


def tunix_config(cfg: ModelConfig):
  """Tunix's `qwen3.ModelConfig` of the same sizes and numerics."""
  from tunix.models.qwen3 import model as qwen3
  if cfg.num_experts or not cfg.qk_norm or cfg.attention_bias or cfg.partial_rotary_factor != 1.0:
    raise ValueError("the Tunix comparison covers dense Qwen3 configurations only")
  return qwen3.ModelConfig(
      num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
      hidden_dim=cfg.intermediate_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
      num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
      use_tied_embedding=cfg.tie_word_embeddings, dtype=jnp.dtype(cfg.dtype),
      param_dtype=jnp.dtype(cfg.param_dtype))


def time_tunix(cfg: ModelConfig, batch: dict, *, steps: int, warmup: int) -> float:
  """Seconds per step of Tunix's Qwen3 under the jitted train step of Tunix's `PeftTrainer`.

  The step is the trainer's own (`jit_train_and_eval_step`: `nnx.value_and_grad` of
  its default masked NLL, `nnx.Optimizer.update`, optimizer donated), fed our batch;
  the trainer's data loop, logging and checkpointing are left out, as our side has none.
  """
  from flax import nnx
  from tunix.models.qwen3 import model as qwen3
  from tunix.sft import peft_trainer

  model = qwen3.Qwen3(tunix_config(cfg), rngs=nnx.Rngs(0))
  optimizer = make_optimizer(OptimizerConfig(learning_rate=LEARNING_RATE, schedule="constant"))
  trainer = peft_trainer.PeftTrainer(model, optimizer, peft_trainer.TrainingConfig(
      eval_every_n_steps=10**9, max_steps=steps + max(warmup, 1)))
  train_step, _ = trainer.jit_train_and_eval_step()
  inputs = tunix_inputs(batch)
  return _time_steps(lambda: train_step(inputs)[0], steps, warmup)


def run(*, batch: int = 4, seq_len: int = 512, segments: int = 2, steps: int = 5, warmup: int = 2,
        peak_size: int = 2048, peak_chain: int = 4, tunix: bool = True, cfg: ModelConfig | None = None) -> dict:
  """Measures the peak, then each implementation; returns `{"header": ..., "rows": [...], "skipped": ...}`."""
  cfg = cfg or tiny_qwen3()
  data = synthetic_batch(cfg, batch, seq_len, segments=segments)
  tokens = batch * seq_len
  flops_per_token = train_flops_per_token(cfg, seq_len)
  peak = measure_matmul_peak(n=peak_size, chain=peak_chain)
  rows = [_throughput("recipe_jax", time_recipe_jax(cfg, data, steps=steps, warmup=warmup),
                      tokens, flops_per_token, peak)]
  skipped = None
  if tunix:
    skipped = tunix_unavailable()
    if skipped is None:
      from importlib.metadata import version
      rows.append(_throughput(f"tunix {version('google-tunix')}",
                              time_tunix(cfg, data, steps=steps, warmup=warmup),
                              tokens, flops_per_token, peak))
  else:
    skipped = "disabled (--no-tunix)"
  device = jax.devices()[0]
  header = {"config": cfg, "batch": batch, "seq_len": seq_len, "segments": segments, "steps": steps,
            "device": f"{device.platform} ({device.device_kind}, {jax.device_count()} device(s))",
            "peak_flops_per_second": peak, "peak_size": peak_size, "flops_per_token": flops_per_token}
  return {"header": header, "rows": rows, "skipped": skipped}


def format_report(result: dict) -> str:
  h, cfg = result["header"], result["header"]["config"]
  lines = [
      f"SFT train step, Qwen3 D={cfg.hidden_size} F={cfg.intermediate_size} L={cfg.num_layers} "
      f"heads={cfg.num_heads}/{cfg.num_kv_heads}x{cfg.head_dim} V={cfg.vocab_size} {cfg.dtype}; "
      f"batch B={h['batch']} T={h['seq_len']} ({h['segments']} docs/row), {h['steps']} timed steps; "
      f"{h['device']}; measured peak {h['peak_flops_per_second'] / 1e9:,.1f} GFLOP/s "
      f"(float32 {h['peak_size']}x{h['peak_size']} matmul); "
      f"{h['flops_per_token'] / 1e6:.2f} MFLOP/token",
      "",
      "| implementation | tokens/s | FLOP/s | fraction of measured peak |",
      "| --- | ---: | ---: | ---: |",
  ]
  for r in result["rows"]:
    lines.append(f"| {r['implementation']} | {r['tokens_per_second']:,.0f} | "
                 f"{r['flops_per_second']:.3e} | {r['fraction_of_peak']:.3f} |")
  if result["skipped"]:
    lines += ["", f"tunix skipped: {result['skipped']}"]
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  import argparse
  p = argparse.ArgumentParser(prog="python -m recipe_jax.bench sft", description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--seq-len", type=int, default=512)
  p.add_argument("--segments", type=int, default=2, help="documents packed in each row")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--peak-size", type=int, default=2048)
  p.add_argument("--no-tunix", action="store_true")
  a = p.parse_args(argv)
  print(format_report(run(batch=a.batch, seq_len=a.seq_len, segments=a.segments, steps=a.steps,
                          warmup=a.warmup, peak_size=a.peak_size, tunix=not a.no_tunix)))
