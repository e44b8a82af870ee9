"""The result every verifier returns."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Score:
  """A reward in [0, 1] with the reason it was given.

  value: the reward; verifiers with binary rewards return exactly 0.0 or 1.0.
  reason: a short machine-friendly reason ("correct", "no_boxed_answer", "timeout",
    "crash", "sandbox_error", ...), optionally followed by ": details".
  details: optional extra facts for logs and reports (must be JSON-serializable).
  """

  value: float
  reason: str
  details: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not 0.0 <= self.value <= 1.0:
      raise ValueError(f"Score.value must be in [0, 1], got {self.value} (reason {self.reason!r})")

  @classmethod
  def correct(cls, reason: str = "correct", **details) -> "Score":
    return cls(1.0, reason, details)

  @classmethod
  def wrong(cls, reason: str, **details) -> "Score":
    return cls(0.0, reason, details)
