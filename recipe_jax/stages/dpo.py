"""Preference optimization, top to bottom: `recipe-jax dpo --config configs/dpo/<file>.py`.

mesh -> tokenizer -> preference data -> policy from a Hugging Face checkpoint -> reference
log-probs (cached) -> train state -> jitted step -> loop (step, log, checkpoint) -> drop
report, Hugging Face export, and for the demo: held-out preference accuracy and the
task's exact match before and after.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
from typing import Literal

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.checkpoint.orbax import CheckpointConfig, Checkpointer, abstract_state
from recipe_jax.config import ConfigError, require, to_dict
from recipe_jax.data.pipeline import Source, global_batch
from recipe_jax.data.preference import (DroppedPair, PairReader, PreferenceDataConfig, PreferencePipeline,
                                        preference_example_fn)
from recipe_jax.losses.dpo import USES_REFERENCE
from recipe_jax.models.config import DType, MoeImpl, Remat
from recipe_jax.parallel.mesh import BATCH_AXES, MeshConfig, make_mesh
from recipe_jax.stages import reference_cache as refs
from recipe_jax.stages.dpo_objective import DpoLossConfig, dpo_normalizers, make_dpo_loss, make_sequence_logps
from recipe_jax.stages.sft import DataSourceConfig, open_source
from recipe_jax.training import (OptimizerConfig, init_train_state, jit_train_step, learning_rate_schedule,
                                 make_optimizer, make_train_step)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DemoPreferenceConfig:
  """The addition task's preference set (`recipe_jax.demo.preference`), made under output_dir if missing.

  `task_eval`: the exact-match records (JSONL); empty = the SFT demo run's held-out set,
  `<init_from>/../data/eval.jsonl`. Its questions are kept out of the preference set, and
  show whether the SFT demo wrote operands zero-padded; the pairs' questions follow suit.
  """

  train_pairs: int = 2000
  eval_pairs: int = 200
  digits: int = 2
  seed: int = 0
  task_eval: str = ""


@dataclasses.dataclass(frozen=True)
class DpoConfig:
  data: PreferenceDataConfig
  output_dir: str
  init_from: str                # a Hugging Face checkpoint directory (the SFT stage writes <output_dir>/hf)
  sources: tuple[DataSourceConfig, ...] = ()
  tokenizer: str = ""           # a tokenizer directory; empty = init_from's
  template: Literal["qwen3", "glm45"] = "qwen3"
  policy: Literal["all_assistant", "final_response"] = "final_response"
  strict: bool = False
  dtype: DType = "float32"
  remat: Remat = "none"
  moe_impl: MoeImpl = "ragged"
  steps: int = 0                # 0 = one pass over data.num_epochs epochs of the kept pairs
  loss: DpoLossConfig = DpoLossConfig()
  optimizer: OptimizerConfig = OptimizerConfig()
  mesh: MeshConfig = MeshConfig()
  num_micro_batches: int = 1
  reference_cache_dir: str = ""  # empty = <output_dir>/reference_cache
  log_every: int = 10
  checkpoint_every: int = 100
  keep_checkpoints: int = 3
  peak_flops_per_second: float = 459e12  # per chip (TPU v5p bf16)
  progress: bool = True
  export_hf: bool = True
  demo: DemoPreferenceConfig | None = None

  def __post_init__(self):
    require(bool(self.init_from), "init_from", "name the Hugging Face checkpoint to start from (and use as "
            "the reference model)")
    require(self.steps >= 0, "steps", "must be >= 0 (0 = one pass over the data)")
    require(self.steps > 0 or self.data.num_epochs is not None, "steps",
            "must be > 0 when data.num_epochs is None (endless data)")
    require(self.num_micro_batches >= 1, "num_micro_batches", "must be >= 1")
    require(self.data.batch_size % self.num_micro_batches == 0, "num_micro_batches",
            f"must divide data.batch_size={self.data.batch_size}")
    require(bool(self.sources) or self.demo is not None, "sources", "name at least one data source")


# ----------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------


def _read_jsonl(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task_eval_path(cfg: DpoConfig) -> pathlib.Path:
  return pathlib.Path(cfg.demo.task_eval or pathlib.Path(cfg.init_from).parent / "data" / "eval.jsonl")


def prepare_demo(cfg: DpoConfig) -> tuple[DataSourceConfig, DataSourceConfig]:
  """Writes the demo's preference train / held-out JSONL under output_dir, once."""
  from recipe_jax.demo import preference

  d, root = cfg.demo, pathlib.Path(cfg.output_dir) / "data"
  task_eval = task_eval_path(cfg)
  if not task_eval.exists():
    raise ConfigError(f"demo.task_eval: {task_eval} does not exist (the SFT demo writes data/eval.jsonl)")
  if not (root / "pref_eval.jsonl").exists():
    exclude = {r["messages"][0]["content"] for r in _read_jsonl(task_eval)}
    fixed_width = preference.writes_fixed_width(sorted(exclude), d.digits)  # write questions as SFT did
    preference.write_splits(root, train_pairs=d.train_pairs, eval_pairs=d.eval_pairs, digits=d.digits,
                            seed=d.seed, exclude=exclude, fixed_width=fixed_width)
  return (DataSourceConfig(str(root / "pref_train.jsonl"), name="addition_pairs"),
          DataSourceConfig(str(root / "pref_eval.jsonl"), name="addition_pairs_eval"))


def pair_logps(logps_fn, params, pipeline: PreferencePipeline, mesh) -> tuple[np.ndarray, np.ndarray]:
  """`(log pi(y|x), |y|)` `[N, 2]` of every real pair of a finite pipeline."""
  logps, lengths = [], []
  for batch in pipeline:
    lp, n = logps_fn(params, global_batch(batch, mesh))
    lp, n = np.asarray(lp), np.asarray(n)
    real = (n > 0).all(-1)
    logps.append(lp[real])
    lengths.append(n[real])
  return np.concatenate(logps), np.concatenate(lengths)


def demo_evaluation(cfg: DpoConfig, model_cfg, params, tokenizer, logps_fn, eval_source: Source, pair_fn, mesh,
                    reference: np.ndarray | None = None) -> tuple[dict, np.ndarray]:
  """The demo's held-out numbers for `params`, and the held-out log-probs `[N, 2]`.

  `reward_accuracy`: pairs whose implicit reward margin against `reference` (the starting
  model's held-out log-probs; None = `params` are the starting model, all margins 0) is > 0,
  the preference the DPO loss trains. `likelihood_accuracy`: pairs whose chosen answer is
  more likely per token (`recipe_jax.demo.preference`). `exact_match`: the task's greedy
  exact match on the held-out questions.
  """
  from recipe_jax.demo import addition, preference

  data = dataclasses.replace(cfg.data, shuffle=False, num_epochs=1, process_index=0, process_count=1)
  logps, lengths = pair_logps(logps_fn, params, PreferencePipeline(eval_source, pair_fn, data), mesh)
  ratio = (logps - (logps if reference is None else reference)) / np.maximum(lengths, 1.0)
  out = {"reward_accuracy": float(np.mean(ratio[:, 0] > ratio[:, 1])),
         "likelihood_accuracy": preference.preference_accuracy(logps, lengths),
         "exact_match": addition.exact_match(model_cfg, params, tokenizer, _read_jsonl(task_eval_path(cfg)))}
  return out, logps


# ----------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------


def run(cfg: DpoConfig, *, resume: bool = False) -> dict:
  """Trains; returns a summary dict (final metrics, drop report, demo accuracies if any)."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import load_tokenizer

  out_dir = pathlib.Path(cfg.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  mesh = make_mesh(cfg.mesh)
  host, hosts = cfg.data.hosts()

  # --- tokenizer and data -----------------------------------------------------
  tok_path = cfg.tokenizer or cfg.init_from
  tokenizer = load_tokenizer(tok_path)
  sources, eval_cfg = cfg.sources, None
  if cfg.demo is not None:
    train_cfg, eval_cfg = prepare_demo(cfg)
    sources = (train_cfg,)
  opened = [Source(s.name or pathlib.Path(s.path).stem, open_source(s), s.weight) for s in sources]
  pair_fn = preference_example_fn(tokenizer, template=cfg.template, policy=cfg.policy, strict=cfg.strict)
  data_cfg = dataclasses.replace(cfg.data, strict=cfg.strict or cfg.data.strict)

  # --- policy (and reference) from the starting checkpoint ---------------------------
  model_cfg, params = hf.load(cfg.init_from, mesh=mesh, dtype="float32")  # float32 master weights
  model_cfg = dataclasses.replace(model_cfg, dtype=cfg.dtype, remat=cfg.remat, moe_impl=cfg.moe_impl)
  if len(tokenizer) > model_cfg.vocab_size:
    raise ConfigError(f"init_from: the model's vocab_size {model_cfg.vocab_size} is smaller than the "
                      f"tokenizer's {len(tokenizer)} tokens")
  logps_fn = make_sequence_logps(model_cfg, chunk_size=cfg.loss.logprob_chunk_size, mesh=mesh)

  # --- reference log-probs, once, cached ----------------------------------------------
  reference = None
  if USES_REFERENCE[cfg.loss.loss_type]:
    parts = refs.key_parts(
        weights=refs.checkpoint_fingerprint(cfg.init_from), model=to_dict(model_cfg),
        sources=[refs.source_fingerprint(o.name, s.kind, s.path, len(o.data)) for s, o in zip(sources, opened)],
        template=cfg.template, policy=cfg.policy, seq_len=cfg.data.seq_len,
        tokenizer=refs.tokenizer_fingerprint(tok_path))
    cache = refs.ReferenceCache(pathlib.Path(cfg.reference_cache_dir or out_dir / "reference_cache"), parts,
                                host, hosts)
    compute = lambda: refs.compute_reference_logps(  # noqa: E731
        logps_fn, params, opened, pair_fn, seq_len=cfg.data.seq_len, batch_size=cfg.data.batch_size, mesh=mesh,
        host=host, hosts=hosts, read_threads=cfg.data.read_threads)
    reference, cached = refs.reference_logps(cache, compute, {o.name: len(o.data) for o in opened})
    print(f"reference log-probs: {'read from' if cached else 'computed and cached in'} {cache.path}", flush=True)
    kept = sum(int(np.isfinite(t).all(-1).sum()) for t in reference.values())
  else:
    kept = None
  steps = cfg.steps or _one_pass_steps(cfg, opened, pair_fn, kept)
  optimizer_cfg = dataclasses.replace(cfg.optimizer, total_steps=steps) if not cfg.steps else cfg.optimizer
  pipeline = PreferencePipeline(opened, pair_fn, data_cfg, reference=reference)

  # --- demo: before ---------------------------------------------------------------------
  summary: dict = {}
  if cfg.demo is not None:
    eval_source = Source(eval_cfg.name, open_source(eval_cfg))
    summary["demo_before"], eval_reference = demo_evaluation(cfg, model_cfg, params, tokenizer, logps_fn,
                                                             eval_source, pair_fn, mesh)
    print(f"demo before: {summary['demo_before']}", flush=True)

  # --- train state and step ------------------------------------------------------------
  optimizer = make_optimizer(optimizer_cfg)
  state = jax.jit(lambda p: init_train_state(p, optimizer))(params)
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  loss_fn = make_dpo_loss(model_cfg, cfg.loss, num_micro_batches=cfg.num_micro_batches, mesh=mesh)
  step_fn = jit_train_step(
      make_train_step(loss_fn, optimizer, normalizers_fn=dpo_normalizers, num_micro_batches=cfg.num_micro_batches,
                      learning_rate_fn=learning_rate_schedule(optimizer_cfg)),
      state_shardings=state_shardings, batch_shardings=NamedSharding(mesh, P(BATCH_AXES)))

  # --- resume ---------------------------------------------------------------------------
  checkpointer = Checkpointer(CheckpointConfig(str(out_dir / "checkpoints"), every_steps=cfg.checkpoint_every,
                                               keep_last=cfg.keep_checkpoints))
  if checkpointer.steps():
    if not resume:
      raise ConfigError(f"output_dir: {out_dir} already holds checkpoints {checkpointer.steps()}; "
                        "pass --resume to continue, or choose another output_dir")
    restored = checkpointer.restore(abstract_state(state, state_shardings))
    state = restored.state
    pipeline.set_state(restored.data_state)
    print(f"resumed from step {restored.step} of {checkpointer.steps()}", flush=True)

  # --- loop -----------------------------------------------------------------------------
  from recipe_jax.metrics import MetricsWriter, train_flops_per_token
  seq_len, rows = cfg.data.seq_len, 2 * cfg.data.batch_size * hosts
  writer = MetricsWriter(out_dir / "metrics", peak_flops_per_second=cfg.peak_flops_per_second * len(mesh.devices.flat),
                         flops_per_token=train_flops_per_token(model_cfg, seq_len), total_steps=steps,
                         progress=cfg.progress, start_step=int(state.step))
  metrics = {}
  with checkpointer, writer:
    for step in range(int(state.step), steps):
      host_batch = next(pipeline, None)
      if host_batch is None:
        if hosts == 1:
          log.warning("the data ran out after %d of %d steps", step, steps)
          break
        host_batch = _empty_batch(cfg.data)  # this host ran out before the others (uneven drops)
      state, metrics = step_fn(state, global_batch(host_batch, mesh))
      writer.write(step + 1, metrics, tokens=rows * seq_len)
      checkpointer.maybe_save(step + 1, state, pipeline.get_state(), to_dict(cfg), force=step + 1 == steps)
      if (step + 1) % cfg.log_every == 0:
        log.info("step %d loss %.4f reward accuracy %.3f margin %.3f %s", step + 1, float(metrics["loss"]),
                 float(metrics["reward_accuracy"]), float(metrics["margin"]), pipeline.report().summary())
    checkpointer.maybe_save(int(state.step), state, pipeline.get_state(), to_dict(cfg), force=True)

  # --- report, export, evaluate ---------------------------------------------------------
  report = pipeline.report()
  print(f"data: {report.summary()}")
  summary.update(steps=int(state.step), data=report.to_state(),
                 final={k: float(v) for k, v in metrics.items()} if metrics else None)
  if cfg.export_hf:
    hf.save(out_dir / "hf", model_cfg, state.params)
    tokenizer.save_pretrained(out_dir / "hf")
  if cfg.demo is not None:
    summary["demo_after"], _ = demo_evaluation(cfg, model_cfg, state.params, tokenizer, logps_fn, eval_source,
                                               pair_fn, mesh, reference=eval_reference)
    print(f"demo after: {summary['demo_after']}", flush=True)
  (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
  return summary


def _one_pass_steps(cfg: DpoConfig, opened, pair_fn, kept: int | None) -> int:
  """Optimizer steps for `data.num_epochs` passes over the kept pairs (every host runs as many)."""
  if kept is None:  # no reference pass counted them: count by rendering once
    kept = 0
    host, hosts = cfg.data.hosts()
    for s in opened:
      reader = PairReader(s, pair_fn, cfg.data.seq_len)
      kept += sum(not isinstance(reader(i), DroppedPair) for i in range(host, len(s.data), hosts))
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    kept = int(np.max(multihost_utils.process_allgather(np.asarray(kept))))
  if kept == 0:
    raise ConfigError("sources: every preference pair was dropped; see the warnings above")
  return math.ceil(kept * cfg.data.num_epochs / cfg.data.batch_size)


def _empty_batch(data: PreferenceDataConfig) -> dict[str, np.ndarray]:
  shape = (data.batch_size, 2, data.seq_len)
  batch = {k: np.zeros(shape, bool if k == "loss_mask" else np.int32)
           for k in ("tokens", "targets", "loss_mask", "segment_ids", "positions")}
  batch["reference_logps"] = np.zeros(shape[:2], np.float32)
  return batch
