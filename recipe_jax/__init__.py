"""recipe_jax: open LLM post-training recipes in JAX."""

__version__ = "0.1.0"
