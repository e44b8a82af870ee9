"""Training checkpoints: round trip, schedule, mesh restore, damage and fallback, resume after SIGKILL."""

import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.checkpoint.orbax import (MANIFEST, CheckpointConfig, CheckpointCorruptError, Checkpointer,
                                         abstract_state)
from recipe_jax.config import to_dict
from recipe_jax.models import get_preset
from recipe_jax.models.transformer import abstract_params
from recipe_jax.parallel.mesh import make_mesh
from recipe_jax.parallel.sharding import param_shardings
from recipe_jax.training import OptimizerConfig, TrainState, init_train_state, make_optimizer

OPT_CFG = OptimizerConfig(learning_rate=1e-3, warmup_steps=2, total_steps=10, weight_decay=0.1)


def _train_state(seed: int = 0) -> TrainState:
  """A state with integer layer keys, non-zero Adam moments and a non-zero step."""
  rng = np.random.default_rng(seed)
  params = {"embed": rng.normal(size=(16, 8)).astype(np.float32),
            "layers": {i: {"w": rng.normal(size=(8, 8)).astype(np.float32),
                           "b": rng.normal(size=(8,)).astype(np.float32)} for i in range(2)}}
  params = jax.tree.map(jnp.asarray, params)
  opt = make_optimizer(OPT_CFG)
  state = init_train_state(params, opt)
  grads = jax.tree.map(lambda p: 0.1 * p + 0.01, params)
  updates, opt_state = opt.update(grads, state.opt_state, params)
  return TrainState(jnp.asarray(3, jnp.int32), optax.apply_updates(params, updates), opt_state)


def _assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save_steps(directory, steps, **cfg):
  """Saves `steps` (each with its own state and data position); returns {step: state}."""
  states = {}
  with Checkpointer(CheckpointConfig(str(directory), **cfg)) as ckpt:
    for s in steps:
      states[s] = _train_state(seed=s)
      assert ckpt.maybe_save(s, states[s], {"position": s}, {"run": "test"}, force=True)
  return states


# ----------------------------------------------------------------------------
# Round trip, schedule, shardings
# ----------------------------------------------------------------------------


def test_round_trip_keeps_int_keys_optimizer_state_data_and_config(tmp_path):
  state = _train_state()
  data_state = {"format": 1, "iterator": {"position": 17, "epoch": [0, 2]}, "seed": 5}
  config = to_dict(OPT_CFG) | {"model": {"dense_layers": [0, 2], "eps": 1e-7}}
  with Checkpointer(CheckpointConfig(str(tmp_path), every_steps=1, keep_last=2)) as ckpt:
    assert ckpt.maybe_save(3, state, data_state, config)

  restored = Checkpointer(CheckpointConfig(str(tmp_path))).restore(abstract_state(state))
  assert restored.step == 3
  assert isinstance(restored.state, TrainState)
  assert set(restored.state.params["layers"]) == {0, 1}  # int keys, not "0", "1"
  _assert_same(restored.state, state)
  assert int(restored.state.opt_state[1][0].count) == 1  # Adam's count came back too
  assert restored.data_state == data_state
  assert restored.config == config


def test_every_steps_and_keep_last(tmp_path):
  state = _train_state()
  with Checkpointer(CheckpointConfig(str(tmp_path), every_steps=2, keep_last=2)) as ckpt:
    saved = [s for s in range(1, 8) if ckpt.maybe_save(s, state, {"position": s}, {})]
    assert saved == [2, 4, 6]
    assert ckpt.steps() == [4, 6]
    assert not ckpt.maybe_save(6, state, {}, {}, force=True)  # already on disk
    assert ckpt.maybe_save(7, state, {"position": 7}, {}, force=True)
    assert ckpt.steps() == [6, 7]
    assert all(ckpt.verify(s) == [] for s in ckpt.steps())  # older manifests stay valid
    assert ckpt.latest_good_step() == 7


def test_async_save_writes_manifest_once_finished(tmp_path):
  state = _train_state()
  with Checkpointer(CheckpointConfig(str(tmp_path), every_steps=2, async_save=True)) as ckpt:
    assert ckpt.maybe_save(2, state, {"position": 2}, {})
    assert not ckpt.maybe_save(3, state, {"position": 3}, {})
  assert (tmp_path / "2" / MANIFEST).exists()
  _assert_same(Checkpointer(CheckpointConfig(str(tmp_path))).restore(abstract_state(state)).state, state)


def test_restore_places_arrays_on_target_shardings(tmp_path):
  cfg = get_preset("tiny-dense")
  rng = np.random.default_rng(0)  # random values in the model's parameter tree (cheaper than init)
  params = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), abstract_params(cfg))
  opt = make_optimizer(OPT_CFG)
  state = init_train_state(params, opt)  # saved from one device
  with Checkpointer(CheckpointConfig(str(tmp_path))) as ckpt:
    ckpt.maybe_save(1, state, {}, {}, force=True)

  mesh = make_mesh((1, 4, 1, 2))
  replicated = NamedSharding(mesh, P())
  p_sh = param_shardings(cfg, params, mesh)
  shardings = TrainState(replicated, p_sh, optax.tree_map_params(
      opt, lambda _, s: s, state.opt_state, p_sh, transform_non_params=lambda _: replicated))
  restored = Checkpointer(CheckpointConfig(str(tmp_path))).restore(abstract_state(state, shardings))

  _assert_same(restored.state, state)
  flat_sh = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  for x, sh in zip(jax.tree.leaves(restored.state), flat_sh):
    assert x.sharding == sh
  q = restored.state.params["layers"][0]["attn"]["q_proj"]  # [D, N, H] on (fsdp, tensor, -)
  assert q.sharding.spec == P("fsdp", "tensor", None)
  assert q.addressable_shards[0].data.shape == (q.shape[0] // 4, q.shape[1] // 2, q.shape[2])


# ----------------------------------------------------------------------------
# Damage: detection and fallback
# ----------------------------------------------------------------------------


def _largest_array_file(step_dir: pathlib.Path) -> pathlib.Path:
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]
  return max(files, key=lambda p: p.stat().st_size)


def _truncate(step_dir):
  p = _largest_array_file(step_dir)
  with open(p, "r+b") as f:
    f.truncate(p.stat().st_size // 2)


def _delete_file(step_dir):
  (step_dir / "state" / "_METADATA").unlink()


def _scramble_metadata(step_dir):  # same size, different bytes
  p = step_dir / "state" / "_METADATA"
  p.write_bytes(b"x" * p.stat().st_size)


def _drop_manifest(step_dir):
  (step_dir / MANIFEST).unlink()


def _garble_manifest(step_dir):
  (step_dir / MANIFEST).write_text('{"format": 1, "step": ')


@pytest.mark.parametrize("damage, reason", [
    (_truncate, "truncated"),
    (_delete_file, "state/_METADATA is missing"),
    (_scramble_metadata, "state/_METADATA has the wrong checksum"),
    (_drop_manifest, "the save did not finish"),
    (_garble_manifest, "is unreadable"),
])
def test_damaged_latest_falls_back_to_previous_with_warning(tmp_path, caplog, damage, reason):
  states = _save_steps(tmp_path, [2, 4, 6], keep_last=3)
  damage(tmp_path / "6")

  ckpt = Checkpointer(CheckpointConfig(str(tmp_path), every_steps=2, keep_last=3))
  with caplog.at_level(logging.WARNING, logger="recipe_jax.checkpoint.orbax"):
    restored = ckpt.restore(abstract_state(states[6]))
  assert restored.step == 4 and restored.data_state == {"position": 4}
  _assert_same(restored.state, states[4])
  warning = next(r.getMessage() for r in caplog.records if "step 6" in r.getMessage())
  assert reason in warning and "trying step 4" in warning

  # The damaged step is set aside, so the resumed run can save step 6 again.
  assert ckpt.steps() == [2, 4] and (tmp_path / "corrupt" / "6").is_dir()
  assert ckpt.maybe_save(6, states[6], {"position": 6}, {})
  assert ckpt.latest_good_step() == 6
  ckpt.close()


def test_damage_the_manifest_misses_is_caught_when_orbax_reads(tmp_path, caplog):
  """Without checksums a same-size scramble passes the manifest; Orbax's read error still falls back."""
  states = _save_steps(tmp_path, [2, 4], checksums=False)
  _scramble_metadata(tmp_path / "4")
  ckpt = Checkpointer(CheckpointConfig(str(tmp_path), checksums=False))
  assert ckpt.verify(4) == []
  with caplog.at_level(logging.WARNING, logger="recipe_jax.checkpoint.orbax"):
    restored = ckpt.restore(abstract_state(states[4]))
  assert restored.step == 2
  assert any("Orbax could not read it" in r.getMessage() for r in caplog.records)


def test_every_step_damaged_raises_listing_each(tmp_path):
  states = _save_steps(tmp_path, [2, 4])
  for step_dir in (tmp_path / "2", tmp_path / "4"):
    for p in step_dir.iterdir():
      p.unlink() if p.is_file() else shutil.rmtree(p)
  ckpt = Checkpointer(CheckpointConfig(str(tmp_path)))
  with pytest.raises(CheckpointCorruptError, match=r"(?s)no usable checkpoint.*step 4: no .*step 2: no "):
    ckpt.restore(abstract_state(states[4]))
  assert ckpt.latest_good_step() is None
  assert ckpt.steps() == [2, 4]  # nothing is moved when nothing could be restored


def test_explicit_step_does_not_fall_back(tmp_path):
  states = _save_steps(tmp_path, [2, 4])
  _truncate(tmp_path / "4")
  ckpt = Checkpointer(CheckpointConfig(str(tmp_path)))
  with pytest.raises(CheckpointCorruptError, match="step 4: .*truncated"):
    ckpt.restore(abstract_state(states[4]), step=4)
  assert ckpt.restore(abstract_state(states[4]), step=2).step == 2
  with pytest.raises(FileNotFoundError, match="no checkpoint step 3"):
    ckpt.restore(abstract_state(states[4]), step=3)


def test_empty_directory_raises_file_not_found(tmp_path):
  ckpt = Checkpointer(CheckpointConfig(str(tmp_path / "none")))
  assert ckpt.steps() == [] and ckpt.latest_good_step() is None
  with pytest.raises(FileNotFoundError, match="no checkpoints"):
    ckpt.restore(abstract_state(_train_state()))


# ----------------------------------------------------------------------------
# Resume after SIGKILL: the same per-step losses, bit for bit
# ----------------------------------------------------------------------------

_TRAIN_SCRIPT = textwrap.dedent('''
    """A tiny MLP regression trained with the project's step and AdamW; one loss line per step."""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from recipe_jax.checkpoint.orbax import CheckpointConfig, Checkpointer, abstract_state
    from recipe_jax.training import (OptimizerConfig, init_train_state, jit_train_step, make_optimizer,
                                     make_train_step)

    ckpt_dir, losses_path, total_steps, resume, sleep = sys.argv[1:6]
    total_steps, resume, sleep = int(total_steps), resume == "1", float(sleep)

    class Batches:
      """Batch i is a pure function of (seed, i); the state is JSON."""
      def __init__(self, seed):
        self.seed, self.position = seed, 0
      def get_state(self):
        return {"seed": self.seed, "position": self.position}
      def set_state(self, state):
        self.seed, self.position = state["seed"], state["position"]
      def __next__(self):
        rng = np.random.default_rng([self.seed, self.position])
        self.position += 1
        x = rng.normal(size=(32, 8)).astype(np.float32)
        y = np.sin(x @ np.linspace(-1, 1, 8, dtype=np.float32))[:, None]
        return {"x": x, "y": y}

    def loss_fn(params, batch, normalizers):
      h = jnp.tanh(batch["x"] @ params["layers"][0]["w"] + params["layers"][0]["b"])
      pred = h @ params["layers"][1]["w"] + params["layers"][1]["b"]
      return jnp.mean((pred - batch["y"]) ** 2), {}

    rng = np.random.default_rng(0)
    params = {"layers": {0: {"w": rng.normal(size=(8, 16)), "b": np.zeros(16)},
                         1: {"w": rng.normal(size=(16, 1)) / 4, "b": np.zeros(1)}}}
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    opt_cfg = OptimizerConfig(learning_rate=3e-2, warmup_steps=3, total_steps=total_steps,
                              weight_decay=0.01)
    opt = make_optimizer(opt_cfg)
    state = init_train_state(params, opt)
    batches = Batches(seed=7)
    ckpt = Checkpointer(CheckpointConfig(ckpt_dir, every_steps=2, keep_last=2))
    if resume:
      state, data_state, _, _ = ckpt.restore(abstract_state(state))
      batches.set_state(data_state)
    step_fn = jit_train_step(make_train_step(loss_fn, opt))
    with open(losses_path, "a") as out:
      for _ in range(int(state.step), total_steps):
        step = int(state.step)
        state, metrics = step_fn(state, next(batches))
        out.write(f"{step} {float(metrics['loss']).hex()}\\n")
        out.flush()
        ckpt.maybe_save(step + 1, state, batches.get_state(), {"total_steps": total_steps})
        time.sleep(sleep)
    ckpt.close()
''')


def _losses(path: pathlib.Path) -> dict[int, str]:
  out = {}
  for line in path.read_text().splitlines():
    step, loss = line.split()
    assert int(step) not in out
    out[int(step)] = loss
  return out


def _run(tmp_path, name, *, resume=False, sleep=0.0, total=12):
  script = tmp_path / "train.py"
  script.write_text(_TRAIN_SCRIPT)
  args = [sys.executable, str(script), str(tmp_path / f"ckpt_{name}"), str(tmp_path / f"losses_{name}.txt"),
          str(total), "1" if resume else "0", str(sleep)]
  return subprocess.Popen(args, cwd=pathlib.Path(__file__).parents[2], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def _wait(proc, timeout=60):
  out, _ = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, out.decode()[-4000:]


def test_sigkill_then_resume_gives_bit_identical_losses(tmp_path):
  total = 12
  reference = _run(tmp_path, "reference", total=total)
  killed = _run(tmp_path, "killed", sleep=0.2, total=total)
  losses_killed = tmp_path / "losses_killed.txt"
  deadline = time.monotonic() + 60
  while not (losses_killed.exists() and len(losses_killed.read_text().splitlines()) >= 5):
    assert killed.poll() is None, killed.communicate()[0].decode()[-4000:]
    assert time.monotonic() < deadline, "the run to be killed made no progress"
    time.sleep(0.02)
  os.kill(killed.pid, signal.SIGKILL)
  killed.wait()
  assert killed.returncode == -signal.SIGKILL

  before_kill = _losses(losses_killed)
  assert 5 <= len(before_kill) < total
  (tmp_path / "losses_killed.txt").rename(tmp_path / "losses_before_kill.txt")
  _wait(_run(tmp_path, "killed", resume=True, total=total))  # same checkpoint directory
  _wait(reference)

  want = _losses(tmp_path / "losses_reference.txt")
  resumed = _losses(tmp_path / "losses_killed.txt")
  assert sorted(want) == list(range(total))
  first = min(resumed)
  assert 4 <= first <= max(before_kill) + 1 and first % 2 == 0  # resumed from a checkpoint
  assert sorted(resumed) == list(range(first, total))
  assert before_kill == {s: want[s] for s in before_kill}
  assert resumed == {s: want[s] for s in resumed}  # bit-identical, including re-run steps
