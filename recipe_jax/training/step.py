"""The one train step every stage uses: normalizers, micro-batches, gradients, clipping, update.

A stage supplies two functions:

* `normalizers_fn(batch) -> dict` runs once on the whole optimizer-step batch
  (e.g. loss tokens, sequences) before the micro-batch loop;
* `loss_fn(params, micro_batch, normalizers) -> (loss, metrics)` with metrics a
  dict of scalars that add up across micro-batches (sums, not means).

Because losses are normalized by step-global quantities, gradients are summed
over micro-batches, and the result is the same however the batch is split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class TrainState(NamedTuple):
  step: jax.Array       # int32 scalar: optimizer steps taken
  params: Any           # float32 master weights
  opt_state: Any


def init_train_state(params, optimizer: optax.GradientTransformation) -> TrainState:
  return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def split_micro_batches(batch: dict, n: int) -> dict:
  """`[B, ...]` -> `[n, B/n, ...]`, micro-batch i taking rows i, i+n, i+2n, ...

  Strided rather than contiguous, so that each device's rows of a batch-sharded
  array are spread evenly over the micro-batches.
  """
  def split(x):
    if x.shape[0] % n:
      raise ValueError(f"batch of {x.shape[0]} rows does not split into {n} micro-batches")
    return x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def accumulate_gradients(loss_fn: Callable, params, batch: dict, normalizers: dict, num_micro_batches: int):
  """Sum of loss, metrics and gradients over micro-batches (a `lax.scan` when there are several)."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if num_micro_batches == 1:
    (loss, metrics), grads = grad_fn(params, batch, normalizers)
    return loss, metrics, grads

  micro = split_micro_batches(batch, num_micro_batches)

  def body(carry, mb):
    (loss, metrics), grads = grad_fn(params, mb, normalizers)
    return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

  first = jax.tree.map(lambda x: x[0], micro)
  (loss0, metrics0), grads0 = jax.eval_shape(grad_fn, params, first, normalizers)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, metrics0, grads0))
  (loss, metrics, grads), _ = jax.lax.scan(body, zeros, micro)
  return loss, metrics, grads


def make_train_step(loss_fn: Callable, optimizer: optax.GradientTransformation, *,
                    normalizers_fn: Callable[[dict], dict] = lambda batch: {},
                    num_micro_batches: int = 1, learning_rate_fn: Callable | None = None):
  """Returns `train_step(state, batch) -> (state, metrics)`, pure; jit it with shardings and donation.

  metrics: `loss` (the step's total loss), `grad_norm` (before clipping), `learning_rate`
  (when `learning_rate_fn` is given), the normalizers and the summed `loss_fn` metrics.
  """

  def train_step(state: TrainState, batch: dict):
    normalizers = normalizers_fn(batch)
    loss, metrics, grads = accumulate_gradients(loss_fn, state.params, batch, normalizers,
                                                num_micro_batches)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    out = dict(metrics, **normalizers, loss=loss, grad_norm=optax.global_norm(grads))
    if learning_rate_fn is not None:
      out["learning_rate"] = learning_rate_fn(state.step)
    return TrainState(state.step + 1, params, opt_state), out

  return train_step


def jit_train_step(train_step: Callable, *, state_shardings=None, batch_shardings=None, donate: bool = True):
  """jit with sharded inputs and outputs; the old state's buffers are donated to the new one."""
  kwargs = {}
  if state_shardings is not None:
    kwargs["in_shardings"] = (state_shardings, batch_shardings)
    kwargs["out_shardings"] = (state_shardings, None)
  return jax.jit(train_step, donate_argnums=(0,) if donate else (), **kwargs)
