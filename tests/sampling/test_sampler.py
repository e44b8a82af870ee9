"""Statistical checks of temperature, top-k and top-p sampling on a small vocabulary."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.sampling.sampler import SamplingParams, request_key, sample_tokens, token_key

LOGITS = jnp.log(jnp.asarray([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
DRAWS = 4000


def _frequencies(temperature, top_k, top_p, seed=0):
  keys = jax.random.split(jax.random.key(seed), DRAWS)
  fn = jax.jit(sample_tokens)
  tokens, logprobs = fn(jnp.broadcast_to(LOGITS, (DRAWS, 6)), keys, jnp.full((DRAWS,), temperature),
                        jnp.full((DRAWS,), top_k, jnp.int32), jnp.full((DRAWS,), top_p))
  np.testing.assert_allclose(logprobs, jax.nn.log_softmax(LOGITS)[tokens], atol=1e-6)
  return np.bincount(np.asarray(tokens), minlength=6) / DRAWS


def _close(freq, probs):
  tol = 4 * np.sqrt(probs * (1 - probs) / DRAWS) + 1e-9  # four standard errors
  assert np.all(np.abs(freq - probs) <= tol), (freq, probs)


def test_temperature_one_and_two():
  p = np.asarray(jax.nn.softmax(LOGITS))
  _close(_frequencies(1.0, 0, 1.0), p)
  hot = p ** 0.5 / (p ** 0.5).sum()
  _close(_frequencies(2.0, 0, 1.0), hot)


def test_top_k_and_top_p_renormalize_the_kept_tokens():
  p = np.asarray(jax.nn.softmax(LOGITS))
  top2 = np.where(np.arange(6) < 2, p, 0) / p[:2].sum()
  _close(_frequencies(1.0, 2, 1.0), top2)
  # top_p 0.7: 0.4 + 0.25 = 0.65 < 0.7, so the third token is needed too
  top3 = np.where(np.arange(6) < 3, p, 0) / p[:3].sum()
  _close(_frequencies(1.0, 0, 0.7), top3)
  _close(_frequencies(1.0, 2, 0.7), top2)   # both filters: the stricter wins


def test_greedy_rows_and_reproducible_keys():
  assert np.all(_frequencies(0.0, 0, 1.0) == np.eye(6)[0])
  a, b = _frequencies(1.0, 0, 1.0, seed=5), _frequencies(1.0, 0, 1.0, seed=5)
  np.testing.assert_array_equal(a, b)
  k = request_key(3, 1, 0)
  assert jax.random.key_data(token_key(k, 2)).tolist() == jax.random.key_data(token_key(k, 2)).tolist()
  assert request_key(3, 1, 0).tolist() != request_key(3, 1, 1).tolist()


@pytest.mark.parametrize("bad", [dict(temperature=-0.5), dict(temperature=float("nan")), dict(top_p=1.5),
                                 dict(top_p=0.0), dict(top_k=-1), dict(top_k=2.5)])
def test_invalid_settings_name_the_field(bad):
  with pytest.raises(ValueError, match=next(iter(bad))):
    SamplingParams(**bad)
