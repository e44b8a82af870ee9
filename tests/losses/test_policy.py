"""policy_loss against a float64 NumPy transcription with explicit loops, plus analytic anchors and invariants."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.losses.policy import (AGGREGATIONS, CORRECTIONS, RATIO_LEVELS, PolicyMetrics, kl_reward_penalty,
                                      policy_loss, sequence_sums, token_kl)

B, T = 3, 7


# ---------------------------------------------------------------------------------------------
# The reference: one loop over sequences, one over their tokens, every formula as in the papers.
# ---------------------------------------------------------------------------------------------
def _np_kl(lp, ref, estimator):
  d = lp - ref
  return {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1.0}[estimator]


def _np_policy(lp, old, adv, mask, *, segs=None, sampler=None, ref=None, entropy=None, num_tokens, num_sequences,
               ratio_level="token", clip_low=0.2, clip_high=0.2, dual_clip=None, aggregation="token_mean",
               sum_constant=1.0, kl_coef=0.0, kl_estimator="k3", correction="none", correction_cap=2.0,
               correction_bounds=(0.5, 2.0)):
  """(loss, metrics dict) in float64; `old` None means old = lp."""
  lp = np.asarray(lp, np.float64)
  old = lp if old is None else np.asarray(old, np.float64)
  segs = np.ones(lp.shape, int) if segs is None else np.asarray(segs)
  stats = dict.fromkeys(PolicyMetrics._fields, 0.0)
  pg_total = kl_total = 0.0
  for b in range(lp.shape[0]):
    for s in sorted(set(segs[b].tolist()) - {0}):
      tokens = [t for t in range(lp.shape[1]) if segs[b, t] == s and mask[b, t] > 0]
      if not tokens:
        continue
      n = len(tokens)
      seq_ratio = math.exp(sum(lp[b, t] - old[b, t] for t in tokens) / n)
      seq_w = math.exp(sum(old[b, t] - sampler[b, t] for t in tokens)) if sampler is not None else 1.0
      for t in tokens:
        a = float(adv[b, t])
        rho = math.exp(lp[b, t] - old[b, t]) if ratio_level == "token" else seq_ratio
        clipped = min(max(rho, 1 - clip_low), 1 + clip_high)
        loss_t = max(-rho * a, -clipped * a)
        dual = dual_clip is not None and a < 0 and loss_t > -dual_clip * a
        if dual:
          loss_t = -dual_clip * a
        w_tok = math.exp(old[b, t] - sampler[b, t]) if sampler is not None else 1.0
        w = {"none": 1.0, "truncate_token": min(w_tok, correction_cap),
             "truncate_sequence": min(seq_w, correction_cap),
             "mask_token": float(correction_bounds[0] <= w_tok <= correction_bounds[1]),
             "mask_sequence": float(correction_bounds[0] <= seq_w <= correction_bounds[1])}[correction]
        denominator = {"token_mean": num_tokens, "sequence_mean_token_mean": num_sequences * n,
                       "sequence_mean_token_sum": num_sequences, "constant_sum": sum_constant}[aggregation]
        pg_total += w * loss_t / denominator
        if kl_coef > 0:
          kl_total += _np_kl(lp[b, t], float(ref[b, t]), kl_estimator) / denominator
        log_r = lp[b, t] - old[b, t]
        for key, value in (("clip_frac_low", rho < 1 - clip_low and a < 0),
                           ("clip_frac_high", rho > 1 + clip_high and a > 0), ("dual_clip_frac", dual),
                           ("approx_kl", math.exp(log_r) - 1 - log_r),
                           ("entropy", 0.0 if entropy is None else entropy[b, t]),
                           ("ratio_mean", rho), ("ratio_sq_mean", rho * rho),
                           ("sampler_abs_diff", 0.0 if sampler is None else abs(old[b, t] - sampler[b, t])),
                           ("correction_masked_frac", correction.startswith("mask") and w == 0.0),
                           ("correction_weight_mean", w)):
          stats[key] += float(value) / num_tokens
  stats["pg_loss"], stats["kl_loss"] = pg_total, kl_total
  return pg_total + kl_coef * kl_total, stats


def _inputs(seed=0, b=B, t=T, packed=True):
  """Ragged masks, ratios spread enough that every clip fires, two segments per row when packed."""
  rng = np.random.default_rng(seed)
  lp = -rng.gamma(2.0, 0.7, size=(b, t)).astype(np.float32)
  old = (lp + rng.normal(0.0, 0.35, size=(b, t))).astype(np.float32)
  sampler = (old + rng.normal(0.0, 0.4, size=(b, t))).astype(np.float32)
  ref = (lp + rng.normal(0.0, 0.5, size=(b, t))).astype(np.float32)
  adv = rng.normal(0.0, 1.0, size=(b, t)).astype(np.float32)
  entropy = rng.gamma(2.0, 0.5, size=(b, t)).astype(np.float32)
  mask = (rng.random((b, t)) < 0.8).astype(np.float32)
  mask[:, 0] = 1.0  # every row has a sequence
  segs = np.ones((b, t), np.int32)
  if packed:
    segs[:, t // 2:] = 2
    segs[:, -1] = 0  # a padding token at the end of each row
    mask[:, -1] = 0.0
  return dict(lp=lp, old=old, sampler=sampler, ref=ref, adv=adv, entropy=entropy, mask=mask, segs=segs)


def _denominators(x, packed=True):
  """(M, N): loss tokens outside padding segments, and the (row, segment) pairs that hold them."""
  m, segs = x["mask"], x["segs"] if packed else np.ones_like(x["segs"])
  tokens = [(b, t) for b in range(m.shape[0]) for t in range(m.shape[1]) if m[b, t] > 0 and segs[b, t] > 0]
  return float(len(tokens)), float(len({(b, segs[b, t]) for b, t in tokens}))


def _jax_call(x, packed=True, old=True, **kw):
  n_tok, n_seq = _denominators(x, packed)
  return policy_loss(jnp.asarray(x["lp"]), jnp.asarray(x["old"]) if old else None, jnp.asarray(x["adv"]),
                     jnp.asarray(x["mask"]), num_tokens=n_tok, num_sequences=n_seq,
                     segment_ids=jnp.asarray(x["segs"]) if packed else None, max_segments=2 if packed else 1,
                     sampler_logprobs=jnp.asarray(x["sampler"]), ref_logprobs=jnp.asarray(x["ref"]),
                     entropy=jnp.asarray(x["entropy"]), **kw)


def _np_call(x, packed=True, old=True, **kw):
  n_tok, n_seq = _denominators(x, packed)
  return _np_policy(x["lp"], x["old"] if old else None, x["adv"], x["mask"], segs=x["segs"] if packed else None,
                    sampler=x["sampler"], ref=x["ref"], entropy=x["entropy"], num_tokens=n_tok,
                    num_sequences=n_seq, **kw)


def _assert_matches(got, want):
  loss, metrics = got
  np.testing.assert_allclose(loss, want[0], rtol=1e-5, atol=1e-6)
  for field in PolicyMetrics._fields:
    np.testing.assert_allclose(getattr(metrics, field), want[1][field], rtol=1e-5, atol=1e-6, err_msg=field)


# ---------------------------------------------------------------------------------------------
# Against the reference.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
def test_matches_numpy(ratio_level, aggregation, correction):
  x = _inputs(seed=len(correction) + 3 * len(aggregation))
  clips = dict(clip_low=0.05, clip_high=0.08) if ratio_level != "token" else dict(clip_low=0.2, clip_high=0.28)
  kw = dict(ratio_level=ratio_level, aggregation=aggregation, correction=correction, dual_clip=1.5, kl_coef=0.05,
            sum_constant=9.0, correction_cap=1.3, correction_bounds=(0.7, 1.4), **clips)
  _assert_matches(_jax_call(x, **kw), _np_call(x, **kw))


@pytest.mark.parametrize("kl_estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
def test_unpacked_rows_and_kl_estimators_match_numpy(ratio_level, kl_estimator):
  x = _inputs(seed=7, packed=False)
  kw = dict(ratio_level=ratio_level, kl_coef=0.3, kl_estimator=kl_estimator, aggregation="sequence_mean_token_mean",
            clip_low=0.1, clip_high=0.1)
  _assert_matches(_jax_call(x, packed=False, **kw), _np_call(x, packed=False, **kw))


def test_every_clip_and_correction_branch_is_exercised():
  """Guards the comparisons above against inputs too tame to reach a branch."""
  x = _inputs(seed=3)
  _, metrics = _jax_call(x, dual_clip=1.2, clip_low=0.1, clip_high=0.1, correction="mask_token",
                         correction_bounds=(0.7, 1.4))
  for field in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "correction_masked_frac"):
    assert 0.0 < float(getattr(metrics, field)) < 1.0, field


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean_token_mean"])
@pytest.mark.parametrize("ratio_level,correction", [("token", "truncate_token"), ("token", "mask_sequence"),
                                                    ("sequence", "none"), ("sequence", "truncate_sequence")])
def test_gradient_matches_finite_differences(ratio_level, correction, aggregation):
  """GSPO-token shares the value of `sequence` but not its gradient; it is checked separately below."""
  x = _inputs(seed=11)
  kw = dict(ratio_level=ratio_level, correction=correction, aggregation=aggregation, dual_clip=1.5, kl_coef=0.1,
            clip_low=0.1, clip_high=0.1, correction_bounds=(0.6, 1.6))
  n_tok, n_seq = _denominators(x)
  f = lambda lp: policy_loss(lp, jnp.asarray(x["old"]), jnp.asarray(x["adv"]), jnp.asarray(x["mask"]),  # noqa: E731
                             num_tokens=n_tok, num_sequences=n_seq, segment_ids=jnp.asarray(x["segs"]),
                             max_segments=2, sampler_logprobs=jnp.asarray(x["sampler"]),
                             ref_logprobs=jnp.asarray(x["ref"]), **kw)[0]
  got = np.asarray(jax.grad(f)(jnp.asarray(x["lp"])))
  h, want = 1e-6, np.zeros(x["lp"].shape)
  for idx in np.ndindex(*x["lp"].shape):
    up, down = dict(x, lp=x["lp"].astype(np.float64)), dict(x, lp=x["lp"].astype(np.float64))
    up["lp"][idx] += h
    down["lp"][idx] -= h
    want[idx] = (_np_call(up, **kw)[0] - _np_call(down, **kw)[0]) / (2 * h)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Analytic anchors.
# ---------------------------------------------------------------------------------------------
def test_dual_clip_worked_example():
  ratios, adv = np.array([2.0, 2.0, 0.5]), np.array([2.0, -2.0, 2.0])
  old = np.zeros((1, 3), np.float32)
  lp = np.log(ratios)[None].astype(np.float32)
  per_token = []
  for t in range(3):
    one = np.zeros((1, 3), np.float32)
    one[0, t] = 1.0
    loss, _ = policy_loss(jnp.asarray(lp), jnp.asarray(old), jnp.asarray(adv[None]), jnp.asarray(one),
                          num_tokens=1.0, num_sequences=1.0, clip_low=0.2, clip_high=0.2, dual_clip=1.5,
                          aggregation="constant_sum", sum_constant=1.0)
    per_token.append(float(loss))
  np.testing.assert_allclose(per_token, [-2.4, 3.0, -1.0], rtol=1e-6)
  _, metrics = policy_loss(jnp.asarray(lp), jnp.asarray(old), jnp.asarray(adv[None]), jnp.ones((1, 3)),
                           num_tokens=3.0, num_sequences=1.0, dual_clip=1.5)
  np.testing.assert_allclose([metrics.clip_frac_high, metrics.clip_frac_low, metrics.dual_clip_frac],
                             [1 / 3, 0.0, 1 / 3], rtol=1e-6)


def _plain_pg_denominator(aggregation, x, n_tok, n_seq):
  """Per token: the aggregation's divisor of A_t (|y_i| counted per packed segment)."""
  m, segs = x["mask"], x["segs"]
  lengths = np.zeros_like(m)
  for b in range(m.shape[0]):
    for t in range(m.shape[1]):
      lengths[b, t] = sum(m[b, u] for u in range(m.shape[1]) if segs[b, u] == segs[b, t])
  return {"token_mean": n_tok, "sequence_mean_token_mean": n_seq * np.maximum(lengths, 1),
          "sequence_mean_token_sum": n_seq, "constant_sum": 5.0}[aggregation]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("old_given", [False, True])
def test_ratio_one_gives_plain_policy_gradient(ratio_level, aggregation, old_given):
  """At pi_old = pi_theta every variant's gradient is -A_t m_t / denominator, and no clip fires."""
  x = _inputs(seed=5)
  seq_adv = np.where(x["segs"] == 2, 0.7, -1.3).astype(np.float32)  # constant per sequence, as in GRPO
  x = dict(x, adv=seq_adv * x["mask"], old=x["lp"])
  n_tok, n_seq = _denominators(x)

  def f(lp):
    return policy_loss(lp, jnp.asarray(x["old"]) if old_given else None, jnp.asarray(x["adv"]),
                       jnp.asarray(x["mask"]), num_tokens=n_tok, num_sequences=n_seq,
                       segment_ids=jnp.asarray(x["segs"]), max_segments=2, ratio_level=ratio_level,
                       aggregation=aggregation, sum_constant=5.0, dual_clip=3.0)
  (_, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(x["lp"]))
  want = -x["adv"] * x["mask"] / _plain_pg_denominator(aggregation, x, n_tok, n_seq)
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
  for field in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl"):
    assert float(getattr(metrics, field)) == 0.0, field
  np.testing.assert_allclose([metrics.ratio_mean, metrics.ratio_sq_mean], [1.0, 1.0], rtol=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("correction", ["none", "truncate_sequence", "mask_sequence"])
def test_gspo_sequence_and_token_variants_agree_with_sequence_advantages(aggregation, correction):
  x = _inputs(seed=9)
  x["adv"] = np.where(x["segs"] == 2, -0.4, 1.1).astype(np.float32)
  n_tok, n_seq = _denominators(x)

  def value_and_grad(level):
    f = lambda lp: policy_loss(lp, jnp.asarray(x["old"]), jnp.asarray(x["adv"]), jnp.asarray(x["mask"]),  # noqa
                               num_tokens=n_tok, num_sequences=n_seq, segment_ids=jnp.asarray(x["segs"]),
                               max_segments=2, sampler_logprobs=jnp.asarray(x["sampler"]), ratio_level=level,
                               clip_low=0.05, clip_high=0.05, aggregation=aggregation, correction=correction,
                               correction_bounds=(0.6, 1.6))[0]
    return jax.value_and_grad(f)(jnp.asarray(x["lp"]))

  (v_seq, g_seq), (v_tok, g_tok) = value_and_grad("sequence"), value_and_grad("sequence_token")
  np.testing.assert_allclose(v_tok, v_seq, rtol=1e-6)
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-7)
  assert float(jnp.abs(g_seq).max()) > 0.0


def test_gspo_token_routes_per_token_advantages_to_their_own_tokens():
  """With per-token advantages GSPO-token differs from `sequence`: token t's gradient is -w A_t s_i."""
  x = _inputs(seed=2, packed=False)
  n_tok, n_seq = _denominators(x, packed=False)
  f = lambda lp: policy_loss(lp, jnp.asarray(x["old"]), jnp.asarray(x["adv"]), jnp.asarray(x["mask"]),  # noqa
                             num_tokens=n_tok, num_sequences=n_seq, ratio_level="sequence_token",
                             clip_low=1.0, clip_high=1e6)[0]  # no clip fires
  grad = jax.grad(f)(jnp.asarray(x["lp"]))
  m = x["mask"]
  s = np.exp(((x["lp"] - x["old"]) * m).sum(1, keepdims=True) / m.sum(1, keepdims=True))
  np.testing.assert_allclose(grad, -x["adv"] * s * m / n_tok, rtol=1e-5, atol=1e-7)


def test_k3_is_nonnegative_and_zero_at_the_reference():
  rng = np.random.default_rng(0)
  lp, ref = jnp.asarray(rng.normal(-2, 2, 500)), jnp.asarray(rng.normal(-2, 2, 500))
  assert float(token_kl(lp, ref, "k3").min()) >= 0.0
  assert float(jnp.abs(token_kl(lp, lp, "k3")).max()) == 0.0
  np.testing.assert_allclose(token_kl(lp, ref, "k1"), lp - ref, rtol=1e-6)
  np.testing.assert_allclose(token_kl(lp, ref, "k2"), 0.5 * (lp - ref) ** 2, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Invariants: micro-batches, packing, masking, jit, precision.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio_level,aggregation,correction", [
    ("token", "token_mean", "truncate_token"), ("sequence", "sequence_mean_token_mean", "mask_sequence"),
    ("sequence_token", "sequence_mean_token_sum", "truncate_sequence"), ("token", "constant_sum", "mask_token")])
def test_micro_batches_add_up_to_the_full_batch(ratio_level, aggregation, correction):
  x = _inputs(seed=4)
  kw = dict(ratio_level=ratio_level, aggregation=aggregation, correction=correction, dual_clip=2.0, kl_coef=0.1,
            sum_constant=6.0)
  n_tok, n_seq = _denominators(x)

  def run(rows):
    part = {k: v[rows] for k, v in x.items()}
    return jax.value_and_grad(
        lambda lp: policy_loss(lp, jnp.asarray(part["old"]), jnp.asarray(part["adv"]), jnp.asarray(part["mask"]),
                               num_tokens=n_tok, num_sequences=n_seq, segment_ids=jnp.asarray(part["segs"]),
                               max_segments=2, sampler_logprobs=jnp.asarray(part["sampler"]),
                               ref_logprobs=jnp.asarray(part["ref"]), entropy=jnp.asarray(part["entropy"]), **kw),
        has_aux=True)(jnp.asarray(part["lp"]))

  (full_loss, full_metrics), full_grad = run(slice(0, 3))
  (loss_a, metrics_a), grad_a = run(slice(0, 1))
  (loss_b, metrics_b), grad_b = run(slice(1, 3))
  np.testing.assert_allclose(loss_a + loss_b, full_loss, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.concatenate([grad_a, grad_b]), full_grad, rtol=1e-5, atol=1e-8)
  for field in PolicyMetrics._fields:
    np.testing.assert_allclose(getattr(metrics_a, field) + getattr(metrics_b, field), getattr(full_metrics, field),
                               rtol=1e-5, atol=1e-7, err_msg=field)


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
@pytest.mark.parametrize("aggregation,correction", [("sequence_mean_token_mean", "truncate_sequence"),
                                                    ("token_mean", "mask_sequence")])
def test_packed_rows_equal_one_sequence_per_row(ratio_level, aggregation, correction):
  """Two sequences of length T: rows [2, T] unpacked, or one packed row [1, 2T] with segment ids 1, 2."""
  x = _inputs(seed=6, b=2, packed=False)
  kw = dict(ratio_level=ratio_level, aggregation=aggregation, correction=correction, dual_clip=1.5, kl_coef=0.2,
            clip_low=0.1, clip_high=0.1, correction_bounds=(0.6, 1.6))
  n_tok, n_seq = _denominators(x, packed=False)
  pack = lambda a: jnp.asarray(a).reshape(1, 2 * T)  # noqa: E731
  segs = jnp.repeat(jnp.array([[1, 2]]), T, axis=1)

  def run(shape, segment_ids, max_segments):
    def f(lp):
      return policy_loss(lp, shape(x["old"]), shape(x["adv"]), shape(x["mask"]), num_tokens=n_tok,
                         num_sequences=n_seq, segment_ids=segment_ids, max_segments=max_segments,
                         sampler_logprobs=shape(x["sampler"]), ref_logprobs=shape(x["ref"]),
                         entropy=shape(x["entropy"]), **kw)
    return jax.value_and_grad(f, has_aux=True)(shape(x["lp"]))

  (loss_u, metrics_u), grad_u = run(jnp.asarray, None, 1)
  (loss_p, metrics_p), grad_p = run(pack, segs, 2)
  np.testing.assert_allclose(loss_p, loss_u, rtol=1e-6)
  np.testing.assert_allclose(grad_p.reshape(2, T), grad_u, rtol=1e-6, atol=1e-8)
  for field in PolicyMetrics._fields:
    np.testing.assert_allclose(getattr(metrics_p, field), getattr(metrics_u, field), rtol=1e-6, err_msg=field)


def test_segment_zero_is_padding_even_under_the_mask():
  x = _inputs(seed=10)
  kw = dict(ratio_level="sequence", aggregation="sequence_mean_token_mean", correction="mask_sequence")
  loss, metrics = _jax_call(x, **kw)
  marked = dict(x, mask=np.where(x["segs"] == 0, 1.0, x["mask"]).astype(np.float32))
  loss_marked, metrics_marked = _jax_call(marked, **kw)  # the same step-global denominators are passed in
  np.testing.assert_allclose(loss_marked, loss, rtol=1e-6)
  np.testing.assert_allclose(metrics_marked.ratio_mean, metrics.ratio_mean, rtol=1e-6)


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS)
def test_masked_positions_change_neither_loss_nor_gradient(ratio_level):
  x = _inputs(seed=8)
  kw = dict(ratio_level=ratio_level, correction="truncate_sequence", kl_coef=0.1,
            aggregation="sequence_mean_token_mean")
  junk = {k: np.where(x["mask"] > 0, v, np.float32(-1e4)) for k, v in x.items() if k not in ("mask", "segs", "lp")}
  junk_lp = np.where(x["mask"] > 0, x["lp"], -np.inf).astype(np.float32)  # padding log-probs may be -inf
  (loss_a, _), grad_a = jax.value_and_grad(lambda lp: _jax_call(dict(x, lp=lp), **kw), has_aux=True)(x["lp"])
  (loss_b, _), grad_b = jax.value_and_grad(lambda lp: _jax_call(dict(x, **junk, lp=lp), **kw), has_aux=True)(
      jnp.asarray(junk_lp))
  np.testing.assert_allclose(loss_b, loss_a, rtol=1e-6)
  np.testing.assert_allclose(grad_b, grad_a, rtol=1e-6, atol=1e-9)
  assert float(jnp.abs(jnp.where(x["mask"] > 0, 0.0, grad_b)).max()) == 0.0


def test_jit_equals_eager_and_bf16_inputs_give_finite_float32():
  x = _inputs(seed=1)
  kw = dict(ratio_level="sequence_token", correction="truncate_token", kl_coef=0.1, dual_clip=2.0)
  eager = _jax_call(x, **kw)
  jitted = jax.jit(lambda lp: _jax_call(dict(x, lp=lp), **kw))(x["lp"])
  np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-6)
  for field in PolicyMetrics._fields:
    np.testing.assert_allclose(getattr(jitted[1], field), getattr(eager[1], field), rtol=1e-6, err_msg=field)
  bf16 = {k: (jnp.asarray(v, jnp.bfloat16) if v.dtype == np.float32 else v) for k, v in x.items()}
  loss, metrics = policy_loss(bf16["lp"], bf16["old"], bf16["adv"], bf16["mask"], num_tokens=10.0,
                              num_sequences=4.0, ref_logprobs=bf16["ref"], kl_coef=0.1)
  assert loss.dtype == jnp.float32 and bool(jnp.isfinite(loss))
  assert all(bool(jnp.isfinite(v)) and v.dtype == jnp.float32 for v in metrics)


def test_kl_coef_zero_never_reads_the_reference():
  x = _inputs(seed=12)
  without, m_without = _jax_call(x, kl_coef=0.0)
  loss, metrics = policy_loss(jnp.asarray(x["lp"]), jnp.asarray(x["old"]), jnp.asarray(x["adv"]),
                              jnp.asarray(x["mask"]), num_tokens=10.0, num_sequences=3.0, ref_logprobs=None)
  assert bool(jnp.isfinite(loss)) and float(metrics.kl_loss) == 0.0
  nan_ref = np.full_like(x["ref"], np.nan)
  with_nan, m_nan = _jax_call(dict(x, ref=nan_ref), kl_coef=0.0)
  assert float(with_nan) == float(without) and float(m_nan.kl_loss) == 0.0 == float(m_without.kl_loss)
  with_kl, m_kl = _jax_call(x, kl_coef=0.5)
  np.testing.assert_allclose(with_kl, without + 0.5 * m_kl.kl_loss, rtol=1e-6)
  assert float(m_kl.kl_loss) != 0.0


def test_kl_reward_penalty_is_a_masked_constant():
  x = _inputs(seed=13)
  lp, ref, m = jnp.asarray(x["lp"]), jnp.asarray(x["ref"]), jnp.asarray(x["mask"])
  penalty = kl_reward_penalty(lp, ref, m, 0.05)
  np.testing.assert_allclose(penalty, -0.05 * (x["lp"] - x["ref"]) * x["mask"], rtol=1e-6, atol=1e-8)
  grad = jax.grad(lambda a: kl_reward_penalty(a, ref, m, 0.05).sum())(lp)
  assert float(jnp.abs(grad).max()) == 0.0
  per_sequence = sequence_sums(penalty, m, segment_ids=jnp.asarray(x["segs"]), max_segments=2)
  want = [[sum(float(penalty[b, t]) for t in range(T) if x["segs"][b, t] == s) for s in (1, 2)] for b in range(B)]
  np.testing.assert_allclose(per_sequence, want, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kwargs,message", [
    (dict(ratio_level="seq"), "ratio_level 'seq'"), (dict(aggregation="mean"), "aggregation 'mean'"),
    (dict(kl_estimator="k4"), "kl_estimator 'k4'"), (dict(correction="tis"), "correction 'tis'"),
    (dict(clip_low=-0.1), "clip_low"), (dict(clip_high=-0.2), "clip_high"), (dict(dual_clip=1.0), "dual_clip"),
    (dict(max_segments=0), "max_segments"), (dict(sum_constant=0.0), "sum_constant"),
    (dict(kl_coef=0.1), "needs ref_logprobs"), (dict(correction="mask_token"), "needs sampler_logprobs"),
    (dict(correction_bounds=(2.0, 0.5)), "correction_bounds"), (dict(correction_cap=0.0), "correction_cap"),
    (dict(segment_ids=jnp.full((B, T), 3)), r"segment_ids must lie in \[0, max_segments = 1\]"),
    (dict(advantages=jnp.zeros((B, T + 1))), "advantages has shape"),
    (dict(logprobs=jnp.zeros((B, T, 2))), r"logprobs must be \[B, T\]"),
])
def test_bad_arguments_raise_clear_errors(kwargs, message):
  x = _inputs(seed=0)
  call = dict(logprobs=jnp.asarray(x["lp"]), old_logprobs=None, advantages=jnp.asarray(x["adv"]),
              mask=jnp.asarray(x["mask"]), num_tokens=1.0, num_sequences=1.0)
  with pytest.raises(ValueError, match=message):
    policy_loss(**{**call, **kwargs})
