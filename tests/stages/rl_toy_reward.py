"""A verifier for RL tests on random tiny models: reward 1 when the response text has even length.

Random models never solve real tasks, so every group would have equal rewards; this one gives
groups a spread of rewards without any model skill. Imported by the reward pool's workers
(pytest puts this directory on sys.path, which the workers inherit).
"""

from recipe_jax.rewards.score import Score


def score(response: str, reference: str) -> Score:
  del reference
  return Score.correct("even_length") if len(response) % 2 == 0 else Score.wrong("odd_length")
