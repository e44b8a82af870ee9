"""RL with verifiable rewards (GRPO, GSPO), top to bottom: `recipe-jax rl --config configs/rl/<file>.py`.

mesh -> tokenizer -> prompts (Grain) -> policy from a Hugging Face checkpoint -> sampling
engine and reward pool -> loop:

  rollouts (G responses per prompt, scored, groups filtered; `stages.rollouts`)
  -> [KL reward penalty] -> group advantages -> packed rows from the sampled ids
  -> [old / reference log-prob passes] -> `ppo_epochs` x `num_mini_batches` optimizer steps
  -> push the new weights to the engine -> metrics, checkpoint.

Asynchronous mode generates step t+1's rollouts (with the weights from before step t's
update, a fixed lag of one step) in a background thread while step t trains; the seeds
and the lag make it reproducible, and a checkpoint holds the engine's weights and the
prompt position from before the in-flight rollouts, so a resumed run regenerates them
exactly.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import pathlib
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.checkpoint.orbax import CheckpointConfig, Checkpointer, abstract_state
from recipe_jax.config import ConfigError, require, to_dict
from recipe_jax.data.pipeline import Source, global_batch
from recipe_jax.data.prompts import PromptDataConfig, PromptPipeline, prompt_example_fn
from recipe_jax.models.config import DType, MoeImpl, Remat
from recipe_jax.parallel.mesh import BATCH_AXES, MeshConfig, batch_shards, make_mesh
from recipe_jax.stages import rl_batch, rollouts
from recipe_jax.stages.rl_objective import PolicyLossConfig, make_rl_loss, make_token_logprobs, rl_normalizers
from recipe_jax.stages.sft import DataSourceConfig, open_source
from recipe_jax.training import (OptimizerConfig, init_train_state, jit_train_step, learning_rate_schedule,
                                 make_optimizer, make_train_step, split_micro_batches)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DemoRlConfig:
  """The addition task as RL prompts (`recipe_jax.demo.rl_addition`), made under output_dir if missing.

  Questions of the SFT demo's held-out set (`<init_from>/../data/eval.jsonl`) are kept out of
  the RL prompts; `eval_records` fresh held-out questions measure exact match before, during
  (every `eval_every` steps) and after.
  """

  train_prompts: int = 4000
  eval_records: int = 200
  digits: int = 2
  seed: int = 0
  eval_every: int = 0


@dataclasses.dataclass(frozen=True)
class RlConfig:
  output_dir: str
  init_from: str                       # a Hugging Face checkpoint directory (e.g. the SFT stage's <output_dir>/hf)
  steps: int                           # RL steps (each: one rollout batch, ppo_epochs x num_mini_batches updates)
  prompts_per_step: int = 64
  sources: tuple[DataSourceConfig, ...] = ()
  tokenizer: str = ""                  # empty = init_from's
  prompts: PromptDataConfig = PromptDataConfig()
  rollout: rollouts.RolloutConfig = rollouts.RolloutConfig()
  loss: PolicyLossConfig = PolicyLossConfig()
  optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-6, schedule="constant")
  mesh: MeshConfig = MeshConfig()
  num_mini_batches: int = 1
  ppo_epochs: int = 1
  num_micro_batches: int = 1
  seq_len: int = 0                     # 0 = prompts.max_prompt_len + rollout.max_new_tokens
  engine_slots: int = 64
  routing_replay: bool | None = None   # None: on for MoE models, off for dense
  async_generation: bool = False
  dtype: DType = "float32"        # compute dtype
  param_dtype: DType = "float32"  # master weights, whatever the checkpoint stores (bf16 masters lose small updates)
  remat: Remat = "none"
  moe_impl: MoeImpl = "ragged"
  seed: int = 0
  log_every: int = 1
  checkpoint_every: int = 50
  keep_checkpoints: int = 3
  peak_flops_per_second: float = 459e12
  progress: bool = True
  export_hf: bool = True
  demo: DemoRlConfig | None = None

  def __post_init__(self):
    require(bool(self.init_from), "init_from", "name the Hugging Face checkpoint to start from")
    require(self.steps >= 1, "steps", "must be >= 1")
    require(self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1")
    require(self.num_mini_batches >= 1 and self.ppo_epochs >= 1, "num_mini_batches", "and ppo_epochs must be >= 1")
    require(self.num_micro_batches >= 1, "num_micro_batches", "must be >= 1")
    require(self.engine_slots >= 1, "engine_slots", "must be >= 1")
    require(bool(self.sources) or self.demo is not None, "sources", "name at least one prompt source")
    r = self.rollout
    tempered = r.temperature != 1.0 or r.top_p < 1.0 or r.top_k > 0
    require(not tempered or (self.loss.correction == "none" and self.loss.kl_reward_coef == 0), "rollout.temperature",
            "the engine reports log-probs at temperature 1 over the whole vocabulary; with temperature, top_p or "
            "top_k they do not describe the sampling distribution, so loss.correction must be 'none' and "
            "loss.kl_reward_coef 0")
    require(self.seq_len == 0 or self.seq_len >= self.prompts.max_prompt_len + self.rollout.max_new_tokens,
            "seq_len", f"must be 0 or >= max_prompt_len + max_new_tokens = "
            f"{self.prompts.max_prompt_len + self.rollout.max_new_tokens}")

  @property
  def row_len(self) -> int:
    return self.seq_len or self.prompts.max_prompt_len + self.rollout.max_new_tokens

  @property
  def updates_per_step(self) -> int:
    return self.num_mini_batches * self.ppo_epochs


# ----------------------------------------------------------------------------
# Pieces of one step
# ----------------------------------------------------------------------------


class _Passes:
  """Jitted log-prob passes (the proximal policy, the reference, the no-replay check), run over
  `num_micro_batches` micro-batches in sequence like the train step, so they fit where it fits."""

  def __init__(self, model_cfg, cfg: RlConfig, mesh):
    fn = make_token_logprobs(model_cfg, chunk_size=cfg.loss.logprob_chunk_size, mesh=mesh)
    n = cfg.num_micro_batches

    def micro_batched(params, batch):
      inputs = {k: batch[k] for k in (*_PASS_FIELDS, "replay_experts") if k in batch}
      if n == 1:
        return fn(params, inputs)
      out = jax.lax.map(lambda mb: fn(params, mb), split_micro_batches(inputs, n))   # [n, B/n, T]
      return out.swapaxes(0, 1).reshape(out.shape[0] * out.shape[1], -1)          # undoes the strided split

    self.logprobs = jax.jit(micro_batched)
    self.without_replay = jax.jit(lambda p, b: micro_batched(p, {k: v for k, v in b.items() if k != "replay_experts"}))


_PASS_FIELDS = ("tokens", "targets", "positions", "segment_ids")


def _kl_reward_penalty(groups, passes: _Passes, ref_params, cfg: RlConfig, mesh, replay_shape) -> float:
  """Subtracts kl_reward_coef * sum_t (log pi_sampler - log pi_ref) from every reward (a mini-batch of
  samples per reference pass); returns the mean KL."""
  samples = [s for g in groups for s in g.samples]
  kls = []
  for part in rl_batch.mini_batches(samples, cfg.num_mini_batches):
    rows, layout = rl_batch.pack_samples(part, seq_len=cfg.row_len, max_segments=cfg.loss.max_segments,
                                         rows_multiple=batch_shards(mesh) * cfg.num_micro_batches,
                                         replay_shape=replay_shape)
    ref = np.asarray(passes.logprobs(ref_params, global_batch(rows, mesh)))
    kl = rl_batch.segment_sums(rows["sampler_logprobs"] - ref, rows["loss_mask"], rows["segment_ids"], layout)
    for s, k in zip(part, kl):
      s.reward -= cfg.loss.kl_reward_coef * float(k)
    kls.append(kl)
  return float(np.mean(np.concatenate(kls)))


def _train_batches(groups, cfg: RlConfig, mesh, replay_shape) -> list[dict]:
  samples = [s for g in groups for s in g.samples if s.train]
  parts = rl_batch.mini_batches(samples, cfg.num_mini_batches)
  multiple = batch_shards(mesh) * cfg.num_micro_batches
  return [rl_batch.pack_samples(p, seq_len=cfg.row_len, rows_multiple=multiple, max_segments=cfg.loss.max_segments,
                                replay_shape=replay_shape)[0] for p in parts]


def _demo_eval(cfg: RlConfig, model_cfg, params, tokenizer) -> float:
  from recipe_jax.demo import addition
  records = [json.loads(line) for line in (pathlib.Path(cfg.output_dir) / "data" / "rl_eval.jsonl")
             .read_text().splitlines() if line.strip()]
  return addition.exact_match(model_cfg, params, tokenizer, records)


def _copy(tree):
  return jax.tree.map(lambda x: x.copy(), tree)


# ----------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------


def run(cfg: RlConfig, *, resume: bool = False) -> dict:
  """Trains; returns a summary dict (final metrics, prompt drop report, demo accuracies if any)."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import load_tokenizer
  from recipe_jax.metrics import MetricsWriter, train_flops_per_token
  from recipe_jax.rewards.pool import RewardPool
  from recipe_jax.sampling.engine import Engine

  if jax.process_count() > 1:
    raise ConfigError(f"the RL stage runs in one process for now ({jax.process_count()} here): every host would "
                      "generate the same rollouts and feed them as its own rows")
  out_dir = pathlib.Path(cfg.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  mesh = make_mesh(cfg.mesh)

  # --- tokenizer and prompts ----------------------------------------------------
  tokenizer = load_tokenizer(cfg.tokenizer or cfg.init_from)
  sources = cfg.sources
  if cfg.demo is not None:
    from recipe_jax.demo import rl_addition
    sources = (DataSourceConfig(str(rl_addition.prepare(cfg)), name="addition_rl"),)
  example_fn = prompt_example_fn(tokenizer, max_prompt_len=cfg.prompts.max_prompt_len,
                                 enable_thinking=cfg.prompts.enable_thinking)
  pipeline = PromptPipeline([Source(s.name or pathlib.Path(s.path).stem, open_source(s), s.weight) for s in sources],
                            example_fn, cfg.prompts)

  # --- policy, reference, engine --------------------------------------------------
  model_cfg, params = hf.load(cfg.init_from, mesh=mesh, dtype=cfg.param_dtype)
  model_cfg = dataclasses.replace(model_cfg, dtype=cfg.dtype, param_dtype=cfg.param_dtype, remat=cfg.remat,
                                  moe_impl=cfg.moe_impl)
  if len(tokenizer) > model_cfg.vocab_size:
    raise ConfigError(f"init_from: the model's vocab_size {model_cfg.vocab_size} is smaller than the tokenizer's "
                      f"{len(tokenizer)} tokens")
  replay = cfg.routing_replay if cfg.routing_replay is not None else model_cfg.num_moe_layers > 0
  if replay and model_cfg.num_moe_layers == 0:
    raise ConfigError("routing_replay: the model has no MoE layers to replay")
  replay_shape = (model_cfg.num_moe_layers, model_cfg.num_experts_per_tok) if replay else None
  ref_params = _copy(params) if cfg.loss.uses_reference else None
  eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
  engine = Engine(model_cfg, params, slots=cfg.engine_slots, max_len=cfg.prompts.max_prompt_len + cfg.rollout.max_new_tokens,
                  mesh=mesh, stop_token_ids=(eos,), pad_id=tokenizer.pad_token_id or 0)
  passes = _Passes(model_cfg, cfg, mesh)

  # --- train state and step ---------------------------------------------------------
  optimizer = make_optimizer(cfg.optimizer)
  state = jax.jit(lambda p: init_train_state(p, optimizer))(params)
  del params
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  loss_fn = make_rl_loss(model_cfg, cfg.loss, num_micro_batches=cfg.num_micro_batches, mesh=mesh)
  step_fn = jit_train_step(
      make_train_step(loss_fn, optimizer, normalizers_fn=rl_normalizers, num_micro_batches=cfg.num_micro_batches,
                      learning_rate_fn=learning_rate_schedule(cfg.optimizer)),
      state_shardings=state_shardings, batch_shardings=NamedSharding(mesh, P(BATCH_AXES)))

  # --- resume -------------------------------------------------------------------------
  checkpointer = Checkpointer(CheckpointConfig(str(out_dir / "checkpoints"), every_steps=cfg.checkpoint_every,
                                               keep_last=cfg.keep_checkpoints))
  saved = {"train": state, "engine": _copy(state.params)} if cfg.async_generation else {"train": state}
  start, empty_steps, summary = 0, 0, {}
  if checkpointer.steps():
    if not resume:
      raise ConfigError(f"output_dir: {out_dir} already holds checkpoints {checkpointer.steps()}; "
                        "pass --resume to continue, or choose another output_dir")
    restored = checkpointer.restore(abstract_state(saved, jax.tree.map(lambda x: x.sharding, saved)))
    state, start = restored.state["train"], int(restored.data_state["rl_step"])
    pipeline.set_state(restored.data_state["prompts"])
    empty_steps, summary = int(restored.data_state["empty_steps"]), dict(restored.data_state["summary"])
    if cfg.async_generation:
      engine.update_params(restored.state["engine"])
    print(f"resumed from RL step {start} (optimizer step {int(state.step)})", flush=True)
  del saved

  if cfg.demo is not None and start == 0:
    summary["demo_before"] = _demo_eval(cfg, model_cfg, state.params, tokenizer)
    print(f"demo before: exact match {summary['demo_before']:.3f}", flush=True)

  # --- loop -----------------------------------------------------------------------------
  writer = MetricsWriter(out_dir / "metrics", peak_flops_per_second=cfg.peak_flops_per_second * len(mesh.devices.flat),
                         flops_per_token=train_flops_per_token(model_cfg, cfg.row_len), total_steps=cfg.steps,
                         progress=cfg.progress, start_step=start)
  pool = RewardPool(num_workers=cfg.rollout.reward_workers, deadline_s=cfg.rollout.reward_deadline_s)
  executor = concurrent.futures.ThreadPoolExecutor(1) if cfg.async_generation else None

  def collect(step: int):
    return rollouts.collect(engine, pipeline, pool, tokenizer, cfg.rollout, prompts_per_step=cfg.prompts_per_step,
                            seed=cfg.seed, step=step)

  metrics: dict = {}
  steps_run = start
  pending, pending_data = None, pipeline.get_state()
  with checkpointer, writer, pool:
    try:
      for step in range(start, cfg.steps):
        started = time.perf_counter()
        # rollouts of this step: from the engine's current weights (sync: pushed just now;
        # async: the weights from before the previous update)
        push_s = 0.0
        if not cfg.async_generation:
          t0 = time.perf_counter()
          engine.update_params(_copy(state.params))
          push_s = time.perf_counter() - t0
        groups, stats = pending.result() if pending is not None else collect(step)
        wait_s = time.perf_counter() - started
        if stats.data_exhausted and not groups:
          log.warning("the prompts ran out after %d RL steps", step)
          break
        if cfg.async_generation:  # the next rollouts come from the weights before this step's update
          t0 = time.perf_counter()
          engine.update_params(_copy(state.params))
          push_s = time.perf_counter() - t0
        pending_data = pipeline.get_state()
        pending = executor.submit(collect, step + 1) if cfg.async_generation and step + 1 < cfg.steps else None

        row = dict(stats.metrics(), **{"time/rollout_wait_s": wait_s, "time/weight_push_s": push_s})
        if cfg.loss.kl_reward_coef > 0 and groups:
          row["rollout/kl_to_reference"] = _kl_reward_penalty(groups, passes, ref_params, cfg, mesh, replay_shape)
        rollouts.set_advantages(groups, cfg.rollout)
        batches = _train_batches(groups, cfg, mesh, replay_shape) if groups else []
        train_tokens = 0
        if not batches:
          empty_steps += 1
          log.warning("RL step %d: every group was filtered out (%s); no update", step + 1, dict(stats.dropped))
          row["rl/empty_step"] = 1.0
        else:
          t0 = time.perf_counter()
          batches = [global_batch(b, mesh) for b in batches]
          if cfg.updates_per_step > 1 or cfg.async_generation:
            batches = [dict(b, old_logprobs=passes.logprobs(state.params, b)) for b in batches]
          if cfg.loss.kl_coef > 0:
            batches = [dict(b, ref_logprobs=passes.logprobs(ref_params, b)) for b in batches]
          current = batches[0].get("old_logprobs")
          row["rl/sampler_abs_diff"] = _mean_abs_diff(
              current if current is not None else passes.logprobs(state.params, batches[0]), batches[0])
          if replay:
            row["rl/sampler_abs_diff_without_replay"] = _mean_abs_diff(passes.without_replay(state.params, batches[0]),
                                                                       batches[0])
          jax.block_until_ready(batches)
          row["time/logprob_passes_s"] = time.perf_counter() - t0
          t0 = time.perf_counter()
          step_metrics = []
          for _ in range(cfg.ppo_epochs):
            for b in batches:
              state, m = step_fn(state, b)
              step_metrics.append(m)
              train_tokens += int((np.asarray(b["segment_ids"]) > 0).sum())
          metrics = {k: float(np.mean([float(m[k]) for m in step_metrics])) for k in step_metrics[0]}
          row["time/train_s"] = time.perf_counter() - t0
          row["time/train_tokens_per_s"] = train_tokens / max(row["time/train_s"], 1e-9)  # real (non-padding) tokens
          row.update(metrics)
        if cfg.demo is not None and cfg.demo.eval_every and (step + 1) % cfg.demo.eval_every == 0:
          row["demo/exact_match"] = _demo_eval(cfg, model_cfg, state.params, tokenizer)
        row["time/step_s"] = time.perf_counter() - started
        writer.write(step + 1, row, tokens=train_tokens or None)
        steps_run = step + 1
        data_state = {"rl_step": step + 1, "prompts": pending_data, "empty_steps": empty_steps, "summary": summary}
        saved = {"train": state, "engine": engine.params} if cfg.async_generation else {"train": state}
        checkpointer.maybe_save(step + 1, saved, data_state, to_dict(cfg), force=step + 1 == cfg.steps)
        if (step + 1) % cfg.log_every == 0:
          log.info("RL step %d reward %.3f pass %.3f kept %d/%d %s", step + 1, row["rollout/reward_mean"],
                   row["rollout/pass_rate"], stats.groups_kept, stats.prompts, dict(stats.dropped))
    finally:
      if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)
    if start < steps_run < cfg.steps:  # the prompts ran out: keep where it stopped
      checkpointer.maybe_save(steps_run, {"train": state, "engine": engine.params} if cfg.async_generation
                              else {"train": state}, {"rl_step": steps_run, "prompts": pending_data,
                                                      "empty_steps": empty_steps, "summary": summary},
                              to_dict(cfg), force=True)

  report = pipeline.report()
  print(f"prompts: {report.summary()}")
  summary.update(rl_steps=steps_run, optimizer_steps=int(state.step), empty_steps=empty_steps,
                 prompts=report.to_state(), final={k: float(v) for k, v in metrics.items()})
  if cfg.export_hf:
    hf.save(out_dir / "hf", model_cfg, state.params)
    tokenizer.save_pretrained(out_dir / "hf")
  if cfg.demo is not None:
    summary["demo_after"] = _demo_eval(cfg, model_cfg, state.params, tokenizer)
    print(f"demo after: exact match {summary['demo_after']:.3f}", flush=True)
  (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
  return summary


def _mean_abs_diff(logprobs, batch) -> float:
  mask = np.asarray(batch["loss_mask"])
  diff = np.abs(np.asarray(logprobs) - np.asarray(batch["sampler_logprobs"]))
  return float((diff * mask).sum() / max(mask.sum(), 1.0))



def cpu_variant(full: RlConfig, *, output_dir: str, init_from: str, prompts_per_step: int = 8,
                group_size: int | None = None, steps: int = 20, engine_slots: int = 64,
                moe: bool = False) -> RlConfig:
  """A recipe config shrunk to run on a CPU host: the algorithm settings of `full` (ratio, clip,
  aggregation, KL, filters, mini-batches, replay) are kept; sizes, the optimizer and the data (the
  addition demo's prompts, math verifier) change. `moe` runs the dense expert loop, which beats
  `ragged_dot` on CPU for a handful of tiny experts."""
  import dataclasses as dc
  return dc.replace(
      full, output_dir=output_dir, init_from=init_from, steps=steps, prompts_per_step=prompts_per_step,
      sources=(), prompts=PromptDataConfig(max_prompt_len=48),
      rollout=dc.replace(full.rollout, group_size=group_size or full.rollout.group_size, max_new_tokens=16,
                         reward_workers=1),
      loss=dc.replace(full.loss, logprob_chunk_size=64, max_segments=16),
      optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=steps * full.updates_per_step,
                                b2=0.98, clip_norm=1.0),
      mesh=MeshConfig(fsdp=1), num_micro_batches=1, engine_slots=engine_slots, dtype="float32", remat="none",
      moe_impl="dense" if moe else full.moe_impl, checkpoint_every=10,
      demo=DemoRlConfig(train_prompts=2000, eval_records=100, digits=2, eval_every=10))
