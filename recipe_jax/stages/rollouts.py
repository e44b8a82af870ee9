"""Group rollouts for RL: sample G responses per prompt, score them, filter groups, advantages.

One call of `collect` fills a batch of `prompts_per_step` groups:

  take prompts -> engine.generate (n = G, token ids, log-probs, expert ids kept)
  -> reward pool (each response against its prompt's reference) -> truncation rule
  -> group filters (dynamic sampling: drop groups whose rewards are all equal; the
     learnability band: keep groups whose pass rate lies in (low, high])
  -> repeat with fresh prompts until the batch is full or `max_extra_rounds` ran out
  -> `set_advantages`: group advantages (`recipe_jax.losses.advantages`), after the stage
     has applied any KL reward penalty.

Nothing is dropped silently: every group removed is counted by reason in `RolloutStats`,
every verifier failure keeps its reason (reward 0), and a generation error removes its
group under "generation_error".
"""

from __future__ import annotations

import collections
import dataclasses
import time
import zlib
from typing import Literal

import numpy as np

from recipe_jax.config import require
from recipe_jax.data.prompts import Prompt, PromptPipeline
from recipe_jax.losses.advantages import group_advantages
from recipe_jax.rewards.pool import Item, RewardPool
from recipe_jax.sampling.driver import Completion, generate


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Sampling, scoring and group filtering.

  truncation: a response that hit the length limit is left in ("none"), masked out of the
    loss ("mask"; it still counts toward its group's statistics), or given reward
    `truncation_penalty` ("penalty"; Tülu 3 uses -10).
  dynamic_sampling: drop groups whose rewards are all equal (no learning signal) and sample
    more prompts, at most `max_extra_rounds` extra rounds per step.
  band: keep only groups whose pass rate (fraction of rewards >= `pass_threshold`) lies in
    (band[0], band[1]] (Rufus-Air: (0, 0.8]); None keeps all.
  """

  group_size: int = 8
  max_new_tokens: int = 256
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  dynamic_sampling: bool = True
  band: tuple[float, float] | None = None
  max_extra_rounds: int = 4
  pass_threshold: float = 1.0
  truncation: Literal["none", "mask", "penalty"] = "mask"
  truncation_penalty: float = -10.0
  advantage: Literal["normalized", "mean_only", "leave_one_out"] = "normalized"
  std_ddof: int = 1
  std_eps: float = 1e-6
  reward_workers: int = 2
  reward_deadline_s: float = 60.0

  def __post_init__(self):
    require(self.group_size >= 2, "rollout.group_size", f"must be >= 2 for group advantages, got {self.group_size}")
    require(self.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    require(self.max_extra_rounds >= 0, "rollout.max_extra_rounds", "must be >= 0")
    require(self.band is None or (len(self.band) == 2 and 0.0 <= self.band[0] < self.band[1] <= 1.0),
            "rollout.band", f"must be (low, high) with 0 <= low < high <= 1, got {self.band}")
    require(self.truncation in ("none", "mask", "penalty"), "rollout.truncation",
            f"must be none, mask or penalty, got {self.truncation!r}")


@dataclasses.dataclass
class Sample:
  """One response of a group, ready to become a training sequence."""

  prompt_ids: list[int]
  token_ids: list[int]
  sampler_logprobs: np.ndarray
  finish_reason: str
  reward: float
  reason: str
  advantage: float = 0.0
  expert_ids: np.ndarray | None = None   # [L_moe, len(prompt) + len(tokens), k]
  train: bool = True                     # False: masked out of the loss (truncation "mask")


@dataclasses.dataclass
class Group:
  prompt: Prompt
  samples: list[Sample]

  @property
  def rewards(self) -> np.ndarray:
    return np.asarray([s.reward for s in self.samples], np.float64)


@dataclasses.dataclass
class RolloutStats:
  """What one step's sampling did (all plain numbers, for the metrics file)."""

  rounds: int = 0
  prompts: int = 0
  groups_kept: int = 0
  responses: int = 0
  response_tokens: int = 0
  truncated: int = 0
  reward_sum: float = 0.0
  passed: int = 0
  dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  reasons: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  data_exhausted: bool = False
  batch_incomplete: bool = False
  generate_s: float = 0.0
  score_s: float = 0.0

  def metrics(self) -> dict[str, float]:
    n = max(self.responses, 1)
    out = {"rollout/rounds": self.rounds, "rollout/prompts": self.prompts, "rollout/groups_kept": self.groups_kept,
           "rollout/responses": self.responses, "rollout/response_tokens": self.response_tokens,
           "rollout/reward_mean": self.reward_sum / n, "rollout/pass_rate": self.passed / n,
           "rollout/truncated_frac": self.truncated / n, "rollout/batch_incomplete": float(self.batch_incomplete),
           "time/generate_s": self.generate_s, "time/score_s": self.score_s,
           "time/generate_tokens_per_s": self.response_tokens / max(self.generate_s, 1e-9)}
    out.update({f"rollout/dropped/{k}": v for k, v in self.dropped.items()})
    out.update({f"reward_reason/{k}": v for k, v in self.reasons.items()})
    return out


def round_seed(seed: int, step: int, round_index: int) -> int:
  """The sampling seed of one round of one step (independent of everything else)."""
  return zlib.crc32(f"rl/{seed}/{step}/{round_index}".encode()) % 2**31


def keep_group(rewards: np.ndarray, cfg: RolloutConfig) -> str | None:
  """None to keep a group, else the reason it is dropped."""
  if cfg.dynamic_sampling and np.all(rewards == rewards[0]):
    return "all_equal"
  if cfg.band is not None:
    rate = float(np.mean(rewards >= cfg.pass_threshold))
    if not cfg.band[0] < rate <= cfg.band[1]:
      return "outside_band"
  return None


def score_completions(pool: RewardPool, tokenizer, prompts: list[Prompt], completions: list[Completion],
                      group_size: int) -> list[tuple[float, str]]:
  """(reward, reason) of each completion; generation errors give (0, "generation_error: ...")."""
  items, where = [], []
  out: list[tuple[float, str]] = [(0.0, "")] * len(completions)
  for i, c in enumerate(completions):
    if c.finish_reason == "error":
      out[i] = (0.0, f"generation_error: {c.error}")
      continue
    ref = prompts[i // group_size].reward
    items.append(Item(ref.verifier, tokenizer.decode(c.token_ids, skip_special_tokens=True), ref.reference,
                      ref.options))
    where.append(i)
  for i, s in zip(where, pool.score(items)):
    out[i] = (float(s.value), s.reason.split(":")[0])
  return out


def collect(engine, pipeline: PromptPipeline, pool: RewardPool, tokenizer, cfg: RolloutConfig, *,
            prompts_per_step: int, seed: int, step: int) -> tuple[list[Group], RolloutStats]:
  """Fills one step's batch of groups (module docstring); advantages are not set yet."""
  stats, groups = RolloutStats(), []
  while len(groups) < prompts_per_step and stats.rounds <= cfg.max_extra_rounds:
    prompts = pipeline.take(prompts_per_step - len(groups))
    if not prompts:
      stats.data_exhausted = True
      break
    started = time.perf_counter()
    completions = generate(engine, [list(p.ids) for p in prompts], n=cfg.group_size,
                           max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                           top_k=cfg.top_k, seed=round_seed(seed, step, stats.rounds))
    stats.generate_s += time.perf_counter() - started
    started = time.perf_counter()
    scores = score_completions(pool, tokenizer, prompts, completions, cfg.group_size)
    stats.score_s += time.perf_counter() - started
    stats.rounds += 1
    stats.prompts += len(prompts)
    for g, prompt in enumerate(prompts):
      part = slice(g * cfg.group_size, (g + 1) * cfg.group_size)
      group = Group(prompt, [_sample(c, r, why, cfg, stats) for c, (r, why) in zip(completions[part], scores[part])])
      if any(c.finish_reason == "error" for c in completions[part]):
        stats.dropped["generation_error"] += 1
        continue
      reason = keep_group(group.rewards, cfg)
      if reason is not None:
        stats.dropped[reason] += 1
        continue
      groups.append(group)
  stats.groups_kept = len(groups)
  stats.batch_incomplete = len(groups) < prompts_per_step
  return groups, stats


def set_advantages(groups: list[Group], cfg: RolloutConfig) -> None:
  """Sets each sample's advantage from its group's rewards (`cfg.advantage`)."""
  if not groups:
    return
  adv = np.asarray(group_advantages(np.stack([g.rewards for g in groups]), mode=cfg.advantage,
                                    std_ddof=cfg.std_ddof, eps=cfg.std_eps))
  for g, row in zip(groups, adv):
    for s, a in zip(g.samples, row):
      s.advantage = float(a)


def _sample(c: Completion, reward: float, reason: str, cfg: RolloutConfig, stats: RolloutStats) -> Sample:
  truncated = c.finish_reason == "length"
  stats.responses += 1
  stats.response_tokens += len(c.token_ids)
  stats.reasons[reason or "unknown"] += 1
  stats.passed += int(reward >= cfg.pass_threshold)
  stats.truncated += int(truncated)
  if truncated and cfg.truncation == "penalty":
    reward = cfg.truncation_penalty
  stats.reward_sum += reward
  experts = c.expert_ids
  if experts is not None:  # kept until training: one byte per expert id where they fit
    experts = experts.astype(np.uint8 if experts.max(initial=0) < 256 else np.int16)
  return Sample(list(c.prompt_ids), list(c.token_ids), np.asarray(c.logprobs, np.float32), c.finish_reason,
                reward, reason, expert_ids=experts,
                train=not (truncated and cfg.truncation == "mask") and c.finish_reason != "error")
