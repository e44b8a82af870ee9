"""Router semantics against a float64 NumPy transcription with explicit loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from recipe_jax.models import get_preset
from recipe_jax.models.router import balance_stats, load_balancing_loss, route


def _route_numpy(logits, cfg, bias):
  """One token at a time: scores, group filter, top-k, gates."""
  logits = np.asarray(logits, np.float64)
  n, e = logits.shape
  k, groups, keep_groups = cfg.num_experts_per_tok, cfg.router_n_group, cfg.router_topk_group
  ids, gates = [], []
  for t in range(n):
    if cfg.router_score == "softmax":
      z = np.exp(logits[t] - logits[t].max())
      s = z / z.sum()
    else:
      s = 1 / (1 + np.exp(-logits[t]))
    choice = s + (bias if bias is not None else 0.0)
    size = e // groups
    group_score = [sorted(choice[g * size:(g + 1) * size])[-2:] for g in range(groups)]
    best = np.argsort([-sum(v) for v in group_score])[:keep_groups]
    allowed = [i for i in range(e) if i // size in best]
    chosen = sorted(allowed, key=lambda i: -choice[i])[:k]
    g = s[chosen]
    if cfg.router_norm_topk_prob:
      g = g / g.sum()
    ids.append(sorted(chosen))
    gates.append(dict(zip(chosen, g * cfg.router_scaling_factor)))
  return ids, gates


@pytest.mark.parametrize("name,groups,norm", [("tiny-moe", 1, True), ("tiny-moe", 1, False),
                                              ("tiny-glm", 2, True), ("tiny-glm", 4, False)])
def test_route_matches_numpy(name, groups, norm):
  cfg = get_preset(name).replace(router_n_group=groups, router_norm_topk_prob=norm)
  logits = jax.random.normal(jax.random.key(0), (32, cfg.num_experts))
  bias = np.asarray(0.3 * jax.random.normal(jax.random.key(1), (cfg.num_experts,)))
  bias_arg = jnp.asarray(bias) if cfg.router_selection_bias else None
  r = route(logits, cfg, selection_bias=bias_arg)
  ids_ref, gates_ref = _route_numpy(logits, cfg, bias if cfg.router_selection_bias else None)
  for t in range(32):
    got = np.asarray(r.expert_ids[t])
    assert sorted(got.tolist()) == ids_ref[t]
    for j, e in enumerate(got):
      np.testing.assert_allclose(r.gates[t, j], gates_ref[t][int(e)], rtol=1e-5)


def test_group_limit_keeps_choices_in_best_groups():
  cfg = get_preset("tiny-glm").replace(router_n_group=4, router_topk_group=1)
  logits = jax.random.normal(jax.random.key(2), (64, cfg.num_experts))
  ids = np.asarray(route(logits, cfg).expert_ids)
  assert (ids // 2 == ids[:, :1] // 2).all()  # all k experts from one group of two


def test_load_balancing_loss_numpy():
  rng = np.random.default_rng(0)
  layers, n, e, k = 3, 10, 6, 2
  logits = rng.normal(size=(layers, n, e))
  valid = np.ones(n, bool)
  valid[-2:] = False
  cfg = get_preset("tiny-moe").replace(num_experts=e, num_experts_per_tok=k)
  counts, probs = zip(*[balance_stats(route(jnp.asarray(l, jnp.float32), cfg), jnp.asarray(valid), e)
                        for l in logits])
  got = load_balancing_loss(jnp.stack(counts), jnp.stack(probs), jnp.asarray(valid.sum()))
  f, p = np.zeros(e), np.zeros(e)
  for l in range(layers):
    for t in range(n):
      if not valid[t]:
        continue
      s = np.exp(logits[l, t]) / np.exp(logits[l, t]).sum()
      for i in np.argsort(-s)[:k]:
        f[i] += 1
      p += s
  rows = layers * valid.sum()
  np.testing.assert_allclose(got, e * np.sum(f / rows * p / rows), rtol=1e-5)
