"""The sampling engine: prefill, insert into a decode slot, one decode step for all slots.

It implements JetStream's `engine_api.Engine` (when google-jetstream is
installed) for our models, plus what that API lacks: per-token log-probs of
the sampled tokens, MoE expert ids per token and layer (for routing replay),
per-request sampling settings and seeds, and `update_params` (new weights, no
recompilation).

A decode step feeds each slot's pending token, emits it (with its log-prob
and the experts that routed it) and samples the slot's next pending token.
So the token a step emits is the one fed through the model in that step: the
first step after `insert` emits the token sampled from the prefill's logits,
and every emitted token's expert ids are complete.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.models import cached
from recipe_jax.models.config import ModelConfig
from recipe_jax.models.stacking import to_layout
from recipe_jax.models.transformer import abstract_params
from recipe_jax.parallel.mesh import BATCH_AXES, axis_size, batch_shards
from recipe_jax.parallel.sharding import param_shardings
from recipe_jax.sampling import jetstream_compat
from recipe_jax.sampling.sampler import SamplingParams, request_key, sample_tokens, token_key

_JETSTREAM_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Prefix(NamedTuple):
  """A prefilled prompt: keys/values `[L, T, K, H]`, its length, the logits after its last
  token `[V]`, and its expert ids `[L_moe, T, k]` (None for dense models). T is padded."""

  k: jax.Array
  v: jax.Array
  length: jax.Array
  last_logits: jax.Array
  expert_ids: jax.Array | None


class DecodeState(NamedTuple):
  """Everything a decode step transforms, one row per slot.

  lengths: positions in the cache; tokens: the pending token (sampled, not
  yet fed) and logprobs its log-prob; generated: tokens sampled so far
  (pending one included); keys: raw request key data `[S, 2]`; temperature,
  top_k, top_p: the slot's sampling settings.
  """

  cache: cached.KVCache
  lengths: jax.Array
  tokens: jax.Array
  logprobs: jax.Array
  generated: jax.Array
  keys: jax.Array
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array


class StepResult(NamedTuple):
  """What one decode step emits per slot: the fed token, its log-prob, how many tokens the
  slot has emitted including it, its expert ids `[L_moe, S, k]` (None if dense), and
  JetStream's `[S, 3]` (token, valid, length) table."""

  tokens: jax.Array
  logprobs: jax.Array
  counts: jax.Array
  expert_ids: jax.Array | None
  table: jax.Array


def prefill_bucket(length: int, max_len: int) -> int:
  """Padded prompt length: the next power of two >= max(length, 16), at most `max_len`."""
  return min(max(16, 1 << (max(length, 1) - 1).bit_length()), max_len)


class Engine(jetstream_compat.EngineBase):
  """Serves `config`'s model with `slots` concurrent sequences of up to `max_len` positions.

  Args:
    config, params: the model and its parameters (either layer layout).
    slots: decode slots (the decode batch).
    max_len: cache positions per slot (prompt plus generated tokens).
    mesh: the sampling mesh; params are resharded onto it. Slots are split
      over its batch axes and must divide by them.
    sampling: settings for JetStream requests (which carry none); the driver
      passes its own per request.
    seed: seeds JetStream requests' keys (request i uses prompt index i).
    stop_token_ids, bos_id, pad_id: for JetStream's detokenizer and padding.
  """

  def __init__(self, config: ModelConfig, params: dict, *, slots: int, max_len: int, mesh=None,
               sampling: SamplingParams = SamplingParams(temperature=0.0), seed: int = 0,
               stop_token_ids: tuple[int, ...] = (), bos_id: int = 0, pad_id: int = 0):
    if slots < 1 or max_len < 2:
      raise ValueError(f"need slots >= 1 and max_len >= 2, got slots={slots}, max_len={max_len}")
    if mesh is not None and slots % batch_shards(mesh):
      raise ValueError(f"slots={slots} is not divisible by the mesh's batch shards {batch_shards(mesh)}")
    self.config, self.slots, self.max_len, self._mesh = config, slots, max_len, mesh
    self.default_sampling, self.seed = sampling, seed
    self.stop_token_ids, self.bos_id, self.pad_id = tuple(stop_token_ids), bos_id, pad_id
    self._abstract = abstract_params(config)
    self._param_shardings = param_shardings(config, self._abstract, mesh) if mesh is not None else None
    self._requests_inserted = 0
    self._prefill_fn = jax.jit(functools.partial(_prefill, config, mesh))
    self._extend_fn = jax.jit(functools.partial(_extend, config, mesh, max_len))
    self._insert_fn = jax.jit(_insert, donate_argnums=(1,))
    self._step_fn = jax.jit(functools.partial(_step, config, mesh), donate_argnums=(1,))
    self._params = None
    self.update_params(params)

  # ---------------------------------------------------------------- weights

  @property
  def params(self) -> dict:
    return self._params

  def update_params(self, params: dict) -> None:
    """Swaps in new parameters (same shapes and dtypes), placed for this engine; no recompilation."""
    params = to_layout(self.config, params, mesh=self._mesh)
    want, got = _leaf_specs(self._abstract), _leaf_specs(params)
    for name in sorted(want.keys() | got.keys()):
      if want.get(name) != got.get(name):
        raise ValueError(f"update_params: parameter {name} is {got.get(name, 'missing')}, the engine's "
                         f"model expects {want.get(name, 'no such parameter')}")
    target = self._param_shardings if self._mesh is not None else jax.devices()[0]
    self._params = jax.device_put(params, target)

  def load_params(self, *args, **kwargs) -> dict:
    return self._params

  # ---------------------------------------------------------------- JetStream API

  def prefill(self, *, params: dict | None = None, existing_prefix: Prefix | None = None,
              padded_tokens, true_length: int) -> Prefix:
    """Runs a prompt (padded ids, `true_length` real ones) and returns its `Prefix`.

    With `existing_prefix`, the tokens continue that prefix (JetStream's prefix reuse, e.g. a
    shared system prompt prefilled once): they are fed one at a time through the decode step
    on top of its keys and values, so the result equals prefilling the whole sequence at once.
    """
    tokens = np.asarray(padded_tokens, np.int32).reshape(-1)
    true_length = int(true_length)
    start = 0 if existing_prefix is None else int(existing_prefix.length)
    if true_length < 1:
      raise ValueError("empty prompt: a prompt needs at least one token")
    if start + true_length >= self.max_len:
      raise ValueError(f"prompt of {start + true_length} tokens ({start} from existing_prefix) does not fit "
                       f"the cache: max_len={self.max_len} holds the prompt and at least one generated token")
    if true_length > tokens.size:
      raise ValueError(f"true_length={true_length} exceeds the {tokens.size} padded tokens")
    real = tokens[:true_length]
    if real.min() < 0 or real.max() >= self.config.vocab_size:
      raise ValueError(f"prompt token ids must be in [0, {self.config.vocab_size}), "
                       f"got {int(real.min())}..{int(real.max())}")
    bucket = max(prefill_bucket(true_length, self.max_len), min(tokens.size, self.max_len))
    padded = np.full((1, bucket), self.pad_id, np.int32)
    padded[0, :true_length] = real
    params = self._params if params is None else params
    if existing_prefix is not None:
      return self._extend_fn(params, existing_prefix, padded[0], np.int32(true_length))
    return self._prefill_fn(params, padded, np.array([true_length], np.int32))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int, *,
             sampling: SamplingParams | None = None, key: jax.Array | None = None) -> DecodeState:
    """Puts `prefix` into `slot` and samples its first token (`key`: raw request key data `[2]`)."""
    if not 0 <= slot < self.slots:
      raise ValueError(f"slot {slot} is outside [0, {self.slots})")
    if key is None:
      key = request_key(self.seed, self._requests_inserted, 0)
      self._requests_inserted += 1
    s = sampling or self.default_sampling
    return self._insert_fn(prefix, decode_state, np.int32(slot), key, np.float32(s.temperature),
                           np.int32(s.top_k), np.float32(s.top_p))

  def step(self, decode_state: DecodeState, params: dict | None = None) -> tuple[DecodeState, StepResult]:
    """One decode step for every slot (this engine's richer form of `generate`)."""
    return self._step_fn(self._params if params is None else params, decode_state)

  def generate(self, params: dict, decode_state: DecodeState) -> tuple[DecodeState, Any]:
    decode_state, result = self.step(decode_state, params)
    return decode_state, jetstream_compat.result_tokens(result.table)

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    cache = cached.empty_cache(self.config, self.slots, self.max_len)
    s = self.slots
    state = DecodeState(cache, jnp.zeros((s,), jnp.int32), jnp.zeros((s,), jnp.int32),
                        jnp.zeros((s,), jnp.float32), jnp.zeros((s,), jnp.int32),
                        jnp.zeros((s, 2), jnp.uint32), jnp.zeros((s,), jnp.float32),
                        jnp.zeros((s,), jnp.int32), jnp.ones((s,), jnp.float32))
    return jax.device_put(state, self._state_shardings(state))

  def _state_shardings(self, state: DecodeState):
    if self._mesh is None:
      return jax.devices()[0]
    heads = "tensor" if self.config.num_kv_heads % axis_size(self._mesh, "tensor") == 0 else None
    cache_spec = NamedSharding(self._mesh, P(None, BATCH_AXES, None, heads, None))
    row = NamedSharding(self._mesh, P(BATCH_AXES))
    return DecodeState(cached.KVCache(cache_spec, cache_spec), *([row] * 8))

  def get_prefix_destination_sharding(self) -> Any:
    return None if self._mesh is None else NamedSharding(self._mesh, P())

  def get_tokenizer(self) -> Any:
    return jetstream_compat.tokenizer_parameters()

  def build_tokenizer(self, metadata: Any) -> Any:
    return jetstream_compat.TokenIdTokenizer(bos_id=self.bos_id, pad_id=self.pad_id,
                                             stop_token_ids=self.stop_token_ids)

  @property
  def max_concurrent_decodes(self) -> int:
    return self.slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    """The longest JetStream prompt: its largest padding bucket that leaves room to generate."""
    fitting = [b for b in _JETSTREAM_BUCKETS if b < self.max_len]
    return fitting[-1] if fitting else self.max_len - 1

  @property
  def mesh(self):
    return self._mesh

  @property
  def colocated_cpus(self) -> None:
    return None

  def compilations(self) -> int:
    """Executables compiled so far by the engine's jitted prefill, insert and step."""
    return sum(f._cache_size() for f in (self._prefill_fn, self._insert_fn, self._step_fn))


def _leaf_specs(tree: dict) -> dict[str, tuple]:
  """`{path: (shape, dtype)}` of a parameter tree's leaves."""
  return {jax.tree_util.keystr(path): (tuple(a.shape), jnp.dtype(a.dtype))
          for path, a in jax.tree_util.tree_flatten_with_path(tree)[0]}


# -------------------------------------------------------------------- jitted bodies


def _prefill(config: ModelConfig, mesh, params: dict, tokens: jax.Array, lengths: jax.Array) -> Prefix:
  out = cached.prefill(config, params, tokens, lengths, mesh=mesh)
  ids = None if out.expert_ids is None else out.expert_ids[:, 0]
  return Prefix(out.k[:, 0], out.v[:, 0], lengths[0], out.last_logits[0], ids)


def _extend(config: ModelConfig, mesh, max_len: int, params: dict, prefix: Prefix, tokens: jax.Array,
            count: jax.Array) -> Prefix:
  """`prefix` continued by the first `count` of `tokens [N]`, one decode step each, in a one-slot
  cache of `max_len` positions (the returned keys and values are that long). Steps past `count`
  leave the cache, logits and expert ids as they were."""
  cache = cached.empty_cache(config, 1, max_len)
  cache = cached.KVCache(jax.lax.dynamic_update_slice(cache.k, prefix.k[:, None].astype(cache.k.dtype), (0,) * 5),
                         jax.lax.dynamic_update_slice(cache.v, prefix.v[:, None].astype(cache.v.dtype), (0,) * 5))
  ids = None
  if prefix.expert_ids is not None:
    ids = jnp.zeros(prefix.expert_ids.shape[:1] + (max_len,) + prefix.expert_ids.shape[2:], prefix.expert_ids.dtype)
    ids = jax.lax.dynamic_update_slice(ids, prefix.expert_ids, (0, 0, 0))

  def feed(carry, xs):
    cache, logits, ids = carry
    i, token = xs
    position = prefix.length + i
    out = cached.decode_step(config, params, cache, token[None], position[None], mesh=mesh)
    live = i < count
    cache = jax.tree.map(lambda new, old: jnp.where(live, new, old), out.cache, cache)
    logits = jnp.where(live, out.logits[0], logits)
    if ids is not None:
      ids = jnp.where(live, jax.lax.dynamic_update_slice(ids, out.expert_ids.astype(ids.dtype),
                                                         (0, position, 0)), ids)
    return (cache, logits, ids), None

  steps = (jnp.arange(tokens.shape[0], dtype=jnp.int32), tokens)
  (cache, logits, ids), _ = jax.lax.scan(feed, (cache, prefix.last_logits, ids), steps)
  return Prefix(cache.k[:, 0], cache.v[:, 0], prefix.length + count, logits, ids)


def _insert(prefix: Prefix, state: DecodeState, slot, key, temperature, top_k, top_p) -> DecodeState:
  token, logprob = sample_tokens(prefix.last_logits[None], token_key(key, 0)[None], temperature[None],
                                 top_k[None], top_p[None])
  k = jax.lax.dynamic_update_slice(state.cache.k, prefix.k[:, None], (0, slot, 0, 0, 0))
  v = jax.lax.dynamic_update_slice(state.cache.v, prefix.v[:, None], (0, slot, 0, 0, 0))
  return DecodeState(cached.KVCache(k, v), state.lengths.at[slot].set(prefix.length),
                     state.tokens.at[slot].set(token[0]), state.logprobs.at[slot].set(logprob[0]),
                     state.generated.at[slot].set(1), state.keys.at[slot].set(key),
                     state.temperature.at[slot].set(temperature), state.top_k.at[slot].set(top_k),
                     state.top_p.at[slot].set(top_p))


def _step(config: ModelConfig, mesh, params: dict, state: DecodeState) -> tuple[DecodeState, StepResult]:
  out = cached.decode_step(config, params, state.cache, state.tokens, state.lengths, mesh=mesh)
  keys = jax.vmap(token_key)(state.keys, state.generated)
  nxt, logprobs = sample_tokens(out.logits, keys, state.temperature, state.top_k, state.top_p)
  table = jnp.stack([state.tokens, jnp.ones_like(state.tokens), state.generated], axis=1)
  result = StepResult(state.tokens, state.logprobs, state.generated, out.expert_ids, table)
  new_state = state._replace(cache=out.cache, lengths=state.lengths + 1, tokens=nxt, logprobs=logprobs,
                             generated=state.generated + 1)
  return new_state, result
