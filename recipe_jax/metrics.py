"""Training metrics: per-step JSONL, TensorBoard event files, a progress bar, throughput and MFU.

`MetricsWriter.write(step, scalars, tokens=...)` adds, to the step's own
scalars (loss, learning rate, gradient norm, ...), the derived

    tokens_per_second = tokens / seconds
    flops_per_second  = flops_per_token * tokens / seconds    (achieved model FLOP/s)
    mfu               = flops_per_second / peak_flops_per_second

and writes them as one JSON object per line to `<directory>/metrics.jsonl`, as
TensorBoard scalars (`tensorboardX`) under `<directory>`, and to a progress bar
on stderr. `tokens` are the tokens the model computed on since the previous
`write` (rows x sequence length of the global batch, padding included: the
FLOPs were spent on it) and `seconds` the wall time since the previous `write`
(measured when not given). `peak_flops_per_second` is the whole job's peak:
the chips' peak dense FLOP/s at the training dtype times their number.

Steps are counted as in checkpoints: `step` is the number of optimizer steps
done (`TrainState.step` after the update), so a run resumed from checkpoint
`start_step` logs `start_step + 1` next. Lines and events of steps after
`start_step` that a killed run had already logged are dropped on open (JSONL)
or purged (TensorBoard's `purge_step`), so the logs of a resumed run read like
those of an uninterrupted one. Only process 0 writes.

Non-finite values are written as Python's `json` writes them (`NaN`, `Infinity`).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from recipe_jax.models.config import ModelConfig
from recipe_jax.models.params import param_counts

JSONL_NAME = "metrics.jsonl"


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
  """Training FLOPs per token (forward + backward) of a causal decoder, PaLM-style.

      C = 6 (N + V D) + 6 L N_q H T

  with `N` the active non-embedding parameters (`param_counts(cfg).active_non_embedding`:
  every parameter a token uses but the input embedding and the LM head; the
  unchosen routed experts excluded; norms and biases included, which is
  negligible), `V D` the LM head's matmul (counted even when tied to the
  embedding; the embedding lookup is free), `L` layers, `N_q` query heads, `H`
  head dim and `T = seq_len`. The first term is 2 FLOPs per multiply-add times 3
  (forward, and backward for activations and weights) per parameter. The second
  is attention's `Q K^T` and `A V`: `2 * 2 T N_q H` FLOPs per token per layer
  forward, times 3, halved because a causal token attends on average to half
  of the row (PaLM counts the full `12 L N_q H T`). Packed rows are counted as
  if the whole row were one sequence.

  References: Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with
  Pathways", Appendix B (https://arxiv.org/abs/2204.02311).
  """
  counts = param_counts(cfg)
  matmul_params = counts.active_non_embedding + cfg.vocab_size * cfg.hidden_size
  attention = 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq_len
  return 6 * matmul_params + attention


def _scalar(name: str, value: Any) -> float | int:
  a = np.asarray(value)  # blocks until a jax.Array is computed
  if a.size != 1:
    raise ValueError(f"metric {name!r} has shape {a.shape}; only scalars can be logged")
  a = a.reshape(())
  return int(a) if a.dtype.kind in "iub" else float(a)


def _keep_lines_up_to(path: pathlib.Path, step: int) -> None:
  """Drops the lines of `path` for steps after `step` (and any torn last line)."""
  if not path.exists():
    return
  kept = []
  for line in path.read_text().splitlines():
    try:
      if json.loads(line)["step"] <= step:
        kept.append(line)
    except (ValueError, KeyError, TypeError):
      pass  # a line cut short when the previous run was killed
  path.write_text("".join(f"{line}\n" for line in kept))


class MetricsWriter:
  """Per-step JSONL, TensorBoard scalars and a progress bar, with tokens/s, FLOP/s and MFU.

  Usage::

      with MetricsWriter(workdir, peak_flops_per_second=n_chips * 459e12,
                         flops_per_token=train_flops_per_token(model_cfg, seq_len),
                         total_steps=steps, start_step=int(state.step)) as metrics:
        for ...:
          state, out = train_step(state, batch)
          metrics.write(int(state.step), out, tokens=batch["tokens"].size)
  """

  def __init__(self, directory: str | pathlib.Path, *, peak_flops_per_second: float,
               flops_per_token: float, total_steps: int, progress: bool = True,
               tensorboard: bool = True, start_step: int = 0, enabled: bool | None = None):
    if peak_flops_per_second <= 0:
      raise ValueError(f"peak_flops_per_second must be positive, got {peak_flops_per_second}")
    self.peak_flops_per_second = float(peak_flops_per_second)
    self.flops_per_token = float(flops_per_token)
    self.directory = pathlib.Path(directory)
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self._last_time = time.perf_counter()
    self._jsonl = self._tb = self._bar = None
    if not self.enabled:
      return
    self.directory.mkdir(parents=True, exist_ok=True)
    _keep_lines_up_to(self.directory / JSONL_NAME, start_step)
    self._jsonl = open(self.directory / JSONL_NAME, "a")
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
      except ImportError as e:
        raise ImportError("TensorBoard event files need tensorboardX (pip install tensorboardX), "
                          "or pass tensorboard=False") from e
      self._tb = SummaryWriter(str(self.directory), purge_step=start_step + 1,
                               filename_suffix=f".from{start_step}")
    if progress:
      from tqdm import tqdm
      self._bar = tqdm(total=total_steps, initial=start_step, file=sys.stderr, unit="step",
                       dynamic_ncols=True)
    self._bar_step = start_step

  def write(self, step: int, scalars: Mapping[str, Any], *, tokens: int | None = None,
            seconds: float | None = None) -> dict[str, float | int]:
    """Logs `scalars` (and the derived throughput when `tokens` is given) for `step`; returns the row."""
    values = {k: _scalar(k, v) for k, v in scalars.items()}
    now = time.perf_counter()
    if seconds is None:
      seconds = now - self._last_time
    self._last_time = now
    values["step_seconds"] = seconds
    if tokens is not None and seconds > 0:
      values["tokens_per_second"] = tokens / seconds
      values["flops_per_second"] = self.flops_per_token * tokens / seconds
      values["mfu"] = values["flops_per_second"] / self.peak_flops_per_second
    row = {"step": int(step), **values}
    if not self.enabled:
      return row
    self._jsonl.write(json.dumps(row | {"time": time.time()}) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for k, v in values.items():
        self._tb.add_scalar(k, v, int(step))
      self._tb.flush()
    if self._bar is not None:
      self._bar.update(int(step) - self._bar_step)
      self._bar_step = int(step)
      self._bar.set_postfix(_postfix(values), refresh=False)
    return row

  def close(self) -> None:
    for thing in (self._bar, self._tb, self._jsonl):
      if thing is not None:
        thing.close()
    self._jsonl = self._tb = self._bar = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _postfix(values: dict) -> dict[str, str]:
  out = {}
  for key, label, fmt in (("loss", "loss", "{:.4f}"), ("learning_rate", "lr", "{:.2e}"),
                          ("grad_norm", "gnorm", "{:.3f}"), ("tokens_per_second", "tok/s", "{:,.0f}"),
                          ("mfu", "mfu", "{:.1%}")):
    if key in values:
      out[label] = fmt.format(values[key])
  return out
