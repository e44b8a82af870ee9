"""Reward pool: score batches of items in worker processes, with a deadline per item.

An item names its verifier by module path ("recipe_jax.rewards.code", "recipe_jax.rewards.math",
any module with `score(response, reference, **options) -> Score`). Each worker takes one item
at a time. A worker that passes an item's deadline is killed and the item scores 0 with reason
"timeout"; a worker that dies (abort, segfault, `os._exit`) scores its item 0 with reason
"crash"; a verifier that raises scores 0 with reason "verifier_error". Dead or killed workers
are replaced, so a batch always completes, and results keep the input order.

Workers are fresh interpreters (`python -m recipe_jax.rewards.pool`, so nothing is forked from
a process that runs JAX threads, and the caller's `__main__` is never re-imported); they see
the caller's `sys.path` and stay alive across batches of one `RewardPool`:

  with RewardPool(num_workers=4, deadline_s=60) as pool:
    scores = pool.score([Item("recipe_jax.rewards.code", response, reference)])
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import multiprocessing.connection
import os
import subprocess
import sys
import time
from typing import Any

from recipe_jax.rewards.score import Score


@dataclasses.dataclass(frozen=True)
class Item:
  """One thing to score: `verifier` is a module path; options go to its `score` as keywords."""

  verifier: str
  response: str
  reference: Any
  options: dict = dataclasses.field(default_factory=dict)


def _worker_main() -> None:
  """A worker (`python -m recipe_jax.rewards.pool`): score items from stdin until it closes.

  The protocol uses private copies of fds 0 and 1; fd 1 is then pointed at stderr, so a
  verifier that prints cannot corrupt it.
  """
  requests = multiprocessing.connection.Connection(os.dup(0), writable=False)
  answers = multiprocessing.connection.Connection(os.dup(1), readable=False)
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.dup2(2, 1)
  modules = {}
  while True:
    try:
      index, item = requests.recv()
    except (EOFError, OSError):
      return
    try:
      if item.verifier not in modules:
        modules[item.verifier] = importlib.import_module(item.verifier)
      result = modules[item.verifier].score(item.response, item.reference, **item.options)
      if not isinstance(result, Score):
        raise TypeError(f"{item.verifier}.score returned {type(result).__name__}, not Score")
    except Exception as e:  # a verifier bug scores 0 and is reported, the batch goes on
      result = Score.wrong(f"verifier_error: {type(e).__name__}: {str(e)[:300]}")
    answers.send((index, result))


class _Worker:
  """A worker process, the two ends of its pipes, and the item it holds (index, started at)."""

  def __init__(self):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    self.process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, env=env)
    self.requests = multiprocessing.connection.Connection(os.dup(self.process.stdin.fileno()),
                                                          readable=False)
    self.answers = multiprocessing.connection.Connection(os.dup(self.process.stdout.fileno()),
                                                         writable=False)
    self.process.stdin.close()
    self.process.stdout.close()
    self.item: tuple[int, float] | None = None

  def stop(self, kill: bool) -> None:
    if kill:
      self.process.kill()
    self.requests.close()
    self.answers.close()
    try:
      self.process.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()


class RewardPool:
  """`num_workers` scoring processes; `score(items)` returns one Score per item, in order.

  deadline_s: wall-clock seconds an item may take in a worker (measured from when the worker
    receives it), after which the worker is killed and the item scores "timeout".
  """

  def __init__(self, num_workers: int = 2, deadline_s: float = 60.0):
    if num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if deadline_s <= 0:
      raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
    self.deadline_s = deadline_s
    self._workers = [_Worker() for _ in range(num_workers)]
    self.replaced = 0  # workers replaced after a timeout or crash, over the pool's life

  def score(self, items: list[Item]) -> list[Score]:
    for i, item in enumerate(items):
      if not isinstance(item, Item):
        raise TypeError(f"item {i} is a {type(item).__name__}, not pool.Item")
    results: list[Score | None] = [None] * len(items)
    pending = collections.deque(range(len(items)))
    while pending or any(w.item for w in self._workers):
      for slot, worker in enumerate(self._workers):
        if worker.item is None and pending:
          index = pending.popleft()
          try:
            worker.requests.send((index, items[index]))
          except (BrokenPipeError, OSError):  # died while idle: replace, retry the item
            pending.appendleft(index)
            self._replace(slot, kill=True)
            continue
          worker.item = (index, time.monotonic())
      self._collect(results)
    return results  # type: ignore[return-value]

  def _collect(self, results: list) -> None:
    """Waits for an answer, a death or the next deadline, and handles whichever came."""
    busy = [w for w in self._workers if w.item]
    next_deadline = min(w.item[1] + self.deadline_s for w in busy)
    timeout = max(0.0, next_deadline - time.monotonic())
    ready = set(multiprocessing.connection.wait([w.answers for w in busy], timeout=timeout))
    for slot, worker in enumerate(self._workers):
      if not worker.item:
        continue
      index, started = worker.item
      if worker.answers in ready:
        try:
          got_index, result = worker.answers.recv()
          if got_index != index:
            raise RuntimeError(f"worker answered item {got_index}, expected {index}")
          results[index] = result
          worker.item = None
          continue
        except (EOFError, OSError):  # the pipe closed: the worker died
          worker.process.kill()
          code = worker.process.wait()
          why = f"signal {-code}" if code < 0 else f"exit code {code}"
          results[index] = Score.wrong(f"crash: worker died ({why})", exitcode=code)
          self._replace(slot, kill=True)
      elif time.monotonic() >= started + self.deadline_s:
        results[index] = Score.wrong("timeout", deadline_s=self.deadline_s)
        self._replace(slot, kill=True)

  def _replace(self, slot: int, kill: bool) -> None:
    self._workers[slot].stop(kill=kill)
    self._workers[slot] = _Worker()
    self.replaced += 1

  def close(self) -> None:
    for worker in self._workers:
      worker.stop(kill=False)
    self._workers = []

  def __enter__(self) -> "RewardPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def score_batch(items: list[Item], *, num_workers: int = 2,
                deadline_s: float = 60.0) -> list[Score]:
  """Scores `items` with a pool that lives for this call only."""
  with RewardPool(num_workers=min(num_workers, max(1, len(items))), deadline_s=deadline_s) as pool:
    return pool.score(items)


if __name__ == "__main__":
  _worker_main()
