"""Peak memory and time of token log-probs: full `[B, T, V]` logits vs chunks over the sequence.

Both variants compute the loss and its gradient with respect to the hidden states
and the LM head, compiled for this machine; memory is XLA's own accounting of the
compiled program (`memory_analysis`), time the median of a few runs.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from recipe_jax.losses import logprobs_from_logits, token_logprobs


def _loss(fn):
  return jax.jit(jax.value_and_grad(lambda h, w, y: -fn(h, w, y).mean(), argnums=(0, 1)))


def run(*, batch: int = 1, seq_len: int = 4096, width: int = 1024, vocab: int = 151_552, chunk: int = 512,
        repeats: int = 3) -> list[dict]:
  kh, kw, ky = jax.random.split(jax.random.key(0), 3)
  hidden = jax.random.normal(kh, (batch, seq_len, width), jnp.float32)
  head = 0.02 * jax.random.normal(kw, (width, vocab), jnp.float32)
  targets = jax.random.randint(ky, (batch, seq_len), 0, vocab)
  variants = {
      "full logits": lambda h, w, y: logprobs_from_logits(h @ w, y),
      f"chunked ({chunk})": lambda h, w, y: token_logprobs(h, w, y, chunk_size=chunk),
  }
  rows = []
  for name, fn in variants.items():
    step = _loss(fn)
    compiled = step.lower(hidden, head, targets).compile()
    mem = compiled.memory_analysis()
    jax.block_until_ready(step(hidden, head, targets))
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(step(hidden, head, targets))
      times.append(time.perf_counter() - start)
    rows.append({"variant": name, "temp_GiB": mem.temp_size_in_bytes / 2**30,
                 "args_GiB": mem.argument_size_in_bytes / 2**30, "seconds": statistics.median(times)})
  return rows


def main(argv: list[str]) -> None:
  import argparse
  p = argparse.ArgumentParser(prog="python -m recipe_jax.bench logprobs", description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--seq-len", type=int, default=4096)
  p.add_argument("--width", type=int, default=1024)
  p.add_argument("--vocab", type=int, default=151_552)
  p.add_argument("--chunk", type=int, default=512)
  a = p.parse_args(argv)
  rows = run(batch=a.batch, seq_len=a.seq_len, width=a.width, vocab=a.vocab, chunk=a.chunk)
  print(f"token log-probs + gradient, B={a.batch} T={a.seq_len} D={a.width} V={a.vocab}, "
        f"{jax.devices()[0].platform}")
  print(f"| variant | temp memory (GiB) | arguments (GiB) | seconds |\n| --- | ---: | ---: | ---: |")
  for r in rows:
    print(f"| {r['variant']} | {r['temp_GiB']:.2f} | {r['args_GiB']:.2f} | {r['seconds']:.2f} |")
