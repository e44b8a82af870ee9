"""Distillation losses against float64 NumPy transcriptions, plus anchors and invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.losses.distill import (chunked_divergence, distill_advantages, divergence_from_logits,
                                       sampled_kl_loss, sampled_reverse_kl)

B, T, V, DS, DT = 2, 5, 11, 4, 6
_STATIC = ("kind", "beta", "top_k", "temperature", "chunk_size")
divergence = jax.jit(divergence_from_logits, static_argnames=_STATIC[:4])
chunked = jax.jit(chunked_divergence, static_argnames=_STATIC)
KINDS = [("reverse_kl", 0.5), ("forward_kl", 0.5), ("jsd", 0.5), ("jsd", 0.2), ("jsd", 0.0), ("jsd", 1.0)]


# ---------------------------------------------------------------- float64 NumPy transcriptions


def _np_log_softmax(z):
  z = np.asarray(z, np.float64)
  m = max(z)
  return [x - m - np.log(sum(np.exp(y - m) for y in z)) for x in z]


def _np_kl(logp, logq):
  return sum(np.exp(a) * (a - b) for a, b in zip(logp, logq))


def _np_token(zs, zt, kind, beta, top_k, tau):
  """One position: (D, H(P_T), H(P_S), argmax agreement) with explicit loops over the vocabulary."""
  zs, zt = [x / tau for x in np.asarray(zs, np.float64)], [x / tau for x in np.asarray(zt, np.float64)]
  full_s, full_t = _np_log_softmax(zs), _np_log_softmax(zt)
  entropy_t = -sum(np.exp(x) * x for x in full_t)
  entropy_s = -sum(np.exp(x) * x for x in full_s)
  agree = float(int(np.argmax(zs)) == int(np.argmax(zt)))
  if 0 < top_k < len(zt):
    keep = sorted(range(len(zt)), key=lambda v: (-zt[v], v))[:top_k]
    log_s, log_t = _np_log_softmax([zs[v] for v in keep]), _np_log_softmax([zt[v] for v in keep])
  else:
    log_s, log_t = full_s, full_t
  if kind == "forward_kl" or (kind == "jsd" and beta == 0.0):
    d = _np_kl(log_t, log_s)
  elif kind == "reverse_kl" or (kind == "jsd" and beta == 1.0):
    d = _np_kl(log_s, log_t)
  else:
    p_t, p_s = [np.exp(x) for x in log_t], [np.exp(x) for x in log_s]
    mix = [beta * a + (1 - beta) * b for a, b in zip(p_t, p_s)]
    jsd = beta * sum(a * np.log(a / c) for a, c in zip(p_t, mix)) \
        + (1 - beta) * sum(b * np.log(b / c) for b, c in zip(p_s, mix))
    d = jsd / (beta * (1 - beta))
  return d, entropy_t, entropy_s, agree


def _np_terms(zs, zt, mask, kind, beta, top_k=0, tau=1.0):
  out = np.zeros((4,) + mask.shape)
  for b in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[b, t] > 0:
        out[:, b, t] = _np_token(zs[b, t], zt[b, t], kind, beta, top_k, tau)
  return out


def _inputs(seed=0, b=B):
  rng = np.random.default_rng(seed)
  hs = rng.normal(size=(b, T, DS)).astype(np.float32)
  ws = (rng.normal(size=(DS, V)) * 0.8).astype(np.float32)
  ht = rng.normal(size=(b, T, DT)).astype(np.float32)
  wt = (rng.normal(size=(DT, V)) * 0.8).astype(np.float32)
  mask = (rng.random((b, T)) < 0.7).astype(np.float32)
  mask[0, 0] = 1.0
  return [jnp.asarray(x) for x in (hs, ws, ht, wt, mask)]


# ---------------------------------------------------------------- full-distribution divergences


@pytest.mark.parametrize("kind,beta", KINDS)
@pytest.mark.parametrize("top_k,tau", [(0, 1.0), (4, 0.7)])
def test_divergence_matches_numpy(kind, beta, top_k, tau):
  hs, ws, ht, wt, mask = _inputs()
  zs, zt = hs @ ws, ht @ wt
  got = jax.jit(lambda a, b, m: divergence_from_logits(a, b, m, kind=kind, beta=beta, top_k=top_k,
                                                       temperature=tau))(zs, zt, mask)
  ref = _np_terms(np.asarray(zs), np.asarray(zt), np.asarray(mask), kind, beta, top_k, tau)[0]
  np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
  assert float(jnp.min(got)) >= -1e-6 and float(jnp.max(ref)) > 1e-2


@pytest.mark.parametrize("top_k", [0, 3])
def test_zero_when_student_equals_teacher(top_k):
  hs, ws, _, _, mask = _inputs(1)

  @jax.jit
  def all_kinds(h, w, m):
    return [chunked_divergence(h, w, h, w, m, kind=kind, beta=beta, top_k=top_k) for kind, beta in KINDS]

  for (kind, beta), (loss, metrics) in zip(KINDS, all_kinds(hs, ws, mask)):
    np.testing.assert_allclose(loss, 0.0, atol=1e-6, err_msg=f"{kind} beta={beta}")
    np.testing.assert_allclose(metrics.top1_agreement * mask.sum() / metrics.loss_tokens, 1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics.teacher_entropy, metrics.student_entropy, rtol=1e-6)


def test_jsd_endpoints_are_the_two_kls_and_the_family_is_continuous():
  hs, ws, ht, wt, mask = _inputs(2)
  zs, zt = hs @ ws, ht @ wt
  div = lambda kind, beta=0.5: divergence(zs, zt, mask, kind=kind, beta=beta)  # noqa: E731
  forward, reverse = div("forward_kl"), div("reverse_kl")
  np.testing.assert_array_equal(div("jsd", 0.0), forward)
  np.testing.assert_array_equal(div("jsd", 1.0), reverse)
  assert float(jnp.max(jnp.abs(forward - reverse))) > 1e-2     # the two KLs differ here
  # The rescaled JSD tends to the KLs at the ends (float64; the gap is O(beta)) ...
  near0 = _np_terms(np.asarray(zs), np.asarray(zt), np.asarray(mask), "jsd", 1e-6)[0]
  near1 = _np_terms(np.asarray(zs), np.asarray(zt), np.asarray(mask), "jsd", 1 - 1e-6)[0]
  np.testing.assert_allclose(near0, np.asarray(forward), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(near1, np.asarray(reverse), rtol=1e-4, atol=1e-5)
  # ... and float32 stays accurate at the documented edge of the interior, beta = 0.01 and 0.99.
  for beta in (0.01, 0.99):
    ref = _np_terms(np.asarray(zs), np.asarray(zt), np.asarray(mask), "jsd", beta)[0]
    np.testing.assert_allclose(div("jsd", beta), ref, rtol=1e-4, atol=1e-5)
  # In the interior it is GKD's JSD(beta) divided by beta (1 - beta): 4 JSD at beta = 1/2, <= 4 ln 2.
  assert float(jnp.max(div("jsd", 0.5))) <= 4 * np.log(2.0)


def test_metrics_match_numpy():
  hs, ws, ht, wt, mask = _inputs(3)
  n = 11.0
  loss, metrics = chunked(hs, ws, ht, wt, mask, kind="jsd", beta=0.3, temperature=1.5, chunk_size=3, num_tokens=n)
  ref = _np_terms(np.asarray(hs @ ws), np.asarray(ht @ wt), np.asarray(mask), "jsd", 0.3, 0, 1.5)
  ref = ref.sum(axis=(1, 2)) / n
  got = [metrics.loss, metrics.teacher_entropy, metrics.student_entropy, metrics.top1_agreement]
  np.testing.assert_allclose(got, ref, rtol=2e-5)
  np.testing.assert_allclose(loss, ref[0], rtol=2e-5)
  assert float(metrics.loss_tokens) == float(mask.sum())


CHUNK_CASES = [("reverse_kl", 0.5, 0), ("jsd", 0.3, 0), ("forward_kl", 0.5, 4)]


def _losses_and_jacobians(divergence_fn):
  """The CHUNK_CASES losses `[3]` and their Jacobians w.r.t. student hidden, student head, teacher hidden."""
  hs, ws, ht, wt, mask = _inputs(4)

  def losses(h, w, h_t):
    return jnp.stack([divergence_fn(h, w, h_t, wt, mask, kind=kind, beta=beta, top_k=top_k)
                      for kind, beta, top_k in CHUNK_CASES])

  return jax.jit(lambda *x: (losses(*x), jax.jacrev(losses, argnums=(0, 1, 2))(*x)))(hs, ws, ht)


def _chunked_loss(*args, **kw):
  return chunked_divergence(*args, **kw)[0]


@functools.lru_cache(maxsize=None)
def _full_logits_reference():
  def plain(h, w, h_t, w_t, m, **kw):
    return jnp.sum(divergence_from_logits(h @ w, h_t @ w_t, m, **kw)) / m.sum()
  return _losses_and_jacobians(plain)


@pytest.mark.parametrize("chunk", [1, 3])   # T = 5: 1 divides it, 3 leaves a padded last chunk
def test_chunked_equals_the_full_logits_reference(chunk):
  values, jacobians = _losses_and_jacobians(functools.partial(_chunked_loss, chunk_size=chunk))
  ref_values, ref_jacobians = _full_logits_reference()
  np.testing.assert_allclose(values, ref_values, rtol=1e-5)
  for got, ref in zip(jacobians[:2], ref_jacobians[:2]):      # student hidden and student head
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(got).max()) > 1e-3
  assert float(jnp.abs(jacobians[2]).max()) == 0.0              # the teacher is a constant


def test_top_k_restriction():
  hs, ws, ht, wt, mask = _inputs(5)
  zs, zt = hs @ ws, ht @ wt
  full = divergence(zs, zt, mask, kind="reverse_kl")
  np.testing.assert_array_equal(divergence(zs, zt, mask, kind="reverse_kl", top_k=V), full)
  # One kept token: both renormalized distributions are a point mass on it.
  np.testing.assert_allclose(divergence(zs, zt, mask, kind="jsd", top_k=1), 0.0, atol=1e-6)
  # Student logits outside the teacher's top-k get no gradient; those inside do.
  grad = jax.jit(jax.grad(lambda z: divergence_from_logits(z, zt, mask, kind="forward_kl", top_k=3).sum()))(zs)
  inside = np.zeros(zs.shape, bool)
  np.put_along_axis(inside, np.argsort(-np.asarray(zt), axis=-1)[..., :3], True, axis=-1)
  assert float(jnp.abs(jnp.where(inside, 0.0, grad)).max()) == 0.0
  assert float(jnp.abs(jnp.where(inside & (np.asarray(mask)[..., None] > 0), grad, 0.0)).max()) > 1e-3
  assert not np.allclose(divergence(zs, zt, mask, kind="reverse_kl", top_k=3), full)


@jax.jit
@functools.partial(jax.value_and_grad, argnums=(0, 1), has_aux=True)
def _jsd_step(h, w, h_t, w_t, m, n):
  return chunked_divergence(h, w, h_t, w_t, m, kind="jsd", beta=0.4, num_tokens=n)


@pytest.mark.parametrize("splits", [2, 4])
def test_micro_batches_add_up_to_the_step(splits):
  hs, ws, ht, wt, mask = _inputs(6, b=4)
  n = mask.sum()
  (full, full_metrics), (g_h, g_w) = _jsd_step(hs, ws, ht, wt, mask, n)
  parts, g_hs, g_w_sum = [], [], 0.0
  for i in range(splits):
    sl = slice(i * 4 // splits, (i + 1) * 4 // splits)
    (_, metrics), (gh, gw) = _jsd_step(hs[sl], ws, ht[sl], wt, mask[sl], n)
    parts.append(metrics)
    g_hs.append(gh)
    g_w_sum = g_w_sum + gw
  summed = jax.tree.map(lambda *x: sum(x), *parts)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), summed, full_metrics)
  np.testing.assert_allclose(summed.loss, full, rtol=1e-5)
  np.testing.assert_allclose(jnp.concatenate(g_hs), g_h, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g_w_sum, g_w, rtol=1e-5, atol=1e-7)


def test_masked_positions_change_neither_loss_nor_gradient():
  hs, ws, ht, wt, mask = _inputs(7)
  off = (mask == 0)[..., None]
  f = lambda h: chunked_divergence(h, ws, jnp.where(off, 5.0, ht), wt, mask)[0]  # noqa: E731
  hs2 = jnp.where(off, hs + 3.0, hs)
  step = jax.jit(jax.value_and_grad(f))
  np.testing.assert_allclose(step(hs2)[0], step(hs)[0], rtol=1e-6)
  assert float(jnp.abs(jnp.where(off, step(hs)[1], 0.0)).max()) == 0.0


def test_jit_equals_eager_and_bf16_is_finite():
  hs, ws, ht, wt, mask = _inputs(8)
  f = lambda h, w: chunked_divergence(h, w, ht, wt, mask, kind="jsd")[0]  # noqa: E731
  eager = f(hs, ws)
  np.testing.assert_allclose(jax.jit(f)(hs, ws), eager, rtol=1e-6)
  out = jax.jit(f)(hs.astype(jnp.bfloat16), ws.astype(jnp.bfloat16))
  assert out.dtype == jnp.float32 and bool(jnp.isfinite(out))
  np.testing.assert_allclose(out, eager, rtol=0.1)


def test_bad_arguments_are_errors():
  hs, ws, ht, wt, mask = _inputs()
  with pytest.raises(ValueError, match="kind"):
    chunked_divergence(hs, ws, ht, wt, mask, kind="tvd")
  with pytest.raises(ValueError, match="beta"):
    chunked_divergence(hs, ws, ht, wt, mask, kind="jsd", beta=1.5)
  with pytest.raises(ValueError, match="top_k"):
    chunked_divergence(hs, ws, ht, wt, mask, top_k=-1)
  with pytest.raises(ValueError, match="temperature"):
    chunked_divergence(hs, ws, ht, wt, mask, temperature=0.0)
  with pytest.raises(ValueError, match="chunk_size"):
    chunked_divergence(hs, ws, ht, wt, mask, chunk_size=0)
  with pytest.raises(ValueError, match="heads"):
    chunked_divergence(hs, ws, ht, wt[:, :5], mask)
  with pytest.raises(ValueError, match="must both start"):
    chunked_divergence(hs, ws, ht[:, :3], wt, mask)
  with pytest.raises(ValueError, match=r"\[B, T\]"):
    sampled_kl_loss(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)))


# ---------------------------------------------------------------- sampled-token reverse KL


def _sampled_inputs(seed=9, b=4):
  rng = np.random.default_rng(seed)
  student = -rng.gamma(2.0, 1.0, size=(b, T)).astype(np.float32)
  teacher = -rng.gamma(2.0, 1.0, size=(b, T)).astype(np.float32)
  mask = (rng.random((b, T)) < 0.7).astype(np.float32)
  return jnp.asarray(student), jnp.asarray(teacher), jnp.asarray(mask)


def test_sampled_loss_matches_numpy():
  student, teacher, mask = _sampled_inputs()
  n = 17.0
  s, tt, m = (np.asarray(x, np.float64) for x in (student, teacher, mask))
  d = np.zeros_like(s)
  for b in range(s.shape[0]):
    for t in range(s.shape[1]):
      d[b, t] = (s[b, t] - tt[b, t]) * m[b, t]
  (loss, metrics), grads = jax.value_and_grad(
      lambda x, y: sampled_kl_loss(x, y, mask, num_tokens=n), argnums=(0, 1), has_aux=True)(student, teacher)
  np.testing.assert_allclose(sampled_reverse_kl(student, teacher, mask), d, rtol=1e-6)
  np.testing.assert_allclose(loss, d.sum() / n, rtol=1e-5)
  np.testing.assert_allclose(metrics.reverse_kl, d.sum() / n, rtol=1e-5)
  np.testing.assert_allclose(metrics.student_logp, (s * m).sum() / n, rtol=1e-5)
  np.testing.assert_allclose(metrics.teacher_logp, (tt * m).sum() / n, rtol=1e-5)
  np.testing.assert_allclose(grads[0], d / n, rtol=1e-5, atol=1e-8)  # d_t grad log pi_S, d(logp) = 1
  assert float(jnp.abs(grads[1]).max()) == 0.0                       # the teacher is a constant
  adv = distill_advantages(student, teacher, mask, 0.25)
  np.testing.assert_allclose(adv, -0.25 * d, rtol=1e-6)
  assert float(jnp.abs(jax.grad(lambda x: distill_advantages(x, teacher, mask).sum())(student)).max()) == 0.0


def test_sampled_estimator_expectation_is_the_exact_reverse_kl():
  """Enumerate every token y of a small vocabulary at one position, weighted by pi_S(y)."""
  vocab = 6
  theta = jax.random.normal(jax.random.key(0), (vocab,)) * 1.3           # student logits
  teacher = jax.nn.log_softmax(jax.random.normal(jax.random.key(1), (vocab,)) * 1.3)
  one = jnp.ones((1, 1))
  losses = {
      "surrogate": lambda s, t: sampled_kl_loss(s, t, one, num_tokens=1.0)[0],
      "naive": lambda s, t: sampled_reverse_kl(s, t, one).sum(),
      "policy_gradient": lambda s, t: -jnp.sum(distill_advantages(s, t, one, 0.5) * s),
  }

  @jax.jit
  def expectations(th):
    """E_{y ~ softmax(th)} of each loss and of its gradient; the sampling is not differentiated."""
    probs = jax.nn.softmax(th)
    out = {}
    for name, fn in losses.items():
      per_y = lambda x, y, fn=fn: fn(jax.nn.log_softmax(x)[y].reshape(1, 1), teacher[y].reshape(1, 1))
      values, grads = jax.vmap(jax.value_and_grad(per_y), in_axes=(None, 0))(th, jnp.arange(vocab))
      out[name] = (probs @ values, probs @ grads)
    kl = lambda x: divergence_from_logits(x.reshape(1, 1, -1), teacher.reshape(1, 1, -1), one)[0, 0]
    out["exact"] = jax.value_and_grad(kl)(th)
    return out

  got = expectations(theta)
  p, lp_s, lp_t = (np.asarray(x, np.float64) for x in (jax.nn.softmax(theta), jax.nn.log_softmax(theta), teacher))
  gap = lp_s - lp_t
  exact_kl, exact_grad = np.sum(p * gap), p * (gap - np.sum(p * gap))   # KL(softmax(theta) || p_T), float64
  assert np.abs(exact_grad).max() > 0.05
  np.testing.assert_allclose(got["exact"][0], exact_kl, rtol=1e-5)
  np.testing.assert_allclose(got["exact"][1], exact_grad, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got["surrogate"][0], exact_kl, rtol=1e-5)
  np.testing.assert_allclose(got["surrogate"][1], exact_grad, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got["policy_gradient"][1], 0.5 * exact_grad, rtol=1e-4, atol=1e-6)
  # Differentiating d_t itself gives no signal in expectation: E[grad log pi_S] = 0.
  np.testing.assert_allclose(got["naive"][0], exact_kl, rtol=1e-5)
  np.testing.assert_allclose(got["naive"][1], 0.0, atol=1e-6)


@pytest.mark.parametrize("splits", [2, 4])
def test_sampled_loss_micro_batches_add_up(splits):
  student, teacher, mask = _sampled_inputs(10)
  n = mask.sum()
  step = jax.jit(jax.value_and_grad(lambda x, y, m: sampled_kl_loss(x, y, m, num_tokens=n), has_aux=True))
  (full, full_metrics), g_full = step(student, teacher, mask)
  parts, grads = [], []
  for i in range(splits):
    sl = slice(i * 4 // splits, (i + 1) * 4 // splits)
    (_, metrics), g = step(student[sl], teacher[sl], mask[sl])
    parts.append(metrics)
    grads.append(g)
  summed = jax.tree.map(lambda *x: sum(x), *parts)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), summed, full_metrics)
  np.testing.assert_allclose(summed.reverse_kl, full, rtol=1e-5)
  np.testing.assert_allclose(jnp.concatenate(grads), g_full, rtol=1e-6)
