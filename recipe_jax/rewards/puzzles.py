"""Logic puzzles: reasoning-gym's procedural generators, scored by its checkers in the sandbox.

`generate(dataset, seed=, size=)` turns a reasoning-gym dataset (0.1.25) into records
`{"id", "dataset", "question", "reference"}`. The reference is plain JSON:

  {"dataset": "n_queens", "module": "reasoning_gym.games.n_queens", "seed": 7, "size": 100,
   "index": 3, "config": {...extra dataset options...}, "answer": "<the generator's answer>"}

`score(response, reference, **options) -> Score` takes the response's answer (the last
`<answer>...</answer>`, reasoning-gym's convention; option `extract="raw"` takes the whole
response) and asks the dataset's own `score_answer` about it. The reward is binary: 1.0 only
when that checker returns exactly 1.0.

Some checkers `eval()` the answer (n_queens, spiral_matrix; sympy's parsers do the same), so
scoring never happens in this process: the entry is regenerated from (dataset, seed, size,
config, index) inside the sandbox (reasoning-gym's site-packages bound read-only), checked
against the stored answer (a different reasoning-gym would otherwise score silently against
another puzzle), and scored in a forked process per item, so an answer cannot change how
other items in the same batch are scored. `score_many` scores a batch in one sandbox, which
pays reasoning-gym's import once.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import secrets
import textwrap

from recipe_jax.rewards import sandbox
from recipe_jax.rewards.score import Score

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def generate(dataset: str, *, seed: int, size: int, config: dict | None = None) -> list[dict]:
  """`size` puzzle records from reasoning-gym's `dataset` (see the module docstring)."""
  import reasoning_gym  # imported here only: the import takes seconds

  config = dict(config or {})
  try:
    json.dumps(config)
  except TypeError as e:
    raise ValueError(f"puzzle config for {dataset!r} must be JSON-serializable: {e}") from e
  if dataset not in reasoning_gym.factory.DATASETS:
    raise ValueError(f"unknown reasoning-gym dataset {dataset!r}")
  data = reasoning_gym.create_dataset(dataset, seed=seed, size=size, **config)
  module = type(data).__module__
  records = []
  for index in range(size):
    entry = data[index]
    reference = {"dataset": dataset, "module": module, "seed": seed, "size": size,
                 "index": index, "config": config, "answer": entry["answer"]}
    json.dumps(reference)  # fails loudly here rather than in a data file
    records.append({"id": f"{dataset}/{seed}/{index}", "dataset": dataset,
                    "question": entry["question"], "reference": reference})
  return records


def extract_answer(response: str, extract: str = "answer_tag") -> str | None:
  """The last `<answer>` block (stripped), or the stripped response for `extract="raw"`."""
  if extract == "raw":
    return response.strip()
  if extract != "answer_tag":
    raise ValueError(f"extract must be 'answer_tag' or 'raw', got {extract!r}")
  matches = _ANSWER_TAG.findall(response)
  return matches[-1].strip() if matches else None


def _reasoning_gym_site() -> str:
  spec = importlib.util.find_spec("reasoning_gym")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("reasoning-gym is not installed (the `rewards` extra)")
  return os.path.dirname(list(spec.submodule_search_locations)[0])


def _puzzle_runner() -> None:
  """Runs inside the sandbox (shipped by source): regenerate, then score each item in a fork.

  Reads a JSON spec on stdin; its last stdout line is the sentinel and a JSON list of
  per-item results.
  """
  import importlib
  import json
  import os
  import select
  import signal
  import sys
  import time
  import types

  spec = json.loads(sys.stdin.read())
  os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MPLBACKEND="Agg")
  sys.path[:0] = [p for p in os.environ.get("SANDBOX_PYTHONPATH", "").split(":") if p]
  out_fd = os.dup(1)

  def import_dataset_module(module: str):
    """Imports only `module` (stub parent packages skip their other datasets); falls back
    to importing all of reasoning_gym when that fails."""
    if "reasoning_gym.factory" in sys.modules and module in sys.modules:
      return sys.modules["reasoning_gym.factory"]
    try:
      if "reasoning_gym" not in sys.modules:
        root = next(os.path.join(p, "reasoning_gym") for p in sys.path
                    if os.path.isdir(os.path.join(p, "reasoning_gym")))
        parts = module.split(".")
        for depth in range(1, len(parts)):
          stub = types.ModuleType(".".join(parts[:depth]))
          stub.__path__ = [os.path.join(root, *parts[1:depth])]
          sys.modules.setdefault(stub.__name__, stub)
      importlib.import_module(module)
    except Exception:
      for name in [n for n in sys.modules if n.split(".")[0] == "reasoning_gym"]:
        del sys.modules[name]
      importlib.import_module("reasoning_gym")
    return sys.modules["reasoning_gym.factory"]

  def score_in_fork(data, entry, answer, timeout_s: float) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
      os.close(read_fd)
      try:
        value = data.score_answer(answer, entry)
        message = {"score": float(value)}
      except BaseException as e:
        message = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
      os.write(write_fd, json.dumps(message).encode())
      os._exit(0)  # skips the parent's atexit handlers and buffers
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if select.select([read_fd], [], [], deadline - time.monotonic())[0]:
        chunk = os.read(read_fd, 65536)
        if not chunk:
          break
        chunks.append(chunk)
    else:
      os.kill(pid, signal.SIGKILL)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
      return {"error": "timeout" if os.WTERMSIG(status) in (signal.SIGKILL, signal.SIGXCPU)
              else f"signal {os.WTERMSIG(status)}"}
    if os.WEXITSTATUS(status) != 0:
      return {"error": f"exit code {os.WEXITSTATUS(status)}"}
    if not chunks:
      return {"error": "exited_early"}
    try:
      return json.loads(b"".join(chunks))
    except ValueError:
      return {"error": "unreadable result"}

  datasets, results = {}, []
  for item in spec["items"]:
    ref = item["reference"]
    key = json.dumps([ref["dataset"], ref["seed"], ref["size"], ref["config"]], sort_keys=True)
    try:
      if key not in datasets:
        factory = import_dataset_module(ref["module"])
        datasets[key] = factory.create_dataset(ref["dataset"], seed=ref["seed"],
                                               size=ref["size"], **ref["config"])
      entry = datasets[key][ref["index"]]
    except Exception as e:
      results.append({"reference_error": f"{type(e).__name__}: {str(e)[:200]}"})
      continue
    if json.dumps(entry["answer"]) != json.dumps(ref["answer"]):
      results.append({"reference_error": "regenerated answer differs from the stored one"})
      continue
    results.append(score_in_fork(datasets[key], entry, item["answer"], spec["timeout_s"]))
  os.write(out_fd, ("\n" + spec["sentinel"] + " " + json.dumps(results) + "\n").encode())
  os._exit(0)


_RUNNER_SOURCE = textwrap.dedent(inspect.getsource(_puzzle_runner)) + "\n\n_puzzle_runner()\n"
_REFERENCE_KEYS = ("dataset", "module", "seed", "size", "index", "config", "answer")


def _check_reference(reference) -> None:
  missing = [k for k in _REFERENCE_KEYS if not isinstance(reference, dict) or k not in reference]
  if missing:
    raise ValueError(f"puzzle reference lacks {missing}: {reference!r:.200}")


def score_many(responses: list[str], references: list[dict], *, extract: str = "answer_tag",
               timeout_s: float = 10.0, memory_mb: int = 2048, sandbox_mode: str = "bwrap",
               fallback: bool = False, bwrap: str | None = None) -> list[Score]:
  """Scores puzzle items in one sandbox (see `score` for the options), in order."""
  if len(responses) != len(references):
    raise ValueError(f"{len(responses)} responses but {len(references)} references")
  for reference in references:
    _check_reference(reference)
  scores: list[Score | None] = [None] * len(responses)
  items, where = [], []
  for i, (response, reference) in enumerate(zip(responses, references)):
    answer = extract_answer(response, extract)
    if answer is None:
      scores[i] = Score.wrong("no_answer", dataset=reference["dataset"])
    else:
      items.append({"reference": reference, "answer": answer})
      where.append(i)
  if not items:
    return scores  # type: ignore[return-value]
  mode = sandbox_mode
  if mode == "bwrap" and (why := sandbox.unavailable_reason("bwrap", bwrap)):
    if not fallback:
      for i in where:
        scores[i] = Score.wrong("sandbox_unavailable", error=why)
      return scores  # type: ignore[return-value]
    mode = "rlimits"
  suffix = ": rlimits fallback" if mode != sandbox_mode else ""
  sentinel = secrets.token_hex(16)
  spec = {"items": items, "timeout_s": timeout_s, "sentinel": sentinel}
  # Importing reasoning-gym may take seconds (all of it when the light import fails).
  limits = sandbox.Limits(cpu_s=30.0 + timeout_s * len(items),
                          wall_s=30.0 + (timeout_s + 1.0) * len(items), memory_mb=memory_mb,
                          processes=4)
  result = sandbox.run_python({"runner.py": _RUNNER_SOURCE},
                              [sandbox.Run("runner.py", stdin=json.dumps(spec))], limits=limits,
                              mode=mode, python_paths=(_reasoning_gym_site(),), bwrap=bwrap)
  outcomes = _parse_runner_output(result, sentinel, len(items))
  for i, item, outcome in zip(where, items, outcomes):
    details = {"dataset": item["reference"]["dataset"], "isolation": mode}
    if isinstance(outcome, str):
      scores[i] = Score.wrong(outcome + suffix, **details)
    elif "reference_error" in outcome:
      raise ValueError(f"puzzle reference {item['reference']['dataset']}/"
                       f"{item['reference']['index']}: {outcome['reference_error']}")
    elif "error" in outcome:
      reason = "timeout" if outcome["error"] == "timeout" else f"checker_error: {outcome['error']}"
      scores[i] = Score.wrong(reason + suffix, **details)
    else:
      value = outcome["score"]
      details["checker_score"] = value
      scores[i] = (Score.correct("correct" + suffix, **details) if value == 1.0
                   else Score.wrong("wrong_answer" + suffix, **details))
  return scores  # type: ignore[return-value]


def _parse_runner_output(result: sandbox.SandboxResult, sentinel: str, n: int) -> list:
  """Per-item outcome dicts, or one failure reason (str) repeated for every item."""
  if result.status != "ok":
    return [result.status if result.status in ("timeout", "output_limit")
            else f"{result.status}: {result.error[:200]}"] * n
  run = result.runs[0]
  last = run.stdout.rstrip("\n").rsplit("\n", 1)[-1]
  if run.ok and last.startswith(sentinel + " "):
    outcomes = json.loads(last[len(sentinel) + 1:])
    if len(outcomes) == n:
      return outcomes
  if run.timed_out or run.output_limit:
    return ["timeout" if run.timed_out else "output_limit"] * n
  tail = run.stderr.strip().splitlines()[-1:] or [f"exit {run.exit_code}, signal {run.signal}"]
  return [f"sandbox_error: runner failed: {tail[0][:200]}"] * n


def score(response: str, reference: dict, *, extract: str = "answer_tag", timeout_s: float = 10.0,
          memory_mb: int = 2048, sandbox_mode: str = "bwrap", fallback: bool = False,
          bwrap: str | None = None) -> Score:
  """Reward 1.0 when reasoning-gym's checker gives the response's answer exactly 1.0.

  Options:
    extract: "answer_tag" (last <answer>...</answer>) or "raw" (the whole response).
    timeout_s: CPU and wall seconds for the checker on one answer.
    memory_mb: address-space limit in the sandbox (reasoning-gym imports numpy and sympy).
    sandbox_mode, fallback, bwrap: as in `recipe_jax.rewards.code.score`.
  """
  return score_many([response], [reference], extract=extract, timeout_s=timeout_s,
                    memory_mb=memory_mb, sandbox_mode=sandbox_mode, fallback=fallback,
                    bwrap=bwrap)[0]
