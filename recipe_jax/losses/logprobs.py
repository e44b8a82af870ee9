"""Per-token log-probabilities of target tokens, plain and chunked over the sequence.

log pi(y_t | y_<t) = z_t[y_t] - logsumexp_v z_t[v],   z_t = h_t W   (float32)

The chunked form computes the logits of `chunk_size` positions at a time and
rematerializes them in the backward pass, so the `[B, T, V]` float32 logits
(19 GiB for B*T = 32K tokens at V = 151,552) never exist at once; only
`[B, chunk, V]` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def logprobs_from_logits(logits: Float[Array, "B T V"], targets: Int[Array, "B T"]) -> Float[Array, "B T"]:
  """Reference: log-softmax of the full logits in float32, read at the targets."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _chunk_logprobs(h, w, y):
  logits = jnp.einsum("btd,dv->btv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
  picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
  return picked - jax.nn.logsumexp(logits, axis=-1)


def _chunk_logprobs_entropy(h, w, y):
  logits = jnp.einsum("btd,dv->btv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
  picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
  lse = jax.nn.logsumexp(logits, axis=-1)
  z = jax.lax.stop_gradient(logits)
  entropy = jax.lax.stop_gradient(lse) - jnp.sum(jax.nn.softmax(z, axis=-1) * z, axis=-1)
  return picked - lse, entropy


def entropy_from_logits(logits: Float[Array, "B T V"]) -> Float[Array, "B T"]:
  """Reference: the entropy -sum_v p_v log p_v of each position's distribution (float32)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def token_logprobs(hidden: Float[Array, "B T D"], head: Float[Array, "D V"], targets: Int[Array, "B T"], *,
                   chunk_size: int = 1024, with_entropy: bool = False):
  """log pi(targets | context) from final hidden states and the LM head, `chunk_size` positions at a time.

  Args:
    hidden: final-norm hidden states `[B, T, D]` (`forward(..., return_hidden=True)`).
    head: LM head `[D, V]` (the transposed embedding for tied models).
    targets: `[B, T]` token ids whose log-probabilities are wanted (usually the next tokens).
    chunk_size: positions per chunk; `T` is padded up to a multiple of it.

    with_entropy: also return each position's entropy `[B, T]` (a metric: no gradient).

  Returns:
    `[B, T]` float32 log-probabilities, equal to `logprobs_from_logits(hidden @ head, targets)`;
    with `with_entropy`, the pair (log-probabilities, entropies).
  """
  b, t, _ = hidden.shape
  chunk_fn = _chunk_logprobs_entropy if with_entropy else _chunk_logprobs
  if t <= chunk_size:
    return chunk_fn(hidden, head, targets.astype(jnp.int32))
  n = -(-t // chunk_size)
  pad = n * chunk_size - t
  h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  y = jnp.pad(targets.astype(jnp.int32), ((0, 0), (0, pad)))
  h = h.reshape(b, n, chunk_size, -1).swapaxes(0, 1)   # [n, B, chunk, D]
  y = y.reshape(b, n, chunk_size).swapaxes(0, 1)
  body = jax.checkpoint(lambda hy: chunk_fn(hy[0], head, hy[1]))
  out = jax.lax.map(body, (h, y))                      # [n, B, chunk] (a pair with entropy)
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(b, n * chunk_size)[:, :t], out)
