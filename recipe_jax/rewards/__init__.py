"""Verifiable rewards: each verifier module exposes `score(response, reference, **options) -> Score`."""

from recipe_jax.rewards.score import Score

__all__ = ["Score"]
