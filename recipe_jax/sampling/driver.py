"""In-process rollouts: `generate` keeps every decode slot of an `Engine` busy.

Continuous batching: whenever a sequence finishes, its slot takes the next
waiting sample at once (a prompt is prefilled once and inserted into as many
slots as it has samples). Each sample's PRNG key depends only on
`(seed, prompt index, sample index)`, so results do not depend on the slot
count or on which slot a sample ran in.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from recipe_jax.sampling.engine import Engine, Prefix
from recipe_jax.sampling.sampler import SamplingParams, request_key


@dataclasses.dataclass
class Completion:
  """One sampled continuation of one prompt.

  token_ids: generated ids (a stop token that ended it included).
  logprobs: float32 log-prob of each generated id under the model (temperature 1).
  finish_reason: "stop" (a stop token), "length" (max_new_tokens or a full
    cache) or "error" (the request was rejected; `error` says why).
  expert_ids: MoE models: `[L_moe, len(prompt_ids) + len(token_ids), k]` int32
    experts chosen for every prompt and generated token (feed them to
    `forward(..., replay_experts=...)`); None for dense models and errors.
  """

  prompt_index: int
  sample_index: int
  prompt_ids: list[int]
  token_ids: list[int]
  logprobs: np.ndarray
  finish_reason: str
  expert_ids: np.ndarray | None = None
  error: str | None = None


@dataclasses.dataclass
class _Running:
  prompt_index: int
  sample_index: int
  prompt: list[int]
  prompt_experts: np.ndarray | None
  tokens: list[int] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  experts: list[np.ndarray] = dataclasses.field(default_factory=list)

  def done(self, reason: str) -> Completion:
    ids = None
    if self.prompt_experts is not None:
      ids = np.concatenate([self.prompt_experts, np.stack(self.experts, axis=1)], axis=1)
    return Completion(self.prompt_index, self.sample_index, list(self.prompt), self.tokens,
                      np.asarray(self.logprobs, np.float32), reason, ids)


@dataclasses.dataclass
class _Prefilled:
  prompt_index: int
  prefix: Prefix
  experts: np.ndarray | None
  next_sample: int = 0


def generate(engine: Engine, prompts: list[list[int]], *, n: int = 1, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
             stop_token_ids: tuple[int, ...] | None = None) -> list[Completion]:
  """Samples `n` completions of every prompt with continuous batching over the engine's slots.

  Args:
    engine: the `Engine` (its current parameters are used).
    prompts: token id lists. A bad prompt (empty, longer than the cache allows,
      ids outside the vocabulary) yields `n` completions with finish reason
      "error"; the others run normally.
    n: samples per prompt (the prompt is prefilled once and its cache copied).
    max_new_tokens: at most this many generated tokens per sample.
    temperature, top_p, top_k: see `SamplingParams` (temperature 0 is greedy).
    seed: with the prompt and sample index, fixes every sampled token.
    stop_token_ids: ids that end a sample (default: the engine's).

  Returns:
    `len(prompts) * n` completions, ordered by prompt, then sample index.
  """
  sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
  if n < 1 or max_new_tokens < 1:
    raise ValueError(f"n and max_new_tokens must be >= 1, got n={n}, max_new_tokens={max_new_tokens}")
  stops = set(engine.stop_token_ids if stop_token_ids is None else stop_token_ids)
  results: dict[tuple[int, int], Completion] = {}
  waiting = collections.deque(range(len(prompts)))
  free = list(range(engine.slots))[::-1]
  live: dict[int, _Running] = {}
  current: _Prefilled | None = None
  state = engine.init_decode_state()

  while waiting or current is not None or live:
    while free and (current is not None or waiting):
      if current is None:
        current = _prefill_or_fail(engine, prompts, waiting.popleft(), n, results)
        continue
      slot = free.pop()
      i, j = current.prompt_index, current.next_sample
      state = engine.insert(current.prefix, state, slot, sampling=sampling, key=request_key(seed, i, j))
      live[slot] = _Running(i, j, list(prompts[i]), current.experts)
      current.next_sample += 1
      if current.next_sample == n:
        current = None
    if not live:
      continue
    state, step = engine.step(state)
    tokens, logprobs, experts = jax.device_get((step.tokens, step.logprobs, step.expert_ids))
    for slot in list(live):
      run = live[slot]
      token = int(tokens[slot])
      run.tokens.append(token)
      run.logprobs.append(float(logprobs[slot]))
      if experts is not None:
        run.experts.append(experts[:, slot])
      reason = None
      if token in stops:
        reason = "stop"
      elif len(run.tokens) >= max_new_tokens or len(run.prompt) + len(run.tokens) >= engine.max_len:
        reason = "length"
      if reason is not None:
        results[run.prompt_index, run.sample_index] = run.done(reason)
        del live[slot]
        free.append(slot)
  return [results[i, j] for i in range(len(prompts)) for j in range(n)]


def _prefill_or_fail(engine: Engine, prompts, index: int, n: int, results: dict) -> _Prefilled | None:
  """Prefills prompt `index`, or records `n` error completions for it and returns None."""
  prompt = prompts[index]
  try:
    ids = np.asarray(prompt)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
      raise ValueError(f"a prompt must be a flat list of int token ids, got {str(prompt)[:80]}")
    prefix = engine.prefill(padded_tokens=ids.astype(np.int32), true_length=ids.size)
  except ValueError as e:
    for j in range(n):
      results[index, j] = Completion(index, j, list(prompt) if isinstance(prompt, list | tuple) else [],
                                     [], np.zeros((0,), np.float32), "error",
                                     error=f"prompt {index}: {e}")
    return None
  experts = None
  if prefix.expert_ids is not None:
    experts = np.asarray(jax.device_get(prefix.expert_ids))[:, :ids.size]
  return _Prefilled(index, prefix, experts)
