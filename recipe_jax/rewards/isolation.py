"""Run one Python call in a child process with a hard wall-clock deadline and a memory cap.

Verifiers call libraries (sympy through math-verify) that can hang or eat all memory on
adversarial input, and math-verify's own timeout uses SIGALRM, which works only in the main
thread. `run_isolated` works from any thread: the call runs in a forked child with
`RLIMIT_AS` set, and the child is killed with SIGKILL when the deadline passes.

How: each process keeps a small free list of *zygotes*, long-lived single-threaded helper
processes started with `subprocess` (never forked from the caller, which may run JAX threads).
A zygote imports the requested modules once (`preload`, and the module of the function when it
unpickles the request), then forks one child per call; a fork of a warm interpreter costs about
a millisecond, so the per-call overhead is a few milliseconds, not an interpreter start. The
zygote enforces the deadline and reports back; a call in flight from another thread simply
takes another zygote. A child also gets `RLIMIT_CPU` and a parent-death signal as backstops, so
it cannot outlive its zygote.

The function must be picklable by reference (a module-level function) and so must its
arguments and its result.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import math
import os
import pickle
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Sequence

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_LIMIT_BYTES = 4 << 30  # the whole address space of the child, interpreter included
# Extra wall-clock time the caller grants a zygote beyond the call's deadline, for unpickling the
# request and importing modules it has not imported yet (first call) or for the reply.
STARTUP_GRACE_S = 60.0
REPLY_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What happened to one isolated call.

  status: "ok" (value holds the result), "timeout" (killed at the deadline), "crash" (the child
    died: a signal, the memory limit (MemoryError), or the zygote failing), or "error" (the
    function raised; detail holds "ExceptionType: message").
  seconds: wall-clock time of the call as measured by the zygote (or the caller on failure).
  """

  status: str
  value: Any = None
  detail: str = ""
  seconds: float = 0.0

  @property
  def ok(self) -> bool:
    return self.status == "ok"


class IsolatedCallFailed(RuntimeError):
  """Raised by `Outcome.unwrap`-style callers; carries the failed outcome."""

  def __init__(self, outcome: Outcome):
    super().__init__(f"isolated call {outcome.status}: {outcome.detail}")
    self.outcome = outcome


def call_isolated(fn: Callable, *args, timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
                  preload: Sequence[str] = (), warmup: Callable[[], Any] | None = None,
                  **kwargs) -> Any:
  """Like `run_isolated` but returns the value or raises `IsolatedCallFailed`."""
  outcome = run_isolated(fn, *args, timeout_s=timeout_s, memory_limit_bytes=memory_limit_bytes,
                         preload=preload, warmup=warmup, **kwargs)
  if not outcome.ok:
    raise IsolatedCallFailed(outcome)
  return outcome.value


def run_isolated(fn: Callable, *args, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
                 preload: Sequence[str] = (), warmup: Callable[[], Any] | None = None,
                 **kwargs) -> Outcome:
  """Runs `fn(*args, **kwargs)` in a child process with a hard deadline and memory limit.

  Args:
    fn: a module-level function (pickled by reference).
    *args, **kwargs: picklable arguments.
    timeout_s: wall-clock deadline of the call in seconds; the child is SIGKILLed after it.
    memory_limit_bytes: RLIMIT_AS of the child (its whole address space), or None for no limit.
    preload: module names the zygote imports once before forking (e.g. "math_verify"), so that
      calls do not pay for the import inside their deadline.
    warmup: a module-level function without arguments that the zygote runs once, before its
      first fork, to fill caches every call would otherwise rebuild (compiled parsers, regexes).
      Its failures are ignored: the calls then simply run cold.

  Returns:
    An `Outcome`; never raises for failures of the call itself.
  """
  if timeout_s <= 0:
    raise ValueError(f"timeout_s must be positive, got {timeout_s}")
  request = pickle.dumps((tuple(preload), warmup, fn, args, kwargs, float(timeout_s),
                          memory_limit_bytes))
  prepared_for = (tuple(preload), warmup)
  zygote = _checkout(prepared_for)
  try:
    return zygote.call(request, timeout_s, prepared_for)
  finally:
    _checkin(zygote)


# ----------------------------------------------------------------------------------------------
# Caller side: a free list of zygotes shared by all threads.
# ----------------------------------------------------------------------------------------------

class _Zygote:
  """Handle on one zygote process; used by one thread at a time."""

  def __init__(self):
    parent_sock, child_sock = socket.socketpair()
    child_fd = child_sock.fileno()
    code = "import sys; from recipe_jax.rewards.isolation import _serve; _serve(int(sys.argv[1]))"
    self.process = subprocess.Popen([sys.executable, "-c", code, str(child_fd)],
                                    pass_fds=[child_fd], start_new_session=True,
                                    stdin=subprocess.DEVNULL)
    child_sock.close()
    self.conn = Connection(parent_sock.detach())
    self.owner_pid = os.getpid()
    self.prepared: set = set()  # (preload, warmup) pairs this zygote has already loaded
    self.alive = True
    self.conn.send_bytes(pickle.dumps(list(sys.path)))

  def call(self, request: bytes, timeout_s: float, prepared_for: tuple) -> Outcome:
    start = time.monotonic()
    grace = REPLY_GRACE_S if prepared_for in self.prepared else STARTUP_GRACE_S
    try:
      self.conn.send_bytes(request)
      if self.conn.poll(timeout_s + grace):
        reply = pickle.loads(self.conn.recv_bytes())
        self.prepared.add(prepared_for)
        return reply
      detail = f"zygote gave no reply within {timeout_s + grace:.1f}s"
      status = "timeout"
    except (EOFError, OSError) as error:
      detail = f"zygote died: {type(error).__name__}: {error}"
      status = "crash"
    self.close()
    return Outcome(status, detail=detail, seconds=time.monotonic() - start)

  def close(self):
    self.alive = False
    try:
      self.conn.close()
    except OSError:
      pass
    if self.process.poll() is None:
      self.process.kill()
    self.process.wait()


_free: list[_Zygote] = []
_free_lock = threading.Lock()


def _checkout(prepared_for: tuple) -> _Zygote:
  """An idle zygote, preferably one that has already loaded what this call needs."""
  with _free_lock:
    _free[:] = [z for z in _free if z.alive and z.owner_pid == os.getpid()
                and z.process.poll() is None]
    for index in range(len(_free) - 1, -1, -1):
      if prepared_for in _free[index].prepared:
        return _free.pop(index)
    if _free:
      return _free.pop()
  return _Zygote()


def _checkin(zygote: _Zygote):
  if zygote.alive and zygote.owner_pid == os.getpid():
    with _free_lock:
      _free.append(zygote)


def shutdown():
  """Stops all idle zygotes of this process (they also exit when this process exits)."""
  with _free_lock:
    zygotes = [z for z in _free if z.owner_pid == os.getpid()]
    _free.clear()
  for zygote in zygotes:
    zygote.close()


atexit.register(shutdown)


# ----------------------------------------------------------------------------------------------
# Zygote side.
# ----------------------------------------------------------------------------------------------

def _serve(fd: int):
  """Zygote main loop: one request at a time, until the caller closes the connection."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  conn = Connection(fd)
  sys.path[:] = pickle.loads(conn.recv_bytes())
  while True:
    try:
      request = conn.recv_bytes()
    except (EOFError, OSError):
      return
    conn.send_bytes(pickle.dumps(_handle(request)))


_warmed_up: set = set()


def _handle(request: bytes) -> Outcome:
  try:
    preload, warmup, fn, args, kwargs, timeout_s, memory_limit_bytes = pickle.loads(request)
    for module in preload:
      __import__(module)
  except BaseException as error:  # the request cannot even be loaded here
    return Outcome("error", detail=f"cannot load request: {type(error).__name__}: {error}")
  if warmup is not None and warmup not in _warmed_up:
    _warmed_up.add(warmup)
    try:
      warmup()
    except Exception:  # noqa: BLE001 - a failed warm-up only costs speed
      pass
  read_fd, write_fd = os.pipe()
  pid = os.fork()
  if pid == 0:  # child
    os.close(read_fd)
    _run_child(write_fd, fn, args, kwargs, timeout_s, memory_limit_bytes)
  os.close(write_fd)
  start = time.monotonic()
  deadline = start + timeout_s
  chunks = []
  timed_out = False
  with os.fdopen(read_fd, "rb", buffering=0) as reader:
    while True:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        timed_out = True
        break
      ready, _, _ = select.select([reader], [], [], remaining)
      if not ready:
        continue
      chunk = reader.read(1 << 20)
      if not chunk:
        break
      chunks.append(chunk)
  if timed_out:
    os.kill(pid, signal.SIGKILL)
  _, status = os.waitpid(pid, 0)
  seconds = time.monotonic() - start
  if timed_out:
    return Outcome("timeout", detail=f"killed after {timeout_s:g}s", seconds=seconds)
  if not chunks:
    return Outcome("crash", detail=_describe_exit(status), seconds=seconds)
  try:
    status_name, value, detail = pickle.loads(b"".join(chunks))
  except Exception as error:  # a child killed mid-write
    return Outcome("crash", detail=f"unreadable result ({error}); {_describe_exit(status)}",
                   seconds=seconds)
  return Outcome(status_name, value=value, detail=detail, seconds=seconds)


def _run_child(write_fd: int, fn, args, kwargs, timeout_s: float, memory_limit_bytes: int | None):
  """Runs in the forked child; never returns."""
  exit_code = 0
  try:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _set_parent_death_signal()
    cpu_s = math.ceil(timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    if memory_limit_bytes is not None:
      resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
    try:
      result = ("ok", fn(*args, **kwargs), "")
    except MemoryError as error:
      result = ("crash", None, f"MemoryError (memory limit {memory_limit_bytes} bytes) {error}")
    except BaseException as error:
      result = ("error", None, f"{type(error).__name__}: {str(error)[:500]}")
    try:
      payload = pickle.dumps(result)
    except Exception as error:
      payload = pickle.dumps(("error", None, f"result not picklable: {type(error).__name__}"))
    view = memoryview(payload)
    while view:
      written = os.write(write_fd, view)
      view = view[written:]
  except BaseException:
    exit_code = 70
  finally:
    os._exit(exit_code)


def _set_parent_death_signal():
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  except (OSError, AttributeError):
    pass  # RLIMIT_CPU remains as a backstop


def _describe_exit(status: int) -> str:
  if os.WIFSIGNALED(status):
    number = os.WTERMSIG(status)
    name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else number
    return f"child killed by signal {name}"
  return f"child exited with code {os.WEXITSTATUS(status)} without a result"
