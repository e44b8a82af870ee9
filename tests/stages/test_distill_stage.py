"""The distillation stage end to end on tiny random models: a student moves toward a different, larger
teacher; two teachers serve their own domains; an unrouted domain is counted; resume is exact; a
teacher that is the student gives zero divergence; a teacher with another tokenizer is refused."""

import json

import jax
import numpy as np
import pytest

from recipe_jax.checkpoint import hf
from recipe_jax.config import ConfigError
from recipe_jax.data.prompts import PromptDataConfig
from recipe_jax.data.tokenizer import load_tokenizer, train_tokenizer
from recipe_jax.demo.addition import make_records
from recipe_jax.losses.distill import divergence_from_logits
from recipe_jax.models import forward, get_preset
from recipe_jax.models.transformer import abstract_params
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.stages import distill
from recipe_jax.stages.distill_objective import DistillLossConfig
from recipe_jax.stages.sft import DataSourceConfig
from recipe_jax.training import OptimizerConfig

# A confident teacher: random weights with its LM head scaled up, so its next-token distributions are
# more peaked than the near-uniform random student's (KL about half a nat, not hundredths).
_HEAD_SCALE = 5.0


def _random_params(cfg, seed):
  """Random weights drawn on the host (norm scales 1, the rest N(0, 0.02^2)): much faster than
  compiling `init_params` for every architecture of the fixture."""
  rng = np.random.default_rng(seed)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_params(cfg))
  return jax.tree_util.tree_unflatten(treedef, [
      np.ones(x.shape, np.float32) if "norm" in jax.tree_util.keystr(p) else
      (0.02 * rng.standard_normal(x.shape)).astype(np.float32) for p, x in leaves])


def _save(root, name, cfg, seed, tok, head_scale=1.0):
  params = _random_params(cfg, seed)
  params["lm_head"] = params["lm_head"] * head_scale
  hf.save(root / name, cfg, params)
  tok.save_pretrained(root / name)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """One tokenizer; a tiny student and a deeper, wider, confident teacher; a teacher with a different
  tokenizer; prompts of two domains plus an unrouted and a domain-less one."""
  root = tmp_path_factory.mktemp("distill")
  records = make_records(40, digits=2, seed=3)
  tok = train_tokenizer([json.dumps(r) for r in records], vocab_size=300)
  tiny = get_preset("tiny-dense").replace(vocab_size=320)
  _save(root, "student", tiny, 0, tok)
  _save(root, "teacher_add", tiny.replace(num_layers=3, hidden_size=96, intermediate_size=192), 1, tok, _HEAD_SCALE)
  other = train_tokenizer([json.dumps(r) for r in make_records(40, digits=3, seed=9)], vocab_size=280)
  _save(root, "teacher_other_tok", tiny, 3, other)
  lines = [{"messages": [r["messages"][0]], "domain": "add" if i % 2 else "sub"} for i, r in enumerate(records[:16])]
  lines.insert(3, {"messages": [records[30]["messages"][0]], "domain": "poetry"})   # no teacher for it
  lines.insert(6, {"messages": [records[31]["messages"][0]]})                       # no domain at all
  (root / "prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  return root


def _config(workdir, out, teachers, routing, **overrides):
  base = dict(
      output_dir=str(out), init_from=str(workdir / "student"), steps=2, prompts_per_step=4,
      teachers=tuple(distill.TeacherConfig(name, str(workdir / name)) for name in teachers), routing=routing,
      sources=(DataSourceConfig(str(workdir / "prompts.jsonl"), name="mix"),),
      prompts=PromptDataConfig(max_prompt_len=32, read_threads=1),
      sampling=distill.DistillSamplingConfig(samples_per_prompt=2, max_new_tokens=6),
      loss=DistillLossConfig(logprob_chunk_size=32, chunk_size=16, max_segments=8),
      optimizer=OptimizerConfig(learning_rate=1e-3, schedule="constant", total_steps=100),
      mesh=MeshConfig(fsdp=1), engine_slots=8, checkpoint_every=1, progress=False, export_hf=False)
  base.update(overrides)
  return distill.DistillConfig(**base)


def _rows(out):
  return {r["step"]: r for r in map(json.loads, (out / "metrics" / "metrics.jsonl").read_text().splitlines())}


def _first_token_reverse_kl(student_dir, teacher_dir, prompts) -> float:
  """Full-vocabulary KL(student || teacher) of the first response token of each prompt, from full
  forward passes of both models (no sampling involved): the position every sampled response starts at."""
  s_cfg, s_params = hf.load(student_dir)
  t_cfg, t_params = hf.load(teacher_dir)
  width = max(len(p) for p in prompts)
  tokens, segments, mask = (np.zeros((len(prompts), width), t) for t in (np.int32, np.int32, np.float32))
  for i, p in enumerate(prompts):
    tokens[i, :len(p)], segments[i, :len(p)], mask[i, len(p) - 1] = p, 1, 1.0
  kl = divergence_from_logits(forward(s_cfg, s_params, tokens, segment_ids=segments).logits,
                              forward(t_cfg, t_params, tokens, segment_ids=segments).logits, mask, kind="reverse_kl")
  return float(kl.sum() / mask.sum())


def test_opd_student_moves_toward_a_larger_teacher(workdir, tmp_path):
  """Sampled reverse KL only: its score-function gradient must pull the student toward the teacher."""
  cfg = _config(workdir, tmp_path, ["teacher_add"], (("add", "teacher_add"), ("sub", "teacher_add")), steps=10,
                default_domain="add", export_hf=True, checkpoint_every=100,
                sampling=distill.DistillSamplingConfig(samples_per_prompt=8, max_new_tokens=6),
                optimizer=OptimizerConfig(learning_rate=5e-3, schedule="constant", total_steps=100, clip_norm=0.0))
  summary = distill.run(cfg)
  rows = _rows(tmp_path)
  assert summary["optimizer_steps"] == 10 and cfg.loss.kind == "sampled"
  assert all(np.isfinite(r["distill/reverse_kl"]) for r in rows.values())
  tok = load_tokenizer(workdir / "student")
  prompts = [tok.apply_chat_template(json.loads(line)["messages"], tokenize=True, add_generation_prompt=True,
                                     enable_thinking=False, return_dict=False)
             for line in (workdir / "prompts.jsonl").read_text().splitlines()]
  before = _first_token_reverse_kl(workdir / "student", workdir / "teacher_add", prompts)
  after = _first_token_reverse_kl(tmp_path / "hf", workdir / "teacher_add", prompts)
  assert before > 0.3 and after < 0.7 * before, (before, after)
  # the domain-less prompt took default_domain; "poetry" has no teacher and is dropped (once per epoch)
  assert list(summary["prompts"]["dropped"]["mix"]) == ["unrouted_domain"]


def test_mopd_routes_each_domain_to_its_teacher_and_resumes_exactly(workdir, tmp_path):
  """Two teachers of two widths, a full-distribution loss (hidden states zero-padded to the widest
  teacher), and one teacher that is the student itself: its domain's d_t is 0 up to float rounding
  (the teacher pass and the train step see different batch shapes)."""
  routing = (("add", "teacher_add"), ("sub", "student"))
  loss = DistillLossConfig(kind="jsd", beta=0.5, logprob_chunk_size=32, chunk_size=16, max_segments=8)

  def config(out, **kw):
    return _config(workdir, out, ["teacher_add", "student"], routing, loss=loss,   # in file order: both domains
                   prompts=PromptDataConfig(max_prompt_len=32, read_threads=1, shuffle=False), **kw)

  straight = distill.run(config(tmp_path / "straight"))
  distill.run(config(tmp_path / "resumed", steps=1))
  resumed = distill.run(config(tmp_path / "resumed"), resume=True)
  a, b = _rows(tmp_path / "straight"), _rows(tmp_path / "resumed")
  for key in ("loss", "distill/reverse_kl", "distill/divergence", "grad_norm", "rollout/response_tokens"):
    assert a[2][key] == b[2][key], key
  assert straight["final"] == resumed["final"] and straight["final_domains"] == resumed["final_domains"]
  # step 1: the student is its own teacher on "sub" (exactly 0), the larger teacher disagrees on "add"
  first = a[1]
  assert abs(first["distill/sub/reverse_kl"]) < 1e-6 and first["distill/add/reverse_kl"] > 0.05
  assert first["distill/divergence"] > 0 and np.isfinite(first["distill/top1_agreement"])
  # the overall mean d_t is the token-weighted mean of the per-domain means
  tokens = {d: first[f"distill/{d}/responses"] * first[f"distill/{d}/response_len"] for d in ("add", "sub")}
  weighted = sum(first[f"distill/{d}/reverse_kl"] * n for d, n in tokens.items()) / sum(tokens.values())
  assert first["distill/reverse_kl"] == pytest.approx(weighted, rel=1e-5)
  assert set(straight["prompts"]["dropped"]["mix"]) == {"unrouted_domain", "missing_domain"}


def test_teacher_with_another_tokenizer_is_refused_at_start(workdir, tmp_path):
  cfg = _config(workdir, tmp_path, ["teacher_add", "teacher_other_tok"],
                (("add", "teacher_add"), ("sub", "teacher_other_tok")))
  with pytest.raises(ConfigError, match=r"teachers\[teacher_other_tok\]: its tokenizer"):
    distill.run(cfg)
  assert not (tmp_path / "checkpoints").exists()


def test_config_names_bad_routing():
  teacher = distill.TeacherConfig("t", "/x")
  with pytest.raises(ConfigError, match="routing: domain 'math' names teacher 'nobody'"):
    distill.DistillConfig(output_dir="o", init_from="/s", steps=1, teachers=(teacher,),
                          routing=(("math", "nobody"),), sources=(DataSourceConfig("p.jsonl"),))
  with pytest.raises(ConfigError, match="teachers: .* have no domain routed"):
    distill.DistillConfig(output_dir="o", init_from="/s", steps=1, teachers=(teacher, distill.TeacherConfig("u", "/y")),
                          routing=(("math", "t"),), sources=(DataSourceConfig("p.jsonl"),))


def test_teacher_that_is_the_student_gives_exactly_zero_on_the_first_step(workdir, tmp_path):
  """One teacher, the student's own checkpoint: the teacher pass and the train step see the same rows
  and shapes, so log pi_T = log pi_S bit for bit, every d_t is 0, and so is the policy loss of the
  "advantage" kind (A_t = -d_t)."""
  cfg = _config(workdir, tmp_path, ["student"], (("add", "student"), ("sub", "student")), steps=1,
                loss=DistillLossConfig(kind="advantage", logprob_chunk_size=32, max_segments=8))
  summary = distill.run(cfg)
  row = _rows(tmp_path)[1]
  per_domain = [row[f"distill/{d}/reverse_kl"] for d in ("add", "sub") if f"distill/{d}/reverse_kl" in row]
  assert row["distill/reverse_kl"] == 0.0 and row["loss"] == 0.0 and per_domain and all(v == 0.0 for v in per_domain)
  assert row["policy/pg_loss"] == 0.0
  # the gradient -A_t grad log pi_S vanishes (up to XLA recomputing d_t in the backward pass)
  assert row["grad_norm"] < 1e-5 and summary["optimizer_steps"] == 1
