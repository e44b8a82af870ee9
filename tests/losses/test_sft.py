"""sft_loss and token log-probs against float64 NumPy transcriptions, plus invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.losses import (count_sequences, logprobs_from_logits, sft_loss, token_logprobs)


def _numpy_sft(logprobs, mask, segment_ids, normalization, n_tok, n_seq, c):
  lp, m = np.asarray(logprobs, np.float64), np.asarray(mask, np.float64)
  total = 0.0
  if normalization in ("sum", "token_mean"):
    for b in range(lp.shape[0]):
      for t in range(lp.shape[1]):
        total += -lp[b, t] * m[b, t]
    return total / (c if normalization == "sum" else n_tok)
  for b in range(lp.shape[0]):
    for s in set(np.asarray(segment_ids[b]).tolist()):
      idx = [t for t in range(lp.shape[1]) if segment_ids[b, t] == s]
      n_s = sum(m[b, t] for t in idx)
      if n_s:
        total += sum(-lp[b, t] * m[b, t] for t in idx) / n_s
  return total / n_seq


def _inputs(seed=0, b=4, t=10):
  rng = np.random.default_rng(seed)
  logprobs = -rng.gamma(2.0, 1.0, size=(b, t)).astype(np.float32)
  mask = (rng.random((b, t)) < 0.6).astype(np.float32)
  segs = np.sort(rng.integers(1, 4, size=(b, t)), axis=1)
  segs[:, -2:] = 0  # padding at the end of each row
  mask[:, -2:] = 0
  return logprobs, mask, segs


@pytest.mark.parametrize("normalization", ["sum", "token_mean", "sequence_mean"])
@pytest.mark.parametrize("packed", [False, True])
def test_matches_numpy(normalization, packed):
  lp, m, segs = _inputs()
  seg_arg = jnp.asarray(segs) if packed else None
  n_tok = float(m.sum())
  n_seq = float(count_sequences(jnp.asarray(m), seg_arg))
  got, metrics = sft_loss(jnp.asarray(lp), jnp.asarray(m), normalization=normalization, num_tokens=n_tok,
                          num_sequences=n_seq, sum_constant=3.0, segment_ids=seg_arg)
  ref_segs = segs if packed else np.ones_like(segs)
  ref = _numpy_sft(lp, m, ref_segs, normalization, n_tok, n_seq, 3.0)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  np.testing.assert_allclose(metrics.loss_tokens, n_tok)


def test_count_sequences_counts_segments_with_loss():
  m = jnp.array([[1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]], jnp.float32)
  seg = jnp.array([[1, 1, 2, 2, 3, 0], [1, 1, 1, 2, 2, 0]])
  assert float(count_sequences(m, seg)) == 2.0  # segments 1 and 3 of row 0
  assert float(count_sequences(m)) == 1.0


def test_uniform_prediction_anchor():
  lp = jnp.log(jnp.full((2, 5), 0.5))
  m = jnp.ones((2, 5))
  loss, _ = sft_loss(lp, m, normalization="token_mean", num_tokens=10.0)
  np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)


@pytest.mark.parametrize("normalization", ["sum", "token_mean", "sequence_mean"])
def test_masked_positions_change_neither_loss_nor_gradient(normalization):
  lp, m, segs = _inputs(1)
  kw = dict(normalization=normalization, num_tokens=float(m.sum()), num_sequences=5.0,
            segment_ids=jnp.asarray(segs))
  f = lambda x: sft_loss(x, jnp.asarray(m), **kw)[0]
  lp2 = np.where(m > 0, lp, lp - 7.0)
  np.testing.assert_allclose(f(jnp.asarray(lp)), f(jnp.asarray(lp2)), rtol=1e-6)
  g = jax.grad(f)(jnp.asarray(lp))
  assert float(jnp.abs(jnp.where(m > 0, 0.0, g)).max()) == 0.0


@pytest.mark.parametrize("normalization", ["sum", "token_mean", "sequence_mean"])
@pytest.mark.parametrize("splits", [1, 2, 4])
def test_micro_batches_sum_to_the_full_batch(normalization, splits):
  lp, m, segs = _inputs(2, b=8)
  lp, m, segs = jnp.asarray(lp), jnp.asarray(m), jnp.asarray(segs)
  kw = dict(normalization=normalization, num_tokens=m.sum(), num_sequences=count_sequences(m, segs))
  full = jax.grad(lambda x: sft_loss(x, m, segment_ids=segs, **kw)[0])(lp)
  parts = []
  for i in range(splits):
    sl = slice(i * 8 // splits, (i + 1) * 8 // splits)
    parts.append(jax.grad(lambda x: sft_loss(x, m[sl], segment_ids=segs[sl], **kw)[0])(lp[sl]))
  np.testing.assert_allclose(jnp.concatenate(parts), full, rtol=1e-6, atol=1e-9)


def test_jit_equals_eager_and_bf16_is_finite():
  lp, m, segs = _inputs(3)
  f = lambda x: sft_loss(x, jnp.asarray(m), normalization="sequence_mean", num_sequences=4.0,
                         segment_ids=jnp.asarray(segs))[0]
  np.testing.assert_allclose(jax.jit(f)(jnp.asarray(lp)), f(jnp.asarray(lp)), rtol=1e-6)
  out = f(jnp.asarray(lp, jnp.bfloat16))
  assert out.dtype == jnp.float32 and bool(jnp.isfinite(out))


def test_missing_normalizer_is_an_error():
  with pytest.raises(ValueError, match="num_tokens"):
    sft_loss(jnp.zeros((1, 2)), jnp.ones((1, 2)), normalization="token_mean")
  with pytest.raises(ValueError, match="must both be"):
    sft_loss(jnp.zeros((1, 2)), jnp.ones((2, 2)))


@pytest.mark.parametrize("t,chunk", [(37, 8), (64, 16), (5, 8)])
def test_chunked_logprobs_equal_plain(t, chunk):
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  hidden = jax.random.normal(k1, (2, t, 16))
  head = jax.random.normal(k2, (16, 50)) * 0.3
  targets = jax.random.randint(k3, (2, t), 0, 50)
  plain = lambda h, w: logprobs_from_logits(h @ w, targets)
  chunked = lambda h, w: token_logprobs(h, w, targets, chunk_size=chunk)
  np.testing.assert_allclose(chunked(hidden, head), plain(hidden, head), rtol=1e-5, atol=1e-5)
  loss = lambda fn: (lambda h, w: jnp.sum(fn(h, w) * jnp.cos(jnp.arange(t))))
  g_plain = jax.grad(loss(plain), argnums=(0, 1))(hidden, head)
  g_chunk = jax.grad(loss(chunked), argnums=(0, 1))(hidden, head)
  for a, b in zip(g_plain, g_chunk):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
