"""Step machinery shared by every stage: optimizer, train state, the jitted train step."""

from recipe_jax.training.optimizer import OptimizerConfig, learning_rate_schedule, make_optimizer
from recipe_jax.training.step import (TrainState, accumulate_gradients, init_train_state, jit_train_step,
                                      make_train_step, split_micro_batches)

__all__ = ["OptimizerConfig", "TrainState", "accumulate_gradients", "init_train_state", "jit_train_step",
           "learning_rate_schedule", "make_optimizer", "make_train_step", "split_micro_batches"]
