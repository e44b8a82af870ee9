"""Training checkpoints: the train state, the data-iterator state and the config, with Orbax.

Every `every_steps` steps `Checkpointer.maybe_save` writes one Orbax step
directory holding three items, and keeps the last `keep_last`:

    <directory>/<step>/state/    the `TrainState` pytree (`StandardSave`: OCDBT + Zarr)
    <directory>/<step>/data/     the data-iterator state (JSON)
    <directory>/<step>/config/   the run's config, `config.to_dict(...)` (JSON)
    <directory>/<step>/recipe_jax_manifest.json

`Checkpointer.restore(abstract_state)` reads the newest good step back onto the
shardings of `abstract_state` (`abstract_state()` builds one from arrays or
shardings), so a resumed run may use another mesh than the run that saved.

Integrity. Two layers, because each catches what the other cannot:

* Orbax's commit protocol covers saves that never finished: a step is written
  under a temporary name and renamed (or, on object stores, marked with
  `commit_success.txt`) only once every host has written its part, and Orbax
  lists only committed steps. Temporary directories of killed saves are removed
  when the next `Checkpointer` opens the directory.
* Our manifest covers damage after the commit, which Orbax does not notice (a
  truncated array file reads back as garbage or fails deep inside TensorStore;
  an emptied step directory is still listed). Once the save has committed, the
  primary host writes `recipe_jax_manifest.json` (via a temporary file and a
  rename): the relative path, size and CRC-32 of every file of the step. A step
  is *good* when its manifest exists and parses, names the same step, and every
  listed file exists with that size and checksum; a step without a manifest
  (the process died between Orbax's commit and the manifest) counts as
  incomplete. `restore` verifies before reading and also treats any error Orbax
  raises while reading as damage.

`restore()` walks the steps newest first. A damaged step is logged as a
warning naming the step and what is wrong, moved aside to
`<directory>/corrupt/<step>` (so that training can save that step number
again), and the previous step is tried; when no step is good it raises
`CheckpointCorruptError` listing every step's problems. An explicit
`restore(step=N)` does not fall back.

Cost: checksums read the whole checkpoint once more on the primary host after
each save and on every host before a restore; `checksums=False` keeps the
size check only (for checkpoints of hundreds of gigabytes).

Multi-host: every process calls `maybe_save` and `restore`; Orbax writes each
process's shards and synchronizes the commit. The manifest is written and the
damaged steps moved by process 0 only; verification reads the shared file
system on every process, so all of them reach the same decision.

Parameter trees keep integer dict keys (`params["layers"][0]`): Orbax stores
them as strings, and restoring onto `abstract_state` rebuilds the tree with the
target's keys and node types (NamedTuples included).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zlib
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from recipe_jax.config import ConfigError, require

log = logging.getLogger(__name__)

MANIFEST = "recipe_jax_manifest.json"
CORRUPT_DIR = "corrupt"
_MANIFEST_FORMAT = 1
_ITEMS = ("state", "data", "config")
_CHUNK = 1 << 24


class CheckpointCorruptError(RuntimeError):
  """No checkpoint could be restored; the message lists what is wrong with each step."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Where and how often to checkpoint.

  `every_steps`: save when the step number (optimizer steps taken) is a
  multiple of it; `keep_last`: how many of the newest steps to keep;
  `async_save`: write in a background thread while training continues (the
  manifest follows once the write has finished); `checksums`: CRC-32 of every
  file in the manifest (else sizes only).
  """

  directory: str = ""
  every_steps: int = 1000
  keep_last: int = 3
  async_save: bool = False
  checksums: bool = True

  def __post_init__(self):
    require(self.every_steps >= 1, "checkpoint.every_steps", "must be >= 1")
    require(self.keep_last >= 1, "checkpoint.keep_last", "must be >= 1")


class Restored(NamedTuple):
  state: Any           # the train state, on the shardings of the abstract state
  data_state: dict     # the data-iterator state as saved
  config: dict         # the config dict as saved
  step: int            # the checkpoint's step number


def abstract_state(tree: Any, shardings: Any = None) -> Any:
  """`jax.ShapeDtypeStruct`s to restore onto: `tree`'s shapes and dtypes (arrays or structs).

  Each leaf keeps its own sharding unless `shardings` (a matching tree of
  `jax.sharding.Sharding`) gives one. A leaf with neither is restored onto the
  default device.
  """
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=getattr(x, "sharding", None)), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


# ----------------------------------------------------------------------------
# Manifest
# ----------------------------------------------------------------------------


def _step_files(step_dir: epath.Path) -> dict[str, epath.Path]:
  """Every regular file under `step_dir` but the manifest, by path relative to `step_dir`."""
  out, stack = {}, [step_dir]
  while stack:
    for p in stack.pop().iterdir():
      if p.is_dir():
        stack.append(p)
      elif not p.name.startswith(MANIFEST):  # the manifest and its temporary file
        out[str(p.relative_to(step_dir))] = p
  return dict(sorted(out.items()))


def _crc32(path: epath.Path) -> int:
  crc = 0
  with path.open("rb") as f:
    while chunk := f.read(_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return crc


def write_manifest(step_dir: epath.Path, step: int, *, checksums: bool = True) -> None:
  """Writes `MANIFEST` for a committed step directory: size (and CRC-32) of every file."""
  files = {}
  for rel, p in _step_files(step_dir).items():
    entry = {"size": p.stat().length}
    if checksums:
      entry["crc32"] = _crc32(p)
    files[rel] = entry
  manifest = {"format": _MANIFEST_FORMAT, "step": step, "files": files}
  tmp = step_dir / (MANIFEST + ".tmp")
  tmp.write_text(json.dumps(manifest, indent=1))
  tmp.rename(step_dir / MANIFEST)


def verify_step(step_dir: epath.Path, step: int, *, checksums: bool = True) -> list[str]:
  """What is wrong with a step directory against its manifest; empty when it is good."""
  if not step_dir.is_dir():
    return [f"{step_dir} does not exist"]
  path = step_dir / MANIFEST
  if not path.exists():
    return [f"no {MANIFEST}: the save did not finish (or was not written by recipe_jax)"]
  try:
    manifest = json.loads(path.read_text())
    files = manifest["files"]
    if manifest.get("format") != _MANIFEST_FORMAT or manifest.get("step") != step:
      return [f"{MANIFEST} has format {manifest.get('format')!r} and step {manifest.get('step')!r}, "
              f"expected format {_MANIFEST_FORMAT} and step {step}"]
  except (ValueError, KeyError, TypeError) as e:
    return [f"{MANIFEST} is unreadable ({type(e).__name__}: {e})"]
  if not files:
    return [f"{MANIFEST} lists no files"]
  problems = []
  for rel, want in files.items():
    p = step_dir / rel
    if not p.exists():
      problems.append(f"{rel} is missing")
      continue
    size = p.stat().length
    if size != want["size"]:
      problems.append(f"{rel} has {size} bytes, the manifest says {want['size']}"
                      + (" (truncated)" if size < want["size"] else ""))
    elif checksums and "crc32" in want and _crc32(p) != want["crc32"]:
      problems.append(f"{rel} has the wrong checksum (its contents changed)")
  return problems


# ----------------------------------------------------------------------------
# Checkpointer
# ----------------------------------------------------------------------------


def _is_primary() -> bool:
  return jax.process_index() == 0


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


class Checkpointer:
  """Saves and restores (train state, data-iterator state, config dict) under `cfg.directory`.

  Usage::

      ckpt = Checkpointer(CheckpointConfig(directory, every_steps=500, keep_last=3))
      if resume and ckpt.steps():
        state, data_state, saved_config, step = ckpt.restore(abstract_state(state))
        pipeline.set_state(data_state)
      for ...:
        state, metrics = train_step(state, batch)
        ckpt.maybe_save(int(state.step), state, pipeline.get_state(), to_dict(config))
      ckpt.close()
  """

  def __init__(self, cfg: CheckpointConfig):
    if not cfg.directory:
      raise ConfigError("checkpoint.directory: must be set")
    self.cfg = cfg
    self.directory = epath.Path(cfg.directory).absolute()
    policies = ocp.checkpoint_managers
    options = ocp.CheckpointManagerOptions(
        # Every `every_steps`, and at a preemption notice (Orbax syncs it across hosts).
        save_decision_policy=policies.AnySavePolicy([
            policies.FixedIntervalPolicy(cfg.every_steps), policies.PreemptionCheckpointingPolicy()]),
        preservation_policy=policies.LatestN(cfg.keep_last),
        enable_async_checkpointing=cfg.async_save,
        cleanup_tmp_directories=True,
        create=True,
    )
    self._manager = ocp.CheckpointManager(self.directory, item_names=_ITEMS, options=options)
    self._unsealed: int | None = None  # an async save whose manifest is not written yet

  # -- saving ------------------------------------------------------------------

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def steps(self) -> list[int]:
    """Committed steps on disk, oldest first (good or not)."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def maybe_save(self, step: int, state: Any, data_state: dict, config: dict, *,
                 force: bool = False) -> bool:
    """Saves when `step` is a multiple of `every_steps` (or `force`); returns whether it saved.

    `data_state` and `config` are saved as JSON (tuples come back as lists). A
    step that is not newer than every step on disk is not saved (Orbax's rule;
    `restore` moves damaged newer steps aside, so a resumed run saves again).
    With `async_save` the call returns once the arrays are copied off the
    devices; the manifest is written by a later call once the write is done.
    """
    if self._unsealed is not None and not self._manager.is_saving_in_progress():
      self._seal_pending()
    if step in self._manager.all_steps() or not (force or self._manager.should_save(step)):
      return False
    self._seal_pending()
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
                              config=ocp.args.JsonSave(config))
    if not self._manager.save(step, args=args, force=True):
      return False
    if self.cfg.async_save:
      self._unsealed = step
    else:
      self._seal(step)
    return True

  def _seal(self, step: int) -> None:
    """Writes the manifest of a step whose save has finished."""
    if not _is_primary():
      return
    if not self.step_dir(step).is_dir():
      log.error("checkpoint step %d was not committed (see Orbax's log); no manifest written", step)
      return
    write_manifest(self.step_dir(step), step, checksums=self.cfg.checksums)

  def _seal_pending(self) -> None:
    if self._unsealed is None:
      return
    step, self._unsealed = self._unsealed, None
    self._manager.wait_until_finished()
    self._seal(step)

  def wait_until_finished(self) -> None:
    """Blocks until an async save has finished and its manifest is written."""
    self._manager.wait_until_finished()
    self._seal_pending()

  def close(self) -> None:
    self.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- restoring ---------------------------------------------------------------

  def verify(self, step: int) -> list[str]:
    """What is wrong with checkpoint `step` (module docstring); empty when it is good."""
    return verify_step(self.step_dir(step), step, checksums=self.cfg.checksums)

  def latest_good_step(self) -> int | None:
    """The newest step that verifies, or None; logs a warning for each newer damaged step."""
    for step in reversed(self.steps()):
      problems = self.verify(step)
      if not problems:
        return step
      log.warning("checkpoint step %d in %s is damaged: %s", step, self.directory, "; ".join(problems))
    return None

  def restore(self, abstract: Any, *, step: int | None = None) -> Restored:
    """Restores the newest good step (or `step`) with arrays placed as `abstract` says.

    Args:
      abstract: the train-state pytree as `jax.ShapeDtypeStruct`s with shardings
        (see `abstract_state`), or as arrays whose shardings are used.
      step: a step to restore exactly, without falling back.

    Raises:
      FileNotFoundError: there is no checkpoint (or no step `step`).
      CheckpointCorruptError: no candidate step verifies and restores.
    """
    self.wait_until_finished()
    steps = self.steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoints in {self.directory}")
    if step is not None and step not in steps:
      raise FileNotFoundError(f"no checkpoint step {step} in {self.directory}; steps: {steps}")
    candidates = [step] if step is not None else steps[::-1]
    abstract = abstract_state(abstract)
    damaged: dict[int, list[str]] = {}
    for i, s in enumerate(candidates):
      problems = self.verify(s)
      if not problems:
        try:
          out = self._manager.restore(s, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore(),
              config=ocp.args.JsonRestore()))
        except Exception as e:  # noqa: BLE001 -- any failure to read means the step is unusable
          problems = [f"Orbax could not read it ({type(e).__name__}: {e})"]
      if problems:
        damaged[s] = problems
        then = f"trying step {candidates[i + 1]}" if i + 1 < len(candidates) else "no step left to try"
        log.warning("checkpoint step %d in %s is damaged: %s; %s",
                    s, self.directory, "; ".join(problems), then)
        continue
      if damaged:
        self._set_aside(sorted(damaged))
      return Restored(out.state, out.data, out.config, s)
    raise CheckpointCorruptError(
        f"no usable checkpoint in {self.directory}:\n" +
        "\n".join(f"  step {s}: " + "; ".join(p) for s, p in damaged.items()))

  def _set_aside(self, steps: list[int]) -> None:
    """Moves damaged steps newer than the restored one to `corrupt/`, so they can be re-saved."""
    _sync("recipe_jax_checkpoint_set_aside_start")
    if _is_primary():
      aside = self.directory / CORRUPT_DIR
      aside.mkdir(parents=True, exist_ok=True)
      for s in steps:
        dest, n = aside / str(s), 1
        while dest.exists():
          dest, n = aside / f"{s}.{n}", n + 1
        self.step_dir(s).rename(dest)
        log.warning("moved damaged checkpoint step %d to %s", s, dest)
    _sync("recipe_jax_checkpoint_set_aside_done")
    self._manager.reload()
