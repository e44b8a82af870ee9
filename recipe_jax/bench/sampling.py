"""Sampling throughput: generated tokens/s of our continuous-batching driver, a one-request-at-a-time
loop on the same engine, and Tunix's own sampler, on the tiny presets and the same prompts.

Every implementation decodes the same prompts greedily for exactly `--new-tokens` tokens
(no stop token can occur), so the token counts are equal and the rates compare directly.
A rate is generated tokens over the wall time of a whole call (prefill, decode and the
return of the tokens to the host), median of `--repeats` timed calls after one untimed
call that compiles. The greedy tokens of each implementation are compared with the
driver's, which checks that the Tunix model really carries our weights.

The Tunix side (`google-tunix`: `tunix.models.qwen3.Qwen3` with our parameters copied in,
run by `tunix.generate.sampler.Sampler`, which decodes the batch in one jitted loop) runs
only when those modules import in this environment; otherwise a line says why it was skipped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

from recipe_jax.models import ModelConfig, get_preset, init_params
from recipe_jax.sampling import Engine, generate

PRESETS = ("tiny-dense", "tiny-moe")


def make_prompts(cfg: ModelConfig, count: int, min_len: int, max_len: int, *, seed: int = 0) -> list[list[int]]:
  """`count` prompts of random lengths in [min_len, max_len], ids in [1, vocab) (0 is Tunix's padding)."""
  if not 1 <= min_len <= max_len:
    raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_len, max_len + 1, count)
  return [rng.integers(1, cfg.vocab_size, n).tolist() for n in lengths]


def _timed(call: Callable[[], list[list[int]]], repeats: int) -> tuple[float, list[list[int]]]:
  """(median seconds of `repeats` calls after one untimed call, the tokens of the last call)."""
  tokens = call()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    tokens = call()
    times.append(time.perf_counter() - start)
  return statistics.median(times), tokens


def _row(name: str, seconds: float, tokens: list[list[int]], reference: list[list[int]] | None) -> dict:
  generated = sum(len(t) for t in tokens)
  agree = 1.0 if reference is None else sum(a == b for a, b in zip(tokens, reference)) / len(reference)
  return {"implementation": name, "seconds": seconds, "tokens": generated,
          "tokens_per_second": generated / seconds, "greedy_agreement": agree}


def time_recipe_jax(cfg: ModelConfig, params: dict, prompts: list[list[int]], *, slots: int,
                    new_tokens: int, cache_len: int, repeats: int) -> tuple[list[dict], list[list[int]]]:
  """Rows for the continuous-batching driver and for one `generate` call per prompt (same engine),
  and the driver's greedy tokens."""
  engine = Engine(cfg, params, slots=slots, max_len=cache_len)

  def batched():
    return [c.token_ids for c in generate(engine, prompts, max_new_tokens=new_tokens, temperature=0.0)]

  def one_at_a_time():
    return [generate(engine, [p], max_new_tokens=new_tokens, temperature=0.0)[0].token_ids for p in prompts]

  seconds, reference = _timed(batched, repeats)
  rows = [_row(f"recipe_jax driver ({slots} slots)", seconds, reference, None)]
  seconds, tokens = _timed(one_at_a_time, repeats)
  rows.append(_row("recipe_jax one request at a time", seconds, tokens, reference))
  return rows, reference


# ------------------------------------------------------------------------------------------ Tunix


def tunix_unavailable() -> str | None:
  """Why the Tunix side cannot run here, or None when it can."""
  try:
    from tunix.generate import sampler as _  # noqa: F401
    from tunix.models.qwen3 import model as _  # noqa: F401, F811
  except Exception as e:  # ImportError, or an import-time error from a version mismatch
    return f"{type(e).__name__}: {e}"
  return None


class IdTokenizer:
  """Token ids written as decimal words: what Tunix's sampler (which takes strings) needs here.

  No BOS is added (`bos_id` 0 counts as none in Tunix), 0 pads, and the end-of-sequence id is
  one past the vocabulary, so no sampled token ends a sequence early.
  """

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def encode(self, text: str, **_) -> list[int]:
    return [int(w) for w in text.split()]

  def decode(self, ids, **_) -> str:
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self) -> int:
    return 0

  def pad_id(self) -> int:
    return 0

  def eos_id(self) -> int:
    return self.vocab_size


def tunix_config(cfg: ModelConfig):
  """Tunix's `qwen3.ModelConfig` with the sizes and numerics of `cfg` (Qwen3 dense or Qwen3-MoE)."""
  from tunix.models.qwen3 import model as qwen3
  if cfg.family not in ("qwen3", "qwen3_moe") or not cfg.qk_norm or cfg.attention_bias \
      or cfg.partial_rotary_factor != 1.0:
    raise ValueError(f"the Tunix comparison covers Qwen3 configurations only, got family {cfg.family}")
  moe = {}
  hidden = cfg.intermediate_size
  if cfg.is_moe:
    if tuple(cfg.moe_layer_ids) != tuple(range(cfg.num_layers)):
      raise ValueError(f"Tunix's Qwen3-MoE makes every layer MoE; this config has MoE layers {cfg.moe_layer_ids}")
    if cfg.router_score != "softmax" or not cfg.router_norm_topk_prob:
      raise ValueError("Tunix's Qwen3-MoE router is softmax top-k, renormalized; this config's is not")
    moe = dict(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok)
    hidden = cfg.moe_intermediate_size
  return qwen3.ModelConfig(
      num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size, hidden_dim=hidden,
      num_heads=cfg.num_heads, head_dim=cfg.head_dim, num_kv_heads=cfg.num_kv_heads,
      rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps, use_tied_embedding=cfg.tie_word_embeddings,
      dtype=np.dtype(cfg.dtype), param_dtype=np.dtype(cfg.param_dtype), **moe)


def tunix_model(cfg: ModelConfig, params: dict):
  """Tunix's Qwen3 holding our parameters (per-layer layout; the axis orders coincide)."""
  from flax import nnx
  from tunix.models.qwen3 import model as qwen3

  from recipe_jax.models.stacking import to_layout

  params = to_layout(cfg.replace(scan_layers=False), params)
  model = qwen3.Qwen3(tunix_config(cfg), rngs=nnx.Rngs(0))

  def put(variable, value):
    if tuple(variable.value.shape) != tuple(value.shape):
      raise ValueError(f"Tunix parameter of shape {variable.value.shape} cannot take ours of {value.shape}")
    variable.value = jax.numpy.asarray(value, variable.value.dtype)

  put(model.embedder.input_embedding, params["embed"])
  put(model.final_norm.w, params["final_norm"]["scale"])
  if not cfg.tie_word_embeddings:
    put(model.lm_head.w, params["lm_head"])
  if len(model.layers) != len(params["layers"]):
    raise ValueError(f"Tunix's model has {len(model.layers)} layers, our parameters {len(params['layers'])}")
  for i, layer in enumerate(model.layers):
    ours = params["layers"][i]
    put(layer.input_layernorm.w, ours["input_norm"]["scale"])
    put(layer.post_attention_layernorm.w, ours["post_attn_norm"]["scale"])
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
      put(getattr(layer.attn, name).w, ours["attn"][name])
    put(layer.attn.q_norm.w, ours["attn"]["q_norm"]["scale"])
    put(layer.attn.k_norm.w, ours["attn"]["k_norm"]["scale"])
    if "moe" in ours:
      put(layer.mlp.router.kernel, ours["moe"]["router"])
      for name in ("gate_proj", "up_proj", "down_proj"):
        put(getattr(layer.mlp, name), ours["moe"][name])
    else:
      for name in ("gate_proj", "up_proj", "down_proj"):
        put(getattr(layer.mlp, name).kernel, ours["mlp"][name])
  return model


def time_tunix(cfg: ModelConfig, params: dict, prompts: list[list[int]], *, new_tokens: int,
               repeats: int, reference: list[list[int]]) -> dict:
  """The row for Tunix's `Sampler`, all prompts in one greedy call (its static batch)."""
  from tunix.generate import sampler as tunix_sampler
  from tunix.generate import utils as tunix_utils

  prompt_len = tunix_utils.next_power_of_2(max(len(p) for p in prompts))
  tokenizer = IdTokenizer(cfg.vocab_size)
  sampler = tunix_sampler.Sampler(
      tunix_model(cfg, params), tokenizer,
      tunix_sampler.CacheConfig(cache_size=prompt_len + new_tokens, num_layers=cfg.num_layers,
                                num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
  texts = [tokenizer.decode(p) for p in prompts]

  def call():
    out = sampler(texts, max_generation_steps=new_tokens, max_prompt_length=prompt_len, temperature=0.0,
                  eos_tokens=[tokenizer.eos_id()])
    return [np.asarray(t).tolist() for t in out.tokens]

  from importlib.metadata import version
  seconds, tokens = _timed(call, repeats)
  return _row(f"tunix {version('google-tunix')} Sampler (batch {len(prompts)})", seconds, tokens, reference)


# ------------------------------------------------------------------------------------------ run


def run(*, presets: tuple[str, ...] = PRESETS, prompts: int = 16, min_prompt: int = 4, max_prompt: int = 24,
        new_tokens: int = 32, slots: int = 8, repeats: int = 3, tunix: bool = True) -> dict:
  """Measures every implementation on every preset; returns `{"header", "rows", "skipped"}`."""
  skipped = tunix_unavailable() if tunix else "disabled (--no-tunix)"
  cache_len = max_prompt + new_tokens
  rows = []
  for name in presets:
    cfg = get_preset(name)
    params = init_params(cfg, seed=0)
    batch = make_prompts(cfg, prompts, min_prompt, max_prompt)
    ours, reference = time_recipe_jax(cfg, params, batch, slots=slots, new_tokens=new_tokens,
                                      cache_len=cache_len, repeats=repeats)
    rows += [{"preset": name, **r} for r in ours]
    if skipped is None:
      rows.append({"preset": name, **time_tunix(cfg, params, batch, new_tokens=new_tokens, repeats=repeats,
                                                reference=reference)})
  device = jax.devices()[0]
  header = {"prompts": prompts, "prompt_lengths": (min_prompt, max_prompt), "new_tokens": new_tokens,
            "slots": slots, "repeats": repeats,
            "device": f"{device.platform} ({device.device_kind}, {jax.device_count()} device(s))"}
  return {"header": header, "rows": rows, "skipped": skipped}


def format_report(result: dict) -> str:
  h = result["header"]
  lines = [
      f"Greedy sampling, {h['prompts']} prompts of {h['prompt_lengths'][0]}-{h['prompt_lengths'][1]} tokens, "
      f"{h['new_tokens']} new tokens each; median of {h['repeats']} calls after a compiling one; {h['device']}",
      "",
      "| preset | implementation | generated tokens | seconds per call | tokens/s | same greedy tokens as driver |",
      "| --- | --- | ---: | ---: | ---: | ---: |",
  ]
  for r in result["rows"]:
    lines.append(f"| {r['preset']} | {r['implementation']} | {r['tokens']} | {r['seconds']:.3f} | "
                 f"{r['tokens_per_second']:,.0f} | {r['greedy_agreement']:.0%} |")
  if result["skipped"]:
    lines += ["", f"tunix skipped: {result['skipped']}"]
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  import argparse
  p = argparse.ArgumentParser(prog="python -m recipe_jax.bench sampling", description=__doc__.splitlines()[0])
  p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated model presets")
  p.add_argument("--prompts", type=int, default=16)
  p.add_argument("--min-prompt", type=int, default=4)
  p.add_argument("--max-prompt", type=int, default=24)
  p.add_argument("--new-tokens", type=int, default=32)
  p.add_argument("--slots", type=int, default=8, help="decode slots of our engine")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--no-tunix", action="store_true")
  a = p.parse_args(argv)
  print(format_report(run(presets=tuple(a.presets.split(",")), prompts=a.prompts, min_prompt=a.min_prompt,
                          max_prompt=a.max_prompt, new_tokens=a.new_tokens, slots=a.slots,
                          repeats=a.repeats, tunix=not a.no_tunix)))
