"""Token sampling: greedy, temperature, top-k and top-p, one setting and one key per row.

Every row (decode slot) carries its own temperature, top-k, top-p and PRNG
key, so requests with different settings share one decode step. The key of a
sampled token is `fold_in(request key, token index)`: the same request and
seed give the same tokens whichever slot or batch it runs in.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to pick each next token.

  temperature: 0 means greedy (argmax); otherwise logits are divided by it.
  top_k: keep only the k most likely tokens; 0 keeps all.
  top_p: keep the smallest set of most likely tokens whose probability
    reaches top_p (nucleus sampling); 1 keeps all.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    problems = []
    if not (self.temperature >= 0 and self.temperature < float("inf")):
      problems.append(f"temperature must be finite and >= 0, got {self.temperature}")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      problems.append(f"top_k must be an int >= 0, got {self.top_k!r}")
    if not (0 < self.top_p <= 1):
      problems.append(f"top_p must be in (0, 1], got {self.top_p}")
    if problems:
      raise ValueError("; ".join(problems))


def token_key(request_key: jax.Array, index: jax.Array) -> jax.Array:
  """The key for the `index`-th generated token of a request (raw uint32 key data in, typed key out)."""
  return jax.random.fold_in(jax.random.wrap_key_data(request_key), index)


def request_key(seed: int, prompt_index: int, sample_index: int) -> jax.Array:
  """Raw key data `[2]` uint32 for sample `sample_index` of prompt `prompt_index` under `seed`."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), prompt_index), sample_index)
  return jax.random.key_data(key)


def _filtered_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array,
                     top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Temperature-scaled logits sorted descending with the tokens outside top-k / top-p at -inf.

  Returns (sorted filtered logits `[B, V]`, the token id at each sorted position `[B, V]`).
  """
  v = logits.shape[-1]
  scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
  order = jnp.argsort(-scaled, axis=-1, stable=True)
  ranked = jnp.take_along_axis(scaled, order, axis=-1)
  rank = jnp.arange(v)[None, :]
  keep_k = rank < jnp.where(top_k > 0, top_k, v)[:, None]
  probs = jax.nn.softmax(ranked, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs      # probability of the more likely tokens
  keep_p = before < top_p[:, None]                  # the most likely token is always kept
  return jnp.where(keep_k & keep_p, ranked, -jnp.inf), order


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature: jax.Array, top_k: jax.Array,
                  top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Picks one token per row and its log-probability under the unmodified model distribution.

  Args:
    logits: `[B, V]` float32.
    keys: `[B]` typed PRNG keys (one per row).
    temperature, top_p: `[B]` float32; top_k `[B]` int32 (see `SamplingParams`).

  Returns:
    (tokens `[B]` int32, log_softmax(logits)[token] `[B]` float32). The log-prob
    is that of the model at temperature 1, the one a training forward computes.
  """
  logits = logits.astype(jnp.float32)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def draw(_):
    ranked, order = _filtered_logits(logits, temperature, top_k, top_p)
    pick = jax.vmap(jax.random.categorical)(keys, ranked)
    return jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)

  drawn = jax.lax.cond(jnp.all(temperature <= 0), lambda _: greedy, draw, None)
  tokens = jnp.where(temperature <= 0, greedy, drawn)
  logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]
  return tokens, logprobs
