"""RL step time by phase: generation, reward scoring, log-prob passes, training and weight push, sync vs async.

Each column is one real RL run (`recipe_jax.stages.rl.run`) on a tiny random model: a
byte-level BPE tokenizer and the checkpoints are made in a temporary directory, the prompts
are addition questions, and the per-step timings are read back from the run's
`metrics/metrics.jsonl`. The first `--skip` steps (compilation) are left out of the means.

The verifier is this module (`score` below, named by module path in every prompt record, so
the reward pool's workers import it): reward 1 when the decoded response has an even number
of characters. A random model solves no real task; this gives every group a spread of
rewards, so every step trains, at the cost of a real pool round trip per response.

What each step does: generate `group_size` responses for each of `prompts_per_step` prompts
(no dynamic sampling, no truncation rule, so every step does the same work), score them,
run the log-prob passes (the KL reference pass, kl_coef 0.001; in async mode also the
proximal-policy pass; always the trainer-vs-sampler diagnostic, and with routing replay the
same without replay), one optimizer step, and push the new weights to the engine. Rows are
the stage's default, `max_prompt_len + max_new_tokens` tokens (32 + 16); a sample rarely
shares a row (only two short ones fit), and the row count is rounded up to a power of two, so
the steps after the first reuse the compiled programs. The training token rate counts the
rows' tokens, padding included (the stage's own figure).

In async mode the rollouts a step trains on were generated in a background thread while
the previous step trained, so its "generation" is not on the step's critical path: "rollout
wait" is the time the step actually waited for them (in sync mode, push plus generation plus
scoring), and "step" is the wall time of the whole step. An async run's last step starts no
next generation and pushes no weights, so async runs one step more and leaves it out.

  python -m recipe_jax.bench rl [--presets tiny-dense,tiny-moe] [--steps 4] [--prompts 8] ...
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

from recipe_jax.rewards.score import Score

PRESETS = ("tiny-dense", "tiny-moe")
MODES = ("sync", "async")
VERIFIER = "recipe_jax.bench.rl"
TOKENIZER_VOCAB = 300
MODEL_VOCAB = 320
MAX_PROMPT_LEN = 32

# (row label, metrics.jsonl key, number format)
SPLITS = (
    ("generation s", "time/generate_s", ".3f"),
    ("generation tokens/s", "time/generate_tokens_per_s", ",.0f"),
    ("reward scoring s", "time/score_s", ".3f"),
    ("log-prob passes s", "time/logprob_passes_s", ".3f"),
    ("training s", "time/train_s", ".3f"),
    ("training tokens/s", "time/train_tokens_per_s", ",.0f"),
    ("weight push s", "time/weight_push_s", ".4f"),
    ("rollout wait s", "time/rollout_wait_s", ".3f"),
    ("step s", "time/step_s", ".3f"),
    ("response tokens", "rollout/response_tokens", ".0f"),
)


def score(response: str, reference: str) -> Score:
  """The benchmark's verifier: 1 for an even number of characters, 0 for odd (reference unused)."""
  del reference
  return Score.correct("even_length") if len(response) % 2 == 0 else Score.wrong("odd_length")


def prepare(root: pathlib.Path, presets: tuple[str, ...], *, num_prompts: int, seed: int = 0) -> pathlib.Path:
  """Writes a tokenizer and a random checkpoint per preset under root/<preset>, and the prompts; returns them."""
  from recipe_jax.checkpoint import hf
  from recipe_jax.data.tokenizer import train_tokenizer
  from recipe_jax.demo.addition import make_records
  from recipe_jax.models import get_preset, init_params

  records = make_records(max(num_prompts, 40), digits=2, seed=seed)
  tokenizer = train_tokenizer([json.dumps(r) for r in records], vocab_size=TOKENIZER_VOCAB)
  for name in presets:
    cfg = get_preset(name).replace(vocab_size=MODEL_VOCAB)
    hf.save(root / name, cfg, init_params(cfg, seed=seed))
    tokenizer.save_pretrained(root / name)
  lines = [json.dumps({"messages": [r["messages"][0]], "reward": {"verifier": VERIFIER, "reference": "-"}})
           for r in records[:num_prompts]]
  path = root / "prompts.jsonl"
  path.write_text("\n".join(lines) + "\n")
  return path


def rl_config(root: pathlib.Path, prompts: pathlib.Path, preset: str, mode: str, *, steps: int,
              prompts_per_step: int, group_size: int, max_new_tokens: int, reward_workers: int):
  """The RL run of one column."""
  from recipe_jax.data.prompts import PromptDataConfig
  from recipe_jax.parallel.mesh import MeshConfig
  from recipe_jax.stages.rl import RlConfig
  from recipe_jax.stages.rl_objective import PolicyLossConfig
  from recipe_jax.stages.rollouts import RolloutConfig
  from recipe_jax.stages.sft import DataSourceConfig
  from recipe_jax.training import OptimizerConfig

  if mode not in MODES:
    raise ValueError(f"mode {mode!r} is not one of {MODES}")
  return RlConfig(
      output_dir=str(root / "runs" / f"{preset}_{mode}"), init_from=str(root / preset), steps=steps,
      prompts_per_step=prompts_per_step, sources=(DataSourceConfig(str(prompts), name="bench"),),
      prompts=PromptDataConfig(max_prompt_len=MAX_PROMPT_LEN, read_threads=1),
      rollout=RolloutConfig(group_size=group_size, max_new_tokens=max_new_tokens, dynamic_sampling=False,
                            max_extra_rounds=0, truncation="none", reward_workers=reward_workers),
      loss=PolicyLossConfig(kl_coef=0.001, logprob_chunk_size=64),
      optimizer=OptimizerConfig(learning_rate=1e-4, schedule="constant", total_steps=1000),
      mesh=MeshConfig(fsdp=1), engine_slots=prompts_per_step * group_size,
      async_generation=mode == "async", checkpoint_every=10 * steps, progress=False, export_hf=False)


def step_means(metrics_file: pathlib.Path, *, first: int, last: int) -> dict[str, float]:
  """Mean of every split over steps first..last; raises naming a step that lacks one."""
  rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
  kept = [r for r in rows if first <= r["step"] <= last]
  if len(kept) != last - first + 1:
    raise ValueError(f"{metrics_file}: steps {first}-{last} wanted, found {[r['step'] for r in kept]}")
  out = {}
  for _, key, _ in SPLITS:
    missing = [r["step"] for r in kept if key not in r]
    if missing:
      raise ValueError(f"{metrics_file}: step(s) {missing} have no {key!r} (an empty step?)")
    out[key] = sum(float(r[key]) for r in kept) / len(kept)
  return out


def run(*, presets: tuple[str, ...] = PRESETS, modes: tuple[str, ...] = MODES, steps: int = 4, skip: int = 1,
        prompts_per_step: int = 8, group_size: int = 4, max_new_tokens: int = 16, reward_workers: int = 2,
        workdir: str | pathlib.Path | None = None) -> dict:
  """Runs every preset in every mode; returns `{"header", "columns"}` (columns: preset, mode, means)."""
  import jax

  from recipe_jax.models import get_preset
  from recipe_jax.stages import rl

  if steps <= skip:
    raise ValueError(f"steps ({steps}) must be greater than skip ({skip}) to leave steps to average")
  with tempfile.TemporaryDirectory(prefix="bench_rl_") as tmp:
    root = pathlib.Path(workdir or tmp)
    prompts = prepare(root, presets, num_prompts=prompts_per_step * (steps + 1))
    columns = []
    for preset in presets:
      for mode in modes:
        # async runs one step more, left out: a run's last step starts no generation and pushes nothing
        cfg = rl_config(root, prompts, preset, mode, steps=steps + (mode == "async"),
                        prompts_per_step=prompts_per_step, group_size=group_size, max_new_tokens=max_new_tokens,
                        reward_workers=reward_workers)
        summary = rl.run(cfg)
        if summary["empty_steps"]:
          raise RuntimeError(f"{preset} {mode}: {summary['empty_steps']} step(s) trained nothing")
        means = step_means(pathlib.Path(cfg.output_dir) / "metrics" / "metrics.jsonl", first=skip + 1, last=steps)
        replay = get_preset(preset).num_moe_layers > 0  # the stage's default: routing replay for MoE models
        columns.append({"preset": preset, "mode": mode, "replay": replay, **means})
  device = jax.devices()[0]
  header = {"steps": steps, "skip": skip, "prompts_per_step": prompts_per_step, "group_size": group_size,
            "max_new_tokens": max_new_tokens, "reward_workers": reward_workers,
            "device": f"{device.platform} ({device.device_kind}), one device"}
  return {"header": header, "columns": columns}


def format_report(result: dict) -> str:
  h = result["header"]
  names = [f"{c['preset']} {c['mode']}" + (" (replay)" if c["replay"] else "") for c in result["columns"]]
  lines = [
      f"One RL step by phase: {h['prompts_per_step']} prompts x {h['group_size']} responses of up to "
      f"{h['max_new_tokens']} tokens, {h['reward_workers']} reward workers; mean of steps {h['skip'] + 1}-"
      f"{h['steps']} (step 1 compiles); {h['device']}",
      "",
      "| phase | " + " | ".join(names) + " |",
      "| --- |" + " ---: |" * len(names),
  ]
  for label, key, fmt in SPLITS:
    lines.append(f"| {label} | " + " | ".join(format(c[key], fmt) for c in result["columns"]) + " |")
  return "\n".join(lines)


def command(args: argparse.Namespace) -> str:
  return (f"python -m recipe_jax.bench rl --presets {args.presets} --modes {args.modes} --steps {args.steps} "
          f"--skip {args.skip} --prompts {args.prompts} --group-size {args.group_size} "
          f"--max-new-tokens {args.max_new_tokens} --reward-workers {args.reward_workers}")


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(prog="python -m recipe_jax.bench rl", description=__doc__.splitlines()[0])
  p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated tiny model presets")
  p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of sync,async")
  p.add_argument("--steps", type=int, default=4, help="RL steps per run")
  p.add_argument("--skip", type=int, default=1, help="first steps left out of the means (compilation)")
  p.add_argument("--prompts", type=int, default=8, help="prompts per step")
  p.add_argument("--group-size", type=int, default=4, help="responses per prompt")
  p.add_argument("--max-new-tokens", type=int, default=16)
  p.add_argument("--reward-workers", type=int, default=2)
  a = p.parse_args(argv)
  result = run(presets=tuple(a.presets.split(",")), modes=tuple(a.modes.split(",")), steps=a.steps, skip=a.skip,
               prompts_per_step=a.prompts, group_size=a.group_size, max_new_tokens=a.max_new_tokens,
               reward_workers=a.reward_workers)
  print(format_report(result))
  print(f"\ncommand: {command(a)}")


if __name__ == "__main__":
  main()
