"""Dropless expert computation: a dense reference and the grouped-matmul fast paths.

Given tokens `x [n, D]`, their chosen experts `ids [n, k]` and gates
`gates [n, k]`, every path computes

    y_t = sum_j gates[t, j] * FFN_{ids[t, j]}(x_t),
    FFN_e(x) = (silu(x W^gate_e) * (x W^up_e)) W^down_e.

* `experts_dense`: every expert on every token, masked. The slow twin.
* `experts_ragged`: token copies sorted by expert, one `jax.lax.ragged_dot`
  per projection. No token is ever dropped.
* `experts_sharded`: the ragged path inside `shard_map` over the mesh. Tokens
  are split over the batch axes; experts over `expert`; the expert hidden
  dimension over `tensor`. Token copies travel to the device that holds their
  expert and back with an all-to-all: `padded` uses `jax.lax.all_to_all` on a
  worst-case buffer per destination (runs everywhere, including CPU),
  `ragged` uses `jax.lax.ragged_all_to_all` (TPU and GPU; XLA on CPU lacks it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from recipe_jax.parallel.mesh import BATCH_AXES


def _ffn_ragged(x, group_sizes, w_gate, w_up, w_down):
  dt = x.dtype
  h = jax.nn.silu(jax.lax.ragged_dot(x, w_gate.astype(dt), group_sizes))
  h = h * jax.lax.ragged_dot(x, w_up.astype(dt), group_sizes)
  return jax.lax.ragged_dot(h, w_down.astype(dt), group_sizes)


def _combine(y_sorted, order, gates):
  """Puts sorted token copies back in token order and sums them with their gates."""
  n, k = gates.shape
  y = jnp.zeros_like(y_sorted).at[order].set(y_sorted).reshape(n, k, -1)
  return jnp.einsum("nkd,nk->nd", y.astype(jnp.float32), gates.astype(jnp.float32))


def experts_dense(x, ids, gates, w_gate, w_up, w_down):
  """Reference: all experts on all tokens, outputs weighted by a dense `[n, E]` gate matrix."""
  dt = x.dtype
  n, e = x.shape[0], w_gate.shape[0]
  h = jax.nn.silu(jnp.einsum("nd,edm->nem", x, w_gate.astype(dt)))
  h = h * jnp.einsum("nd,edm->nem", x, w_up.astype(dt))
  y = jnp.einsum("nem,emd->ned", h, w_down.astype(dt))
  dense_gates = jnp.zeros((n, e), jnp.float32).at[jnp.arange(n)[:, None], ids].add(gates)
  return jnp.einsum("ned,ne->nd", y.astype(jnp.float32), dense_gates).astype(dt)


def _sort_by_expert(x, ids, num_experts):
  """Token copies sorted by expert id: (rows [n*k, D], order [n*k], group_sizes [E])."""
  k = ids.shape[1]
  flat = ids.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  rows = x[order // k]
  group_sizes = jnp.zeros((num_experts,), jnp.int32).at[flat].add(1)
  return rows, order, group_sizes


def experts_ragged(x, ids, gates, w_gate, w_up, w_down):
  """All experts local: sort token copies by expert, grouped matmuls, unsort."""
  rows, order, group_sizes = _sort_by_expert(x, ids, w_gate.shape[0])
  y = _ffn_ragged(rows, group_sizes, w_gate, w_up, w_down)
  return _combine(y, order, gates).astype(x.dtype)


# ----------------------------------------------------------------------------
# Expert parallel: the exchange of token copies
# ----------------------------------------------------------------------------


def _exclusive_cumsum(v):
  return jnp.cumsum(v) - v


def _send_padded(rows, send_sizes, ep, cap):
  """Scatters expert-sorted rows into a `[ep, cap, D]` buffer, one slot per destination."""
  dest = jnp.repeat(jnp.arange(ep), send_sizes, total_repeat_length=rows.shape[0])
  slot = jnp.arange(rows.shape[0]) - _exclusive_cumsum(send_sizes)[dest]
  buf = jnp.zeros((ep, cap, rows.shape[1]), rows.dtype).at[dest, slot].set(rows)
  return buf, dest, slot


def _local_expert_layout(recv_counts, cap):
  """For a received `[ep, cap]` buffer: local expert id of each slot (E_local = padding)."""
  e_local = recv_counts.shape[1]
  ends = jnp.cumsum(recv_counts, axis=1)                                # [ep, E_local]
  slots = jnp.arange(cap)
  lid = jax.vmap(lambda e: jnp.searchsorted(e, slots, side="right"))(ends)
  return jnp.minimum(lid, e_local).astype(jnp.int32)                     # [ep, cap]


def _expert_parallel_local(x, ids, gates, w_gate, w_up, w_down, *, num_experts, a2a):
  """Body run on each device inside `shard_map`."""
  ep = jax.lax.axis_size("expert")
  n, k = ids.shape
  d = x.shape[1]
  e_local = num_experts // ep
  cap = n * k  # dropless: in the worst case every copy goes to one device

  rows, order, group_sizes = _sort_by_expert(x, ids, num_experts)
  sizes_by_dest = group_sizes.reshape(ep, e_local)
  send_sizes = sizes_by_dest.sum(1)
  recv_counts = jax.lax.all_to_all(sizes_by_dest, "expert", 0, 0, tiled=True)  # [ep, E_local]

  if a2a == "padded":
    send_buf, dest, slot = _send_padded(rows, send_sizes, ep, cap)
    recv = jax.lax.all_to_all(send_buf, "expert", 0, 0, tiled=True)
  else:
    me = jax.lax.axis_index("expert")
    recv_sizes = recv_counts.sum(1)
    recv = jax.lax.ragged_all_to_all(
        rows, jnp.zeros((ep * cap, d), rows.dtype), _exclusive_cumsum(send_sizes), send_sizes,
        jnp.full((ep,), me * cap, jnp.int32), recv_sizes, axis_name="expert")
    recv = recv.reshape(ep, cap, d)

  # Group the received copies by local expert (padding slots last) and compute.
  lid = _local_expert_layout(recv_counts, cap).reshape(-1)
  order2 = jnp.argsort(lid, stable=True)
  local_sizes = recv_counts.sum(0)
  y_sorted = _ffn_ragged(recv.reshape(ep * cap, d)[order2], local_sizes, w_gate, w_up, w_down)
  y_recv = jnp.zeros_like(y_sorted).at[order2].set(y_sorted)

  if a2a == "padded":
    back = jax.lax.all_to_all(y_recv.reshape(ep, cap, d), "expert", 0, 0, tiled=True)
    y = back[dest, slot]
  else:
    # Every sender's send sizes, to know where our results land in its buffer.
    all_sizes = jax.lax.all_gather(send_sizes, "expert")                 # [ep(src), ep(dst)]
    me = jax.lax.axis_index("expert")
    offsets_at_src = jnp.where(jnp.arange(ep)[None, :] < me, all_sizes, 0).sum(1)
    y = jax.lax.ragged_all_to_all(
        y_recv, jnp.zeros((n * k, d), y_recv.dtype), jnp.arange(ep, dtype=jnp.int32) * cap,
        recv_counts.sum(1), offsets_at_src.astype(jnp.int32), send_sizes, axis_name="expert")

  # Each `tensor` shard holds a slice of the expert hidden dimension: sum the partial outputs.
  out = jax.lax.psum(_combine(y, order, gates), "tensor")
  return out.astype(x.dtype)


def _in_token_chunks(body, chunk: int):
  """Runs `body(x, ids, gates, *weights)` on `chunk` tokens at a time (a `lax.map` over chunks).

  Each chunk's exchange buffers are sized for `chunk` tokens, so the dropless worst
  case (`ep * chunk * k` rows) stays bounded however many tokens a device holds. The
  chunk body is rematerialized: the backward pass keeps only each chunk's inputs.
  """
  def run(x, ids, gates, *weights):
    n = x.shape[0]
    if chunk <= 0 or n <= chunk:
      return body(x, ids, gates, *weights)
    if n % chunk:
      raise ValueError(f"moe_token_chunk={chunk} does not divide the {n} tokens per device")
    one = jax.checkpoint(lambda xs: body(*xs, *weights))
    split = lambda a: a.reshape(n // chunk, chunk, *a.shape[1:])
    return jax.lax.map(one, (split(x), split(ids), split(gates))).reshape(n, -1)
  return run


def experts_sharded(x, ids, gates, w_gate, w_up, w_down, *, mesh, a2a: str = "padded",
                    token_chunk: int = 0):
  """Expert-parallel dropless MoE over `mesh` (axes data, fsdp, expert, tensor).

  Args:
    x: tokens `[n, D]`, `n` divisible by the product of the batch axes.
    ids, gates: `[n, k]`.
    w_gate, w_up: `[E, D, M]`; w_down `[E, M, D]`.
    mesh: the device mesh.
    a2a: `padded` (jax.lax.all_to_all) or `ragged` (jax.lax.ragged_all_to_all).
    token_chunk: exchange at most this many tokens per device at a time (0: all).
  """
  num_experts = w_gate.shape[0]
  tok = P(BATCH_AXES, None)
  body = _in_token_chunks(functools.partial(_expert_parallel_local, num_experts=num_experts, a2a=a2a),
                          token_chunk)
  fn = jax.shard_map(
      body, mesh=mesh,
      in_specs=(tok, tok, tok, P("expert", None, "tensor"), P("expert", None, "tensor"),
                P("expert", "tensor", None)),
      out_specs=tok)
  return fn(x, ids, gates, w_gate, w_up, w_down)
