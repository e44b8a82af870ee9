"""The code verifier: program extraction, test selection, functional and stdio grading."""

import hashlib
import time

import pytest

from recipe_jax.rewards import code

ADD_TESTS = {"kind": "functional", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}
SUM_STDIO = {"kind": "stdio", "tests": [{"input": "3 4\n", "output": "7\n"},
                                        {"input": "10 -2\n", "output": "8"}]}


def fenced(program: str, tag: str = "python") -> str:
  return f"Here it is:\n```{tag}\n{program}\n```\nDone."


def test_extract_program_takes_the_last_python_block():
  response = "```python\nfirst\n```\ntext\n```bash\nls\n```\n```py\nsecond\n```\n```\nuntagged\n```"
  assert code.extract_program(response) == "second\n"
  assert code.extract_program("```\nonly untagged\n```") == "only untagged\n"
  assert code.extract_program("```Python3\nx = 1\n```") == "x = 1\n"
  assert code.extract_program("no code at all") is None
  assert code.extract_program("```python\nnever closed") is None


def test_select_tests_is_sha256_based_and_keeps_order():
  tests = [f"assert f({i}) == {i}" for i in range(120)]
  chosen = code.select_tests(tests, 50)
  by_digest = sorted(tests, key=lambda t: hashlib.sha256(t.encode()).hexdigest())[:50]
  assert chosen == [t for t in tests if t in set(by_digest)]
  assert code.select_tests(list(reversed(tests)), 50) == list(reversed(chosen))
  assert code.select_tests(tests[:7], 50) == tests[:7]
  stdio = [{"input": str(i), "output": str(i)} for i in range(60)]
  assert len(code.select_tests(stdio, 50)) == 50


def test_functional_correct_and_wrong():
  right = code.score(fenced("def add(a, b):\n  return a + b"), ADD_TESTS)
  assert (right.value, right.reason, right.details["isolation"]) == (1.0, "correct", "bwrap")
  wrong = code.score(fenced("def add(a, b):\n  return a * b"), ADD_TESTS)
  assert wrong.value == 0.0 and wrong.reason.startswith("test_failed")
  assert wrong.details["failed_test"] == 0


def test_functional_setup_and_entry_point():
  reference = {"tests": ["assert candidate(2) == SQUARES[2]", "assert candidate(3) == 9"],
               "setup": "SQUARES = {2: 4}", "entry_point": "square"}
  assert code.score(fenced("def square(x):\n  return x * x"), reference).value == 1.0
  missing = code.score(fenced("def cube(x):\n  return x ** 3"), reference)
  assert missing.reason == "missing_entry_point: square"


@pytest.mark.parametrize("program, reason", [
    ("def add(a, b) return a", "syntax_error"),
    ("raise ValueError('top level')", "runtime_error: ValueError: top level"),
    ("def add(a, b):\n  return a + c", "runtime_error: NameError"),
])
def test_functional_failures_say_why(program, reason):
  result = code.score(fenced(program), ADD_TESTS)
  assert result.value == 0.0 and result.reason.startswith(reason), result


def test_no_code_block():
  assert code.score("I think it is 3.", ADD_TESTS).reason == "no_code_block"


def test_stdio_correct_wrong_and_compare_modes():
  program = "a, b = map(int, input().split())\nprint(a + b)"
  assert code.score(fenced(program), SUM_STDIO).value == 1.0
  wrong = code.score(fenced("print(7)"), SUM_STDIO)
  assert (wrong.reason, wrong.details["failed_test"]) == ("wrong_answer", 1)
  spaced = {"tests": [{"input": "", "output": "1 2\n3"}]}
  assert code.score(fenced("print('1 2   ')\nprint('3')\nprint()"), spaced).value == 1.0
  assert code.score(fenced("print('1 2   ')\nprint('3')"), spaced, compare="exact").value == 0.0
  assert code.score(fenced("print('1\\n2 3')"), spaced, compare="tokens").value == 1.0
  assert code.score(fenced("print('1\\n2 3')"), spaced).value == 0.0


def test_stdio_exit_and_runtime_error():
  ref = {"tests": [{"input": "", "output": "hi"}]}
  assert code.score(fenced("print('hi')\nexit()"), ref).value == 1.0
  crashed = code.score(fenced("print('hi')\nraise SystemExit(2)"), ref)
  assert crashed.reason == "runtime_error"


def test_more_than_max_tests_runs_the_subsample():
  reference = {"tests": [f"assert f({i}) == {i} or {i} % 7 == 3" for i in range(80)]}
  result = code.score(fenced("def f(x):\n  return x"), reference, max_tests=20)
  assert result.value == 1.0 and result.details["tests"] == 20
  assert result.details["total_tests"] == 80


@pytest.mark.parametrize("reference, match", [
    ({"tests": "assert True"}, "list 'tests'"),
    ({"tests": []}, "missing tests"),
    ({"kind": "stdio", "tests": [{"input": "1"}]}, "malformed"),
    ({"kind": "sql", "tests": ["x"]}, "'kind'"),
    ({"tests": ["assert (("]}, "code reference"),
])
def test_bad_references_raise(reference, match):
  with pytest.raises(ValueError, match=match):
    code.score(fenced("x = 1"), reference)


def test_sandbox_unavailable_and_explicit_fallback():
  program = fenced("def add(a, b):\n  return a + b")
  missing = code.score(program, ADD_TESTS, bwrap="/nonexistent/bwrap")
  assert (missing.value, missing.reason) == (0.0, "sandbox_unavailable")
  fallback = code.score(program, ADD_TESTS, bwrap="/nonexistent/bwrap", fallback=True)
  assert (fallback.value, fallback.reason) == (1.0, "correct: rlimits fallback")
  assert fallback.details["isolation"] == "rlimits"
  forced = code.score(fenced("def add(a, b):\n  return 0"), ADD_TESTS, sandbox_mode="rlimits")
  assert forced.value == 0.0 and forced.details["isolation"] == "rlimits"


def test_humaneval_canonical_solutions_pass_and_stubs_fail():
  problems = code.load_humaneval()
  assert len(problems) == 164
  canonical = [fenced(p["prompt"] + p["canonical_solution"]) for p in problems]
  stubs = [fenced(p["prompt"] + "    pass\n") for p in problems]
  references = [code.humaneval_reference(p) for p in problems]
  start = time.monotonic()
  scores = code.score_many(canonical + stubs, references + references, num_workers=2)
  elapsed = time.monotonic() - start
  failed = [(p["task_id"], s.reason) for p, s in zip(problems, scores[:164]) if s.value != 1.0]
  passed_stubs = [p["task_id"] for p, s in zip(problems, scores[164:]) if s.value != 0.0]
  assert failed == [] and passed_stubs == []
  print(f"HumanEval: 328 sandboxed gradings in {elapsed:.1f} s ({328 / elapsed:.1f} items/s)")


def test_throughput_reports_items_per_second():
  report = code.throughput(4, num_workers=2)
  assert report["items"] == 4 and report["correct"] == 4 and report["items_per_s"] > 0
