"""The sandbox: runs, limits and what a program inside can and cannot see."""

import errno
import os

import pytest

from recipe_jax.rewards import sandbox
from recipe_jax.rewards.sandbox import Limits, Run

FAST = Limits(cpu_s=2, wall_s=3)


def _run(source: str, stdin: str = "", **kwargs) -> sandbox.RunResult:
  result = sandbox.run_python({"main.py": source}, [Run("main.py", stdin=stdin)],
                              limits=kwargs.pop("limits", FAST), **kwargs)
  assert result.status == "ok", result.error
  assert result.isolation == kwargs.get("mode", "bwrap")
  return result.runs[0]


def test_bwrap_is_available_here():
  assert sandbox.unavailable_reason() == ""


def test_stdin_stdout_and_exit_code():
  run = _run("import sys\nprint(input()[::-1])\nsys.exit(3)", stdin="abc\n")
  assert (run.stdout, run.exit_code, run.signal, run.timed_out) == ("cba\n", 3, None, False)


def test_runs_in_order_and_stop_on_error():
  files = {"main.py": "import sys\nx = int(input())\nprint(x * 2)\nsys.exit(x == 0)"}
  runs = [Run("main.py", stdin=s) for s in ("1", "0", "5")]
  stopped = sandbox.run_python(files, runs, limits=FAST)
  assert [r.stdout for r in stopped.runs] == ["2\n", "0\n"]
  full = sandbox.run_python(files, runs, limits=FAST, stop_on_error=False)
  assert [r.stdout for r in full.runs] == ["2\n", "0\n", "10\n"]


def test_unprivileged_with_cleared_environment_and_private_filesystem():
  os.environ["RECIPE_SANDBOX_TEST_SECRET"] = "s3cret"
  try:
    run = _run("import os\nprint(os.getuid(), os.getgid(), sorted(os.environ))\n"
               "print(sorted(os.listdir('/')))\n"
               "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])")
  finally:
    del os.environ["RECIPE_SANDBOX_TEST_SECRET"]
  ids, root, caps = run.stdout.splitlines()
  uid, gid, env = ids.split(" ", 2)
  assert int(uid) != 0 and int(gid) != 0
  assert "s3cret" not in run.stdout and "RECIPE" not in env
  assert "work" not in root and "etc" not in root and "home" not in root
  assert int(caps, 16) == 0


def test_cpu_limit_and_wall_limit():
  spin = _run("while True: pass", limits=Limits(cpu_s=1, wall_s=5))
  assert spin.signal in (9, 24) and not spin.ok  # SIGXCPU at the soft limit
  sleep = _run("import time\ntime.sleep(60)", limits=Limits(cpu_s=1, wall_s=1))
  assert sleep.timed_out and sleep.wall_s < 5


def test_output_is_capped():
  run = _run("import sys\nwhile True: sys.stdout.write('x' * 4096)",
             limits=Limits(cpu_s=2, wall_s=3, output_bytes=10000))
  assert run.output_limit and len(run.stdout) == 10000


def test_memory_limit():
  run = _run("x = bytearray(3 << 30)\nprint('allocated')", limits=Limits(memory_mb=512))
  assert "MemoryError" in run.stderr and "allocated" not in run.stdout


def test_python_paths_are_importable_read_only(tmp_path):
  (tmp_path / "helper_mod.py").write_text("VALUE = 41\n")
  tmp_path.chmod(0o755)  # the sandbox's uid must be able to read it
  (tmp_path / "helper_mod.py").chmod(0o666)  # so only the read-only bind stops writes
  source = ("import os, sys\nsys.path[:0] = os.environ['SANDBOX_PYTHONPATH'].split(':')\n"
            "import helper_mod\nprint(helper_mod.VALUE + 1)\n"
            "try:\n  open(helper_mod.__file__, 'a')\nexcept OSError as e:\n  print(e.errno)")
  run = _run(source, python_paths=(str(tmp_path),))
  assert run.stdout.split() == ["42", str(errno.EROFS)]


def test_rlimits_fallback_runs_and_says_so():
  run = _run("print(sum(range(10)))", mode="rlimits")
  assert run.stdout == "45\n"


def test_missing_bwrap_is_unavailable_not_an_exception():
  result = sandbox.run_python({"main.py": "print(1)"}, [Run("main.py")], bwrap="/nonexistent/bwrap")
  assert result.status == "sandbox_unavailable" and result.runs == []
  assert sandbox.unavailable_reason(bwrap="/nonexistent/bwrap").startswith("sandbox_unavailable")


@pytest.mark.parametrize("name", ["", "a/b", ".hidden"])
def test_bad_job_file_names(name):
  with pytest.raises(ValueError, match="plain names"):
    sandbox.run_python({name: ""}, [])


def test_bad_mode():
  with pytest.raises(ValueError, match="sandbox mode"):
    sandbox.run_python({}, [], mode="docker")
