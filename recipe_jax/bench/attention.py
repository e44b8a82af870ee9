"""Causal attention speed and memory: our Pallas kernel vs `jax.nn.dot_product_attention` (XLA, cuDNN).

For each sequence length, times the forward pass and forward + backward (the
gradient of a sum with respect to q, k, v) of one packed row per batch entry,
grouped-query, and prints achieved TFLOP/s (causal: half the dense matmul
FLOPs; backward counted as 2.5 forwards) and XLA's peak memory accounting of
the compiled program (arguments + outputs + temporaries). A variant that does
not fit or fails to compile is listed with its error. The last column is the
largest difference of our forward output from the XLA one (where both ran).

    python -m recipe_jax.bench attention --device gpu            # H200: 4K..64K, bf16, H=128
    python -m recipe_jax.bench attention --device cpu            # tiny smoke run (interpret mode)
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from recipe_jax.kernels.flash_gpu import flash_attention_gpu
from recipe_jax.kernels.flash_tpu import flash_attention_tpu

GPU_SEQ_LENS = (4096, 8192, 16384, 32768, 65536)


def attention_flops(batch: int, seq_len: int, heads: int, head_dim: int, *, backward: bool) -> float:
  """Causal attention matmul FLOPs: 4 B N T^2 H / 2 forward, 2.5x that again for the backward."""
  forward = 4.0 * batch * heads * seq_len * seq_len * head_dim / 2
  return forward * (3.5 if backward else 1.0)


def _variants(device: str) -> dict:
  interpret = device == "cpu"
  ours = flash_attention_tpu if device == "tpu" else flash_attention_gpu

  def pallas(q, k, v, ids):
    return ours(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, scale=q.shape[-1] ** -0.5,
                interpret=interpret)

  def library(implementation):
    def fn(q, k, v, ids):
      del ids  # one segment per row: plain causal attention
      return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
    return fn

  variants = {f"pallas ({'interpret' if interpret else device})": pallas, "xla": library("xla")}
  if device == "gpu":
    variants["cudnn"] = library("cudnn")
  return variants


def _time(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _peak_bytes(compiled) -> int:
  mem = compiled.memory_analysis()
  return mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes


def run(*, device: str = "gpu", seq_lens=GPU_SEQ_LENS, batch: int = 1, heads: int = 32, kv_heads: int = 8,
        head_dim: int = 128, dtype: str = "bfloat16", repeats: int = 5) -> list[dict]:
  """One row per (sequence length, variant): seconds, TFLOP/s and peak GiB, forward and forward+backward."""
  rows = []
  ref_out = None
  for seq_len in seq_lens:
    keys = jax.random.split(jax.random.key(seq_len), 3)
    q = jax.random.normal(keys[0], (batch, seq_len, heads, head_dim), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (batch, seq_len, kv_heads, head_dim), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (batch, seq_len, kv_heads, head_dim), jnp.float32).astype(dtype)
    ids = jnp.ones((batch, seq_len), jnp.int32)
    ref_out = None
    for name, fn in _variants(device).items():
      row = {"seq_len": seq_len, "variant": name}
      try:
        fwd = jax.jit(fn)
        grad_fn = jax.grad(lambda q, k, v, ids: fn(q, k, v, ids).astype(jnp.float32).sum(), argnums=(0, 1, 2))
        bwd = jax.jit(grad_fn)
        fwd_c, bwd_c = fwd.lower(q, k, v, ids).compile(), bwd.lower(q, k, v, ids).compile()
        row["fwd_s"] = _time(fwd_c, (q, k, v, ids), repeats)
        row["fwd_bwd_s"] = _time(bwd_c, (q, k, v, ids), repeats)
        row["fwd_tflops"] = attention_flops(batch, seq_len, heads, head_dim, backward=False) / row["fwd_s"] / 1e12
        row["fwd_bwd_tflops"] = (attention_flops(batch, seq_len, heads, head_dim, backward=True)
                                 / row["fwd_bwd_s"] / 1e12)
        row["fwd_GiB"], row["fwd_bwd_GiB"] = _peak_bytes(fwd_c) / 2**30, _peak_bytes(bwd_c) / 2**30
        out = fwd_c(q, k, v, ids).astype(jnp.float32)
        if name == "xla":
          ref_out = out
        elif name.startswith("pallas"):
          row["_out"] = out
      except Exception as e:  # out of memory, or a kernel that does not compile here
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}" if str(e) else type(e).__name__
      rows.append(row)
    for row in rows:
      out = row.pop("_out", None)
      if out is not None and ref_out is not None:
        row["max_abs_diff_vs_xla"] = float(jnp.max(jnp.abs(out - ref_out)))
  return rows


def format_table(rows: list[dict]) -> str:
  lines = ["| T | variant | fwd ms | fwd TFLOP/s | fwd GiB | fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd GiB "
           "| max abs diff vs xla |",
           "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in rows:
    if "error" in r:
      lines.append(f"| {r['seq_len']} | {r['variant']} | {r['error']} | | | | | | |")
      continue
    diff = r.get("max_abs_diff_vs_xla")
    lines.append(
        f"| {r['seq_len']} | {r['variant']} | {1e3 * r['fwd_s']:.2f} | {r['fwd_tflops']:.1f} | "
        f"{r['fwd_GiB']:.2f} | {1e3 * r['fwd_bwd_s']:.2f} | {r['fwd_bwd_tflops']:.1f} | "
        f"{r['fwd_bwd_GiB']:.2f} | {'' if diff is None else f'{diff:.2e}'} |")
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  import argparse
  p = argparse.ArgumentParser(prog="python -m recipe_jax.bench attention", description=__doc__.splitlines()[0])
  p.add_argument("--device", choices=("gpu", "tpu", "cpu"), default="gpu",
                 help="gpu / tpu: full run on that accelerator; cpu: tiny smoke run in interpret mode")
  p.add_argument("--seq-lens", type=int, nargs="+", default=None)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--heads", type=int, default=None)
  p.add_argument("--kv-heads", type=int, default=None)
  p.add_argument("--head-dim", type=int, default=None)
  p.add_argument("--dtype", default=None, choices=("bfloat16", "float32"))
  p.add_argument("--repeats", type=int, default=None)
  a = p.parse_args(argv)
  tiny = a.device == "cpu"
  if not tiny and jax.default_backend() != a.device:
    raise SystemExit(f"--device {a.device} but JAX runs on {jax.default_backend()}; use --device cpu "
                     "for the smoke run")
  config = dict(
      device=a.device, batch=a.batch,
      seq_lens=tuple(a.seq_lens or ((64, 128) if tiny else GPU_SEQ_LENS)),
      heads=a.heads or (4 if tiny else 32), kv_heads=a.kv_heads or (2 if tiny else 8),
      head_dim=a.head_dim or (32 if tiny else 128), dtype=a.dtype or ("float32" if tiny else "bfloat16"),
      repeats=a.repeats or (1 if tiny else 5))
  rows = run(**config)
  device_kind = jax.devices()[0].device_kind
  print(f"causal attention, B={config['batch']} N={config['heads']} K={config['kv_heads']} "
        f"H={config['head_dim']} {config['dtype']}, {device_kind}")
  print(format_table(rows))
