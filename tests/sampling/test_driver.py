"""The engine and `generate` against full no-cache forward passes of the same tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.models import forward
from recipe_jax.sampling import Engine, generate

PROMPTS = [[3, 17, 250, 9, 44], [100], [7, 7, 7, 1, 2, 3, 4, 5, 6, 11, 12], [42, 43]]
PAD = 24  # every reference sequence fits


@pytest.fixture(scope="module")
def models(tiny_model):
  out = {}
  for name in ("tiny-dense", "tiny-moe"):
    cfg, params = tiny_model(name)
    ref = jax.jit(lambda p, t, cfg=cfg: forward(cfg, p, t))
    out[name] = (cfg, params, ref, Engine(cfg, params, slots=2, max_len=PAD))
  return out


def _padded(seq):
  return jnp.asarray([list(seq) + [0] * (PAD - len(seq))], jnp.int32)


def _greedy_reference(ref, params, prompt, steps):
  """Argmax loop over full forward passes (causal, so right padding does not matter)."""
  seq = list(prompt)
  for _ in range(steps):
    seq.append(int(jnp.argmax(ref(params, _padded(seq)).logits[0, len(seq) - 1])))
  return seq[len(prompt):]


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_greedy_matches_forward_argmax_logprobs_and_experts(models, name):
  cfg, params, ref, engine = models[name]
  out = generate(engine, PROMPTS, max_new_tokens=6, temperature=0.0)  # 4 prompts, 2 slots
  assert [c.prompt_index for c in out] == [0, 1, 2, 3]
  for c, prompt in zip(out, PROMPTS):
    assert c.finish_reason == "length" and len(c.token_ids) == 6
    assert c.token_ids == _greedy_reference(ref, params, prompt, 6)
    seq = prompt + c.token_ids
    full = ref(params, _padded(seq))
    logp = jax.nn.log_softmax(full.logits[0], axis=-1)
    want = logp[jnp.arange(len(prompt) - 1, len(seq) - 1), jnp.asarray(c.token_ids)]
    np.testing.assert_allclose(c.logprobs, want, atol=1e-5)
    if cfg.is_moe:
      np.testing.assert_array_equal(c.expert_ids, full.expert_ids[:, 0, :len(seq)])
      replay = jnp.zeros_like(full.expert_ids).at[:, 0, :len(seq)].set(c.expert_ids)
      replayed = jax.jit(lambda p, t, r: forward(cfg, p, t, replay_experts=r))(params, _padded(seq), replay)
      replayed_logp = jax.nn.log_softmax(replayed.logits[0, :len(seq)], -1)
      np.testing.assert_allclose(replayed_logp, logp[:len(seq)], atol=1e-5)
    else:
      assert c.expert_ids is None


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_prefill_on_an_existing_prefix_equals_one_prefill(models, name):
  """JetStream prefix reuse: prefill(head) then prefill(existing_prefix=..., tail) is prefill(head + tail)."""
  cfg, params, _, engine = models[name]
  head, tail = PROMPTS[2], PROMPTS[0]
  whole = engine.prefill(padded_tokens=head + tail, true_length=len(head + tail))
  first = engine.prefill(padded_tokens=head, true_length=len(head))
  joined = engine.prefill(existing_prefix=first, padded_tokens=tail + [0] * 3, true_length=len(tail))
  n = len(head + tail)
  assert int(joined.length) == int(whole.length) == n
  np.testing.assert_allclose(joined.last_logits, whole.last_logits, atol=1e-5)
  np.testing.assert_allclose(joined.k[:, :n], whole.k[:, :n], atol=1e-5)
  np.testing.assert_allclose(joined.v[:, :n], whole.v[:, :n], atol=1e-5)
  if cfg.is_moe:
    np.testing.assert_array_equal(joined.expert_ids[:, :n], whole.expert_ids[:, :n])
  state = engine.insert(joined, engine.init_decode_state(), 0, key=jnp.zeros((2,), jnp.uint32))
  again = engine.insert(whole, engine.init_decode_state(), 0, key=jnp.zeros((2,), jnp.uint32))
  assert int(state.tokens[0]) == int(again.tokens[0])
  with pytest.raises(ValueError, match="from existing_prefix"):
    engine.prefill(existing_prefix=joined, padded_tokens=list(range(1, 10)), true_length=9)


def test_continuous_batching_matches_one_at_a_time_and_seeds(models):
  cfg, params, _, engine = models["tiny-moe"]
  single = Engine(cfg, params, slots=1, max_len=PAD)
  kw = dict(max_new_tokens=5, temperature=1.0, top_k=50, top_p=0.95, seed=3)
  batched = generate(engine, PROMPTS, n=2, **kw)     # 8 samples through 2 slots
  for a, b in zip(batched, generate(single, PROMPTS, n=2, **kw)):
    assert a.token_ids == b.token_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
  assert batched[0].token_ids != batched[1].token_ids  # two samples of one prompt differ
  again = generate(engine, PROMPTS, n=2, **kw)
  assert [c.token_ids for c in again] == [c.token_ids for c in batched]
  other_seed = generate(engine, PROMPTS, n=2, **{**kw, "seed": 4})
  assert [c.token_ids for c in other_seed] != [c.token_ids for c in batched]


def test_greedy_continuous_batching_equals_single_slot(models):
  cfg, params, _, engine = models["tiny-dense"]
  single = Engine(cfg, params, slots=1, max_len=PAD)
  batched = generate(engine, PROMPTS, max_new_tokens=4, temperature=0.0)
  for i, p in enumerate(PROMPTS):
    assert generate(single, [p], max_new_tokens=4, temperature=0.0)[0].token_ids == batched[i].token_ids


def test_stop_tokens_length_and_prefill_once(models):
  cfg, params, _, engine = models["tiny-dense"]
  greedy = generate(engine, PROMPTS[:2], max_new_tokens=6, temperature=0.0)
  stop = greedy[0].token_ids[2]
  out = generate(engine, PROMPTS[:2], max_new_tokens=6, temperature=0.0, stop_token_ids=(stop,))
  first = greedy[0].token_ids.index(stop)
  assert out[0].finish_reason == "stop" and out[0].token_ids == greedy[0].token_ids[:first + 1]
  assert out[1].finish_reason == ("stop" if stop in greedy[1].token_ids else "length")
  long_prompt = list(range(1, PAD - 2))  # 21 tokens: the cache holds 3 more
  capped = generate(engine, [long_prompt], max_new_tokens=10, temperature=0.0)[0]
  assert capped.finish_reason == "length" and len(capped.token_ids) == 3

  calls = []
  original = engine.prefill
  engine.prefill = lambda **kw: calls.append(1) or original(**kw)
  try:
    out = generate(engine, PROMPTS[:2], n=3, max_new_tokens=3, temperature=1.0, seed=1)
  finally:
    del engine.prefill
  assert len(calls) == 2 and len(out) == 6
  assert [(c.prompt_index, c.sample_index) for c in out] == [(i, j) for i in range(2) for j in range(3)]


def test_bad_requests_fail_alone(models):
  cfg, params, _, engine = models["tiny-dense"]
  prompts = [[5, 6], [], list(range(PAD)), [1, cfg.vocab_size], [8, 9, 10]]
  out = generate(engine, prompts, max_new_tokens=3, temperature=0.0)
  assert [c.finish_reason for c in out] == ["length", "error", "error", "error", "length"]
  assert "empty prompt" in out[1].error and "max_len" in out[2].error and "[0, 256)" in out[3].error
  assert out[0].token_ids == generate(engine, [[5, 6]], max_new_tokens=3, temperature=0.0)[0].token_ids
  for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-2), dict(max_new_tokens=0)):
    with pytest.raises(ValueError):
      generate(engine, prompts[:1], **{"max_new_tokens": 2, **bad})


def test_update_params_changes_outputs_without_recompiling(models, tiny_model):
  from recipe_jax.models import init_params

  cfg, params, _, _ = models["tiny-moe"]
  engine = Engine(cfg, params, slots=2, max_len=PAD)
  before = generate(engine, PROMPTS[:3], max_new_tokens=4, temperature=0.0)
  compiled = engine.compilations()
  engine.update_params(init_params(cfg, seed=7))
  after = generate(engine, PROMPTS[:3], max_new_tokens=4, temperature=0.0)
  assert engine.compilations() == compiled
  assert [c.token_ids for c in after] != [c.token_ids for c in before]
  engine.update_params(params)
  assert [c.token_ids for c in generate(engine, PROMPTS[:3], max_new_tokens=4, temperature=0.0)] == \
      [c.token_ids for c in before]
  assert engine.compilations() == compiled
  bad = jax.tree.map(lambda a: a, params)
  bad["embed"] = bad["embed"][:, :8]
  with pytest.raises(ValueError, match=r"\['embed'\]"):
    engine.update_params(bad)
