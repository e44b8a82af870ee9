"""Programs and puzzle answers that attack the grader: each must be contained and score 0.

Most attacks print the expected output only if they succeed, so a reward of 1 would mean an
escape. Where it is cheap, a control runs the same attack in the unisolated "rlimits" mode
and shows that it does succeed there, so these tests can fail.
"""

import os
import socket
import subprocess
import time

import pytest

from recipe_jax.rewards import code, puzzles

FAST = {"timeout_s": 2.0}
DEADLINE_S = 20.0  # generous: the machine may be busy; the limits above are what bind
ESCAPED = {"tests": [{"input": "", "output": "ESCAPED"}]}


def fenced(program: str) -> str:
  return f"```python\n{program}\n```"


def _attack(program: str, reference=ESCAPED, **options):
  start = time.monotonic()
  result = code.score(fenced(program), reference, **{**FAST, **options})
  elapsed = time.monotonic() - start
  assert elapsed < DEADLINE_S, (elapsed, result)
  return result


def _sandbox_processes() -> list[int]:
  """Host processes still running under a sandbox uid (see sandbox._child_uid)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/status") as f:
        uid = int(next(l for l in f if l.startswith("Uid:")).split()[1])
    except (OSError, StopIteration):
      continue
    if 200_000 <= uid < 260_000:
      found.append(int(pid))
  return found


# --- Escapes -----------------------------------------------------------------------------------


def test_network_to_the_host_and_outside_is_unreachable():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  port = server.getsockname()[1]
  program = ("import socket\nfor host, port in (('127.0.0.1', %d), ('1.1.1.1', 53)):\n"
             "  try:\n    socket.create_connection((host, port), timeout=1)\n"
             "    print('ESCAPED')\n    break\n  except OSError:\n    pass" % port)
  try:
    assert _attack(program).value == 0.0
    assert _attack(program, sandbox_mode="rlimits").value == 1.0  # control: no namespace
  finally:
    server.close()


@pytest.mark.parametrize("path", ["/etc/shadow", "/etc/hostname", os.path.abspath(__file__)])
def test_host_files_are_not_readable(path):
  program = f"open({path!r}).read()\nprint('ESCAPED')"
  assert _attack(program).value == 0.0


def test_host_file_read_control_shows_the_attack_works_unisolated():
  program = f"open({os.path.abspath(__file__)!r}).read()\nprint('ESCAPED')"
  assert _attack(program, sandbox_mode="rlimits").value == 1.0


def test_host_environment_is_not_visible():
  # In the grader's environment, and in the initial environment of a running host process.
  os.environ["RECIPE_ADVERSARIAL_SECRET"] = "hunter2-7f3a"
  holder = subprocess.Popen(["sleep", "60"], env={"RECIPE_ADVERSARIAL_SECRET": "hunter2-7f3a"})
  try:
    program = ("import os, glob\nvalues = list(os.environ.values())\n"
               "for p in glob.glob('/proc/*/environ'):\n  try:\n"
               "    values += open(p, 'rb').read().decode(errors='replace').split('\\0')\n"
               "  except OSError:\n    pass\n"
               "print(next((v.split('=')[-1] for v in values if 'hunter2' in v), 'none'))")
    reference = {"tests": [{"input": "", "output": "hunter2-7f3a"}]}
    assert _attack(program, reference).value == 0.0
    assert _attack(program, reference, sandbox_mode="rlimits").value == 1.0  # control
  finally:
    del os.environ["RECIPE_ADVERSARIAL_SECRET"]
    holder.kill()
    holder.wait()


def test_writes_do_not_reach_the_host(tmp_path):
  tmp_path.chmod(0o777)
  target = tmp_path / "escaped.txt"
  program = (f"import os\nfor p in ({str(target)!r}, '/tmp/recipe_escape_marker', "
             "'/usr/lib/recipe_escape_marker'):\n"
             "  try:\n    open(p, 'w').write('x')\n  except OSError:\n    continue\n"
             "  if os.path.exists({!r}):\n    print('ESCAPED')".format(str(target)))
  assert _attack(program).value == 0.0
  assert not target.exists() and not os.path.exists("/tmp/recipe_escape_marker")
  assert not os.path.exists("/usr/lib/recipe_escape_marker")


def test_fork_bomb_is_contained_and_cleaned_up():
  program = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass"
  result = _attack(program)
  assert result.value == 0.0 and result.reason == "timeout", result
  assert _sandbox_processes() == []


def test_memory_bomb_is_contained():
  program = "blocks = []\nwhile True:\n  blocks.append(bytearray(256 << 20))\nprint('ESCAPED')"
  result = _attack(program, memory_mb=512)
  assert result.value == 0.0 and "MemoryError" in result.reason


def test_infinite_loop_times_out():
  result = _attack("while True:\n  pass")
  assert (result.value, result.reason) == (0.0, "timeout")
  sleeper = _attack("import time\ntime.sleep(3600)")
  assert (sleeper.value, sleeper.reason) == (0.0, "timeout")


def test_huge_output_is_cut():
  result = _attack("import sys\nwhile True:\n  sys.stdout.write('ESCAPED' * 10000)")
  assert (result.value, result.reason) == (0.0, "output_limit")


def test_killing_the_parent_fails():
  # kill(-1) reaches only the program's own uid; the launcher and bwrap's init refuse.
  program = ("import os, signal\nos.kill(-1, signal.SIGKILL)\nfor pid in (os.getppid(), 1):\n"
             "  try:\n    os.kill(pid, signal.SIGKILL)\n    print('ESCAPED')\n"
             "  except OSError:\n    pass")
  result = _attack(program)
  assert (result.value, result.reason) == (0.0, "wrong_answer")  # the launcher reported


# --- Reward hacks ------------------------------------------------------------------------------

ADD = {"kind": "functional", "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
ALWAYS_EQUAL = ("class AlwaysEqual:\n  def __eq__(self, other):\n    return True\n"
                "  def __ne__(self, other):\n    return False\n  def __bool__(self):\n"
                "    return True\n  def __str__(self):\n    return 'ESCAPED'\n")


@pytest.mark.parametrize("program, reason", [
    ("import os\nos._exit(0)", "exited_early"),
    ("def add(a, b):\n  import os\n  os._exit(0)", "exited_early"),
    ("import sys\nsys.exit(0)", "runtime_error: SystemExit"),
    ("def add(a, b):\n  raise SystemExit(0)", "runtime_error: SystemExit"),
    (ALWAYS_EQUAL + "def add(a, b):\n  return AlwaysEqual()", "non_plain_value"),
    ("class Int(int):\n  def __eq__(self, other):\n    return True\n"
     "def add(a, b):\n  return Int(0)", "non_plain_value"),
    ("import builtins\nbuiltins.AssertionError = StopIteration\n"
     "def add(a, b):\n  return 0", "test_failed"),
])
def test_functional_reward_hacks(program, reason):
  result = _attack(program, ADD)
  assert result.value == 0.0 and result.reason.startswith(reason), result


def test_truthiness_and_builtin_patching_hacks():
  truthy = {"tests": ["assert is_even(3)"], "entry_point": "is_even"}
  hack = ALWAYS_EQUAL + "def is_even(x):\n  return AlwaysEqual()"
  assert _attack(hack, truthy).reason.startswith("non_plain_value")
  in_all = {"tests": ["assert all(candidate(i) for i in (1, 3))"], "entry_point": "is_even"}
  assert _attack(hack, in_all).reason.startswith("non_plain_value")
  patched = {"tests": ["assert abs(add(1, 1) - 3) < 1e-9"]}
  program = "import builtins\nbuiltins.abs = lambda x: 0\ndef add(a, b):\n  return a + b"
  assert _attack(program, patched).reason.startswith("test_failed")
  assert _attack(hack, in_all, strict_values=False).value == 1.0  # control: the guard matters


def test_stdio_compares_text_in_the_grader():
  program = ALWAYS_EQUAL + "print(AlwaysEqual())\nimport os\nos._exit(0)"
  reference = {"tests": [{"input": "", "output": "the real answer"}]}
  assert _attack(program, reference).reason == "wrong_answer"


# --- eval() injection through puzzle answers ---------------------------------------------------


@pytest.fixture(scope="module")
def spiral():
  return puzzles.generate("spiral_matrix", seed=3, size=1)[0]["reference"]


def test_eval_injection_cannot_read_host_files(spiral, tmp_path):
  # spiral_matrix eval()s answers and gives 0.1 to a Python list of the right numbers. This
  # answer evaluates to that list only when it can read the host file that holds it.
  tmp_path.chmod(0o755)
  leak = tmp_path / "solution.txt"
  leak.write_text(str([int(x) for x in spiral["answer"].split()]))
  leak.chmod(0o644)
  answer = f"<answer>eval(open({str(leak)!r}).read())</answer>"
  contained = puzzles.score(answer, spiral, timeout_s=5)
  assert (contained.value, contained.details["checker_score"]) == (0.0, 0.0)
  control = puzzles.score(answer, spiral, timeout_s=5, sandbox_mode="rlimits")
  assert control.details["checker_score"] == 0.1  # the read works without the sandbox


@pytest.mark.parametrize("payload", [
    "__import__('os')._exit(0)",
    "__import__('sys').exit(0)",
    "print('1.0') or __import__('os')._exit(0)",
    "open('/tmp/recipe_eval_marker', 'w').write('x')",
    "[x for x in iter(int, 1)]",
    "__import__('os').kill(__import__('os').getppid(), 9)",
])
def test_eval_injection_is_contained(spiral, payload):
  start = time.monotonic()
  result = puzzles.score(f"<answer>{payload}</answer>", spiral, timeout_s=2)
  assert time.monotonic() - start < DEADLINE_S
  assert result.value == 0.0, result
  assert not os.path.exists("/tmp/recipe_eval_marker")
