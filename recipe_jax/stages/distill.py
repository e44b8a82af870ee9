"""On-policy distillation (OPD; multi-teacher MOPD): `recipe-jax distill --config configs/distill/<file>.py`.

mesh -> tokenizer -> every teacher's tokenizer checked against the student's -> prompts
(Grain; each record names its `domain`) -> student from a Hugging Face checkpoint ->
teachers, each loaded once -> sampling engine -> loop:

  the student samples `samples_per_prompt` responses per prompt (sampling engine)
  -> the responses of each teacher's domains are packed into rows (`rl_batch.pack_samples`)
     and that teacher scores them in one forward: log pi_T of the sampled tokens (and, for the
     full-distribution kinds, its final hidden states)
  -> one student update on all rows (`stages.distill_objective`) -> push the new weights to
     the engine -> metrics (overall and per domain), checkpoint.

No verifier and no reward: the teacher's per-token log-probs are the whole signal (NebulaExp
section V-C, RECIPES.md). A prompt whose domain has no teacher is skipped and counted in the
prompt report ("unrouted_domain"). Sampling seeds depend only on (seed, step), and a
checkpoint holds the student, the optimizer and the prompt iterator, so a resumed run is
the same run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
import zlib
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from recipe_jax.checkpoint.orbax import CheckpointConfig, Checkpointer, abstract_state
from recipe_jax.config import ConfigError, require, to_dict
from recipe_jax.data.errors import DropRecord
from recipe_jax.data.pipeline import Source, global_batch
from recipe_jax.data.prompts import PromptDataConfig, PromptPipeline, prompt_example_fn
from recipe_jax.models.config import DType, MoeImpl, Remat
from recipe_jax.parallel.mesh import BATCH_AXES, MeshConfig, batch_shards, make_mesh
from recipe_jax.stages import rl_batch
from recipe_jax.stages.distill_objective import (DistillLossConfig, distill_normalizers, make_distill_loss,
                                                 make_teacher_pass, teacher_head)
from recipe_jax.stages.rollouts import Sample
from recipe_jax.stages.sft import DataSourceConfig, open_source
from recipe_jax.training import (OptimizerConfig, init_train_state, learning_rate_schedule, make_optimizer,
                                 make_train_step)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """A frozen teacher: a Hugging Face checkpoint that shares the student's tokenizer.

  It may be larger than the student (other width, depth, experts). dtype: parameters and
  compute (None: parameters as stored, compute in the stage's `dtype`). mesh: its own layout
  over the same devices (None: the student's mesh).
  """

  name: str
  init_from: str
  tokenizer: str = ""                  # empty = init_from's
  dtype: DType | None = None
  mesh: MeshConfig | None = None

  def __post_init__(self):
    require(bool(self.name), "teachers.name", "every teacher needs a name")
    require(bool(self.init_from), f"teachers[{self.name}].init_from", "name the teacher's checkpoint")


@dataclasses.dataclass(frozen=True)
class DistillSamplingConfig:
  """How the student samples: `samples_per_prompt` responses of at most `max_new_tokens` each."""

  samples_per_prompt: int = 4
  max_new_tokens: int = 1024
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0

  def __post_init__(self):
    require(self.samples_per_prompt >= 1, "sampling.samples_per_prompt", "must be >= 1")
    require(self.max_new_tokens >= 1, "sampling.max_new_tokens", "must be >= 1")
    require(self.temperature > 0, "sampling.temperature", "must be > 0 (on-policy samples, not greedy)")


@dataclasses.dataclass(frozen=True)
class DemoDistillConfig:
  """Held-out exact match per domain (`recipe_jax.demo.addition.exact_match`), before, every
  `eval_every` steps, and after; the teachers are measured once on their own domains.

  eval_files: (domain, JSONL of conversations whose answer is `\\boxed{...}`) pairs.
  """

  eval_files: tuple[tuple[str, str], ...]
  eval_every: int = 0
  max_new_tokens: int = 16

  def __post_init__(self):
    require(len(self.eval_files) >= 1, "demo.eval_files", "name at least one (domain, file) pair")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
  output_dir: str
  init_from: str                       # the student: a Hugging Face checkpoint directory
  steps: int                           # distillation steps (each: one sampling round, one optimizer step)
  teachers: tuple[TeacherConfig, ...] = ()
  routing: tuple[tuple[str, str], ...] = ()          # (domain, teacher name) pairs
  sources: tuple[DataSourceConfig, ...] = ()
  source_domains: tuple[tuple[str, str], ...] = ()   # (source name, domain) for records without "domain"
  default_domain: str = ""             # the domain of records with neither
  prompts_per_step: int = 64
  tokenizer: str = ""                  # empty = init_from's
  prompts: PromptDataConfig = PromptDataConfig()
  sampling: DistillSamplingConfig = DistillSamplingConfig()
  loss: DistillLossConfig = DistillLossConfig()
  optimizer: OptimizerConfig = OptimizerConfig(learning_rate=1e-6, schedule="constant")
  mesh: MeshConfig = MeshConfig()
  num_micro_batches: int = 1
  seq_len: int = 0                     # 0 = prompts.max_prompt_len + sampling.max_new_tokens
  engine_slots: int = 64
  routing_replay: bool | None = None   # None: on for an MoE student, off for dense
  dtype: DType = "float32"
  remat: Remat = "none"
  moe_impl: MoeImpl = "ragged"
  seed: int = 0
  log_every: int = 1
  checkpoint_every: int = 50
  keep_checkpoints: int = 3
  peak_flops_per_second: float = 459e12
  progress: bool = True
  export_hf: bool = True
  demo: DemoDistillConfig | None = None

  def __post_init__(self):
    require(bool(self.init_from), "init_from", "name the student's Hugging Face checkpoint")
    require(self.steps >= 1, "steps", "must be >= 1")
    require(self.prompts_per_step >= 1, "prompts_per_step", "must be >= 1")
    require(self.num_micro_batches >= 1, "num_micro_batches", "must be >= 1")
    require(self.engine_slots >= 1, "engine_slots", "must be >= 1")
    require(bool(self.sources), "sources", "name at least one prompt source")
    require(len(self.teachers) >= 1, "teachers", "name at least one teacher")
    names = [t.name for t in self.teachers]
    require(len(set(names)) == len(names), "teachers", f"names must be unique: {names}")
    require(len(self.routing) >= 1, "routing", "route at least one domain to a teacher: (domain, teacher name)")
    domains = [d for d, _ in self.routing]
    require(len(set(domains)) == len(domains), "routing", f"a domain is routed twice: {domains}")
    for domain, teacher in self.routing:
      require(bool(domain), "routing", "a domain name is empty")
      require(teacher in names, "routing", f"domain {domain!r} names teacher {teacher!r}; teachers: {names}")
    unused = [n for n in names if n not in {t for _, t in self.routing}]
    require(not unused, "teachers", f"{unused} have no domain routed to them (each would be loaded for nothing)")
    for source, domain in self.source_domains:
      require(domain in domains, "source_domains", f"source {source!r} maps to {domain!r}, which has no teacher")
    require(not self.default_domain or self.default_domain in domains, "default_domain",
            f"{self.default_domain!r} has no teacher; routed domains: {domains}")
    if self.demo is not None:
      for domain, _ in self.demo.eval_files:
        require(domain in domains, "demo.eval_files", f"domain {domain!r} has no teacher")
    require(self.seq_len == 0 or self.seq_len >= self.prompts.max_prompt_len + self.sampling.max_new_tokens,
            "seq_len", f"must be 0 or >= max_prompt_len + max_new_tokens = "
            f"{self.prompts.max_prompt_len + self.sampling.max_new_tokens}")

  @property
  def row_len(self) -> int:
    return self.seq_len or self.prompts.max_prompt_len + self.sampling.max_new_tokens

  @property
  def domains(self) -> tuple[str, ...]:
    return tuple(d for d, _ in self.routing)


# ----------------------------------------------------------------------------
# Prompts with a domain
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DistillPrompt:
  """One prompt: its token ids, its domain (which picks the teacher), and where it came from."""

  ids: tuple[int, ...]
  domain: str
  source: str
  index: int


def distill_example_fn(tokenizer, *, max_prompt_len: int, domains: tuple[str, ...],
                       source_domains: dict[str, str] | None = None, default_domain: str = "",
                       enable_thinking: bool = False):
  """`fn(record, source, index) -> example`: the prompt rendered as `prompt_example_fn` renders it,
  with the record's `domain` (else its source's, else `default_domain`) instead of a reward.
  DropRecord on a malformed record, no user turn, no or an unrouted domain, or an over-long prompt."""
  source_domains = source_domains or {}

  def domain_fields(record: dict, source: str) -> dict:
    domain = record.get("domain", source_domains.get(source, default_domain))
    if not isinstance(domain, str) or not domain:
      raise DropRecord("missing_domain", f"domain: expected a non-empty string, got {domain!r} (and the source "
                       "has no default)")
    if domain not in domains:
      raise DropRecord("unrouted_domain", f"domain {domain!r} has no teacher; routed: {list(domains)}")
    return {"domain": domain}

  return prompt_example_fn(tokenizer, max_prompt_len=max_prompt_len, enable_thinking=enable_thinking,
                           fields=domain_fields)


class DistillPromptPipeline(PromptPipeline):
  """`PromptPipeline` over `distill_example_fn` examples: `take(n)` returns `DistillPrompt`s."""

  def take(self, n: int) -> list[DistillPrompt]:
    out: list[DistillPrompt] = []
    if n < 1:
      return out
    for example in self.iterator:
      out.append(DistillPrompt(tuple(int(t) for t in example["tokens"]), example["domain"], example["source"],
                               example["index"]))
      if len(out) == n:
        break
    return out


# ----------------------------------------------------------------------------
# Teachers
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Teacher:
  name: str
  index: int
  model: Any                           # ModelConfig
  params: Any
  mesh: Any
  score: Any                           # jitted teacher pass


def _load_tokenizer(path: str, field: str):
  from recipe_jax.data.tokenizer import load_tokenizer
  try:
    return load_tokenizer(path)
  except Exception as e:  # a missing or unreadable tokenizer: say which teacher and where
    raise ConfigError(f"{field}: cannot load a tokenizer from {path} ({type(e).__name__}: {e}); "
                      "save the tokenizer there or set the tokenizer field") from e


def check_teacher_tokenizers(cfg: DistillConfig, tokenizer) -> None:
  """Raises ConfigError naming the teacher whose tokenizer differs from the student's."""
  vocab = tokenizer.get_vocab()
  for t in cfg.teachers:
    path = t.tokenizer or t.init_from
    other = _load_tokenizer(path, f"teachers[{t.name}].tokenizer")
    if len(other) == len(tokenizer) and other.get_vocab() == vocab:
      continue
    theirs = other.get_vocab()
    differ = sorted(set(vocab.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:5]
    raise ConfigError(f"teachers[{t.name}]: its tokenizer ({path}, {len(other)} tokens) differs from the "
                      f"student's ({cfg.tokenizer or cfg.init_from}, {len(tokenizer)} tokens), e.g. (token, id) "
                      f"{differ}; on-policy distillation scores the student's token ids with the teacher, so "
                      "both must share one tokenizer")


def load_teachers(cfg: DistillConfig, student_model, tokenizer, student_mesh) -> list[_Teacher]:
  """Every teacher, loaded once, with its vocabulary checked against the student's."""
  from recipe_jax.checkpoint import hf
  teachers = []
  for i, t in enumerate(cfg.teachers):
    mesh = student_mesh if t.mesh is None or t.mesh == cfg.mesh else make_mesh(t.mesh)
    model, params = hf.load(t.init_from, mesh=mesh, dtype=t.dtype)
    model = model.replace(dtype=t.dtype or cfg.dtype, moe_impl=cfg.moe_impl)
    if model.vocab_size < len(tokenizer):
      raise ConfigError(f"teachers[{t.name}]: vocab_size {model.vocab_size} is smaller than the tokenizer's "
                        f"{len(tokenizer)} tokens")
    if model.vocab_size < student_model.vocab_size or (cfg.loss.full_distribution
                                                       and model.vocab_size != student_model.vocab_size):
      need = "equal" if cfg.loss.full_distribution else ">="
      raise ConfigError(f"teachers[{t.name}]: vocab_size {model.vocab_size} must be {need} the student's "
                        f"{student_model.vocab_size} (loss.kind {cfg.loss.kind!r}): the teacher scores every "
                        "token id the student can sample")
    fn = make_teacher_pass(model, chunk_size=cfg.loss.logprob_chunk_size, with_hidden=cfg.loss.full_distribution,
                           mesh=mesh)
    teachers.append(_Teacher(t.name, i, model, params, mesh, jax.jit(fn)))
  return teachers


# ----------------------------------------------------------------------------
# One step's batch
# ----------------------------------------------------------------------------

_TEACHER_FIELDS = ("tokens", "targets", "segment_ids", "positions")


def _domain_ids(rows: dict, layout: list[list[int]], domain_index: list[int]) -> np.ndarray:
  out = np.zeros(rows["tokens"].shape, np.int32)
  for r, members in enumerate(layout):
    for seg, i in enumerate(members, start=1):
      out[r][(rows["segment_ids"][r] == seg) & (rows["loss_mask"][r] > 0)] = domain_index[i] + 1
  return out


def build_batch(samples: list[Sample], domains: list[str], teachers: list[_Teacher], cfg: DistillConfig,
                rows_multiple: int, replay_shape, hidden_width: int) -> tuple[dict, dict]:
  """Host rows for one student update, each teacher's block scored by that teacher in one forward.

  Returns the batch and the seconds spent in teacher passes (per teacher name).
  """
  route = dict(cfg.routing)
  index = {d: i for i, d in enumerate(cfg.domains)}
  blocks, timings = [], {}
  for teacher in teachers:
    mine = [i for i, d in enumerate(domains) if route[d] == teacher.name]
    if not mine:
      continue
    rows, layout = rl_batch.pack_samples([samples[i] for i in mine], seq_len=cfg.row_len,
                                         rows_multiple=rows_multiple, max_segments=cfg.loss.max_segments,
                                         replay_shape=replay_shape)
    started = time.perf_counter()
    out = teacher.score(teacher.params, global_batch({k: rows[k] for k in _TEACHER_FIELDS}, teacher.mesh))
    logprobs, hidden = out if cfg.loss.full_distribution else (out, None)
    rows["teacher_logprobs"] = np.asarray(logprobs, np.float32)
    timings[teacher.name] = time.perf_counter() - started
    rows["domain_ids"] = _domain_ids(rows, layout, [index[domains[i]] for i in mine])
    rows["teacher_rows"] = np.full((len(rows["tokens"]),), teacher.index, np.int32)
    if hidden is not None:
      hidden = np.asarray(hidden)
      rows["teacher_hidden"] = np.pad(hidden, ((0, 0), (0, 0), (0, hidden_width - hidden.shape[-1]))).astype(
          jax.numpy.dtype(cfg.dtype))                        # one dtype for every teacher's block
    blocks.append(rows)
  batch = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
  pad = rl_batch.num_rows(len(batch["tokens"]), rows_multiple) - len(batch["tokens"])
  if pad:
    batch = {k: np.concatenate([v, np.full((pad, *v.shape[1:]), -1 if k == "teacher_rows" else 0, v.dtype)])
             for k, v in batch.items()}
  return batch, timings


def step_seed(seed: int, step: int) -> int:
  """The sampling seed of one distillation step (independent of everything else)."""
  return zlib.crc32(f"distill/{seed}/{step}".encode()) % 2**31


def _domain_metrics(cfg: DistillConfig, metrics: dict, samples: list[Sample], domains: list[str]) -> dict:
  """Per-domain mean d_t (from the step's sums), response length and count; pops the sum arrays."""
  kl_sum, tokens = np.asarray(metrics.pop("domain_kl_sum")), np.asarray(metrics.pop("domain_tokens"))
  out = {}
  for k, d in enumerate(cfg.domains):
    lengths = [len(s.token_ids) for s, dom in zip(samples, domains) if dom == d]
    if not lengths:
      continue
    out[f"distill/{d}/responses"] = len(lengths)
    out[f"distill/{d}/response_len"] = float(np.mean(lengths))
    if tokens[k] > 0:
      out[f"distill/{d}/reverse_kl"] = float(kl_sum[k] / tokens[k])
  return out


def _demo_eval(cfg: DistillConfig, model, params, tokenizer, domains: tuple[str, ...] | None = None) -> dict:
  from recipe_jax.demo import addition
  scores = {}
  for domain, path in cfg.demo.eval_files:
    if domains is not None and domain not in domains:
      continue
    records = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
    scores[domain] = addition.exact_match(model, params, tokenizer, records, max_new_tokens=cfg.demo.max_new_tokens)
  return scores


def _copy(tree):
  return jax.tree.map(lambda x: x.copy(), tree)


# ----------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------


def run(cfg: DistillConfig, *, resume: bool = False) -> dict:
  """Distills; returns a summary dict (final metrics, per-domain KL, prompt drop report, demo scores)."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.metrics import MetricsWriter, train_flops_per_token
  from recipe_jax.sampling.driver import generate
  from recipe_jax.sampling.engine import Engine

  out_dir = pathlib.Path(cfg.output_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  mesh = make_mesh(cfg.mesh)

  # --- tokenizers and prompts ---------------------------------------------------
  tokenizer = _load_tokenizer(cfg.tokenizer or cfg.init_from, "tokenizer")
  check_teacher_tokenizers(cfg, tokenizer)
  example_fn = distill_example_fn(tokenizer, max_prompt_len=cfg.prompts.max_prompt_len, domains=cfg.domains,
                                  source_domains=dict(cfg.source_domains), default_domain=cfg.default_domain,
                                  enable_thinking=cfg.prompts.enable_thinking)
  pipeline = DistillPromptPipeline([Source(s.name or pathlib.Path(s.path).stem, open_source(s), s.weight)
                                    for s in cfg.sources], example_fn, cfg.prompts)

  # --- student, teachers, engine -------------------------------------------------
  model_cfg, params = hf.load(cfg.init_from, mesh=mesh, dtype="float32")  # float32 master weights
  model_cfg = dataclasses.replace(model_cfg, dtype=cfg.dtype, remat=cfg.remat, moe_impl=cfg.moe_impl)
  if len(tokenizer) > model_cfg.vocab_size:
    raise ConfigError(f"init_from: the student's vocab_size {model_cfg.vocab_size} is smaller than the "
                      f"tokenizer's {len(tokenizer)} tokens")
  teachers = load_teachers(cfg, model_cfg, tokenizer, mesh)
  replay = cfg.routing_replay if cfg.routing_replay is not None else model_cfg.num_moe_layers > 0
  if replay and model_cfg.num_moe_layers == 0:
    raise ConfigError("routing_replay: the student has no MoE layers to replay")
  replay_shape = (model_cfg.num_moe_layers, model_cfg.num_experts_per_tok) if replay else None
  eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
  engine = Engine(model_cfg, params, slots=cfg.engine_slots, mesh=mesh, stop_token_ids=(eos,),
                  max_len=cfg.prompts.max_prompt_len + cfg.sampling.max_new_tokens, pad_id=tokenizer.pad_token_id or 0)
  rows_multiple = math.lcm(batch_shards(mesh) * cfg.num_micro_batches, *(batch_shards(t.mesh) for t in teachers))
  hidden_width = max(t.model.hidden_size for t in teachers)
  replicated = NamedSharding(mesh, P())
  heads = tuple(jax.device_put(teacher_head(t.model, t.params, hidden_width), replicated) for t in teachers) \
      if cfg.loss.full_distribution else ()

  # --- train state and step ---------------------------------------------------------
  optimizer = make_optimizer(cfg.optimizer)
  state = jax.jit(lambda p: init_train_state(p, optimizer))(params)
  del params
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  make_loss = make_distill_loss(model_cfg, cfg.loss, num_domains=len(cfg.domains),
                                num_micro_batches=cfg.num_micro_batches, mesh=mesh)

  def train_step(state, batch, heads):
    return make_train_step(make_loss(heads), optimizer, normalizers_fn=distill_normalizers,
                           num_micro_batches=cfg.num_micro_batches,
                           learning_rate_fn=learning_rate_schedule(cfg.optimizer))(state, batch)

  step_fn = jax.jit(train_step, donate_argnums=(0,),
                    in_shardings=(state_shardings, NamedSharding(mesh, P(BATCH_AXES)), (replicated,) * len(heads)),
                    out_shardings=(state_shardings, None))

  # --- resume -------------------------------------------------------------------------
  checkpointer = Checkpointer(CheckpointConfig(str(out_dir / "checkpoints"), every_steps=cfg.checkpoint_every,
                                               keep_last=cfg.keep_checkpoints))
  start = 0
  if checkpointer.steps():
    if not resume:
      raise ConfigError(f"output_dir: {out_dir} already holds checkpoints {checkpointer.steps()}; "
                        "pass --resume to continue, or choose another output_dir")
    restored = checkpointer.restore(abstract_state({"train": state}, {"train": state_shardings}))
    state, start = restored.state["train"], int(restored.data_state["distill_step"])
    pipeline.set_state(restored.data_state["prompts"])
    print(f"resumed from distillation step {start} (optimizer step {int(state.step)})", flush=True)

  summary: dict = {}
  if cfg.demo is not None and start == 0:
    summary["demo_teachers"] = {t.name: _demo_eval(cfg, t.model, t.params, tokenizer,
                                                   tuple(d for d, n in cfg.routing if n == t.name)) for t in teachers}
    summary["demo_before"] = _demo_eval(cfg, model_cfg, state.params, tokenizer)
    print(f"demo teachers: {summary['demo_teachers']}; student before: {summary['demo_before']}", flush=True)

  # --- loop -----------------------------------------------------------------------------
  writer = MetricsWriter(out_dir / "metrics", peak_flops_per_second=cfg.peak_flops_per_second * len(mesh.devices.flat),
                         flops_per_token=train_flops_per_token(model_cfg, cfg.row_len), total_steps=cfg.steps,
                         progress=cfg.progress, start_step=start)
  s = cfg.sampling
  metrics: dict = {}
  domain_row: dict = {}
  empty_steps = generation_errors = 0
  with checkpointer, writer:
    for step in range(start, cfg.steps):
      started = time.perf_counter()
      t0 = time.perf_counter()
      engine.update_params(_copy(state.params))
      row: dict = {"time/weight_push_s": time.perf_counter() - t0}

      # sample: the student's own responses
      prompts = pipeline.take(cfg.prompts_per_step)
      if not prompts:
        log.warning("the prompts ran out after %d distillation steps", step)
        break
      t0 = time.perf_counter()
      completions = generate(engine, [list(p.ids) for p in prompts], n=s.samples_per_prompt,
                             max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                             top_k=s.top_k, seed=step_seed(cfg.seed, step))
      row["time/generate_s"] = time.perf_counter() - t0
      samples, domains = [], []
      for c in completions:
        if c.finish_reason == "error":
          generation_errors += 1
          log.warning("generation error, response left out: %s", c.error)
          continue
        samples.append(Sample(list(c.prompt_ids), list(c.token_ids), np.asarray(c.logprobs, np.float32),
                              c.finish_reason, 0.0, "", expert_ids=c.expert_ids))
        domains.append(prompts[c.prompt_index].domain)
      response_tokens = sum(len(x.token_ids) for x in samples)
      row.update({"rollout/prompts": len(prompts), "rollout/responses": len(samples),
                  "rollout/response_tokens": response_tokens,
                  "rollout/response_len": response_tokens / max(len(samples), 1),
                  "rollout/truncated_frac": sum(x.finish_reason == "length" for x in samples) / max(len(samples), 1),
                  "rollout/generation_errors": len(completions) - len(samples)})

      # score with the teachers, then update the student
      train_tokens = 0
      if not samples:
        empty_steps += 1
        row["distill/empty_step"] = 1.0
      else:
        batch, timings = build_batch(samples, domains, teachers, cfg, rows_multiple, replay_shape, hidden_width)
        row.update({f"time/teacher_{k}_s": v for k, v in timings.items()})
        t0 = time.perf_counter()
        state, step_metrics = step_fn(state, global_batch(batch, mesh), heads)
        step_metrics = jax.device_get(step_metrics)
        row["time/train_s"] = time.perf_counter() - t0
        train_tokens = int(batch["tokens"].size)
        domain_row = _domain_metrics(cfg, step_metrics, samples, domains)
        metrics = {k: float(v) for k, v in step_metrics.items()}
        row.update(metrics)
        row.update(domain_row)
      if cfg.demo is not None and cfg.demo.eval_every and (step + 1) % cfg.demo.eval_every == 0:
        row.update({f"demo/{d}/exact_match": v for d, v in _demo_eval(cfg, model_cfg, state.params, tokenizer).items()})
      row["time/step_s"] = time.perf_counter() - started
      writer.write(step + 1, row, tokens=train_tokens or None)
      data_state = {"distill_step": step + 1, "prompts": pipeline.get_state()}
      checkpointer.maybe_save(step + 1, {"train": state}, data_state, to_dict(cfg), force=step + 1 == cfg.steps)
      if (step + 1) % cfg.log_every == 0:
        log.info("distill step %d reverse KL %.4f %s", step + 1, metrics.get("distill/reverse_kl", float("nan")),
                 {k: round(v, 4) for k, v in domain_row.items() if k.endswith("reverse_kl")})

  report = pipeline.report()
  print(f"prompts: {report.summary()}")
  summary.update(distill_steps=cfg.steps, optimizer_steps=int(state.step), empty_steps=empty_steps,
                 generation_errors=generation_errors, prompts=report.to_state(),
                 final=metrics, final_domains=domain_row)
  if cfg.export_hf:
    hf.save(out_dir / "hf", model_cfg, state.params)
    tokenizer.save_pretrained(out_dir / "hf")
  if cfg.demo is not None:
    summary["demo_after"] = _demo_eval(cfg, model_cfg, state.params, tokenizer)
    print(f"demo after: {summary['demo_after']}", flush=True)
  (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
  return summary
