"""`recipe-jax data <command>`: the curation tools on the command line.

    recipe-jax data decontaminate --train sft.jsonl --eval gsm8k.jsonl ifeval.jsonl --output-dir clean/
    recipe-jax data dedup --input a.jsonl b.jsonl --output out.jsonl [--leakage-eval lcb.jsonl]
    recipe-jax data grade ...   recipe-jax data score ...   recipe-jax data mix ...

Each command lives in its own module with `add_arguments(parser)` and `run_cli(args)`;
a module is imported only when its command is asked for and returns its report(s). Every
report whose `details["output"]` names the output file is written next to it as
`report_path(output)` (`out.jsonl` -> `out.report.json`) and its summary printed. Progress
bars go to stderr (`--no-progress`, added to every command, turns them off). A bad argument
or setting, or an input the tool cannot use (`CurationError`, `ConfigError`), is one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from collections.abc import Sequence

from recipe_jax.config import ConfigError
from recipe_jax.curation.records import CurationError, CurationReport

# command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "decontaminate": ("recipe_jax.curation.decontaminate",
                      "remove training instances overlapping evaluation sets (Tülu 3 word 8-grams)"),
    "dedup": ("recipe_jax.curation.dedup",
              "exact and near-duplicate removal, and a leakage check against evaluation sets"),
    "grade": ("recipe_jax.curation.grade", "grade prompts by difficulty from sampled solve rates"),
    "score": ("recipe_jax.curation.quality", "quality indicators for each record"),
    "mix": ("recipe_jax.curation.mix", "build a data mixture from sources and weights"),
}


class _UsageError(Exception):
  """A command-line mistake; `main` prints it as one line and returns 2."""


class _Parser(argparse.ArgumentParser):
  def error(self, message: str):  # argparse would print the whole usage and exit
    raise _UsageError(f"{self.prog}: error: {message}")


def _load(command: str):
  module_name = COMMANDS[command][0]
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name != module_name:
      raise
    raise _UsageError(f"recipe-jax data {command}: not available (no module {module_name})") from e


def build_parser(commands: Sequence[str] | None = None) -> argparse.ArgumentParser:
  """The `data` parser; the arguments of `commands` (default: all) are filled in from their modules."""
  parser = _Parser(prog="recipe-jax data", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
  for command, (_, help_text) in COMMANDS.items():
    command_parser = sub.add_parser(command, help=help_text, description=help_text)
    if commands is None or command in commands:
      _load(command).add_arguments(command_parser)
      if not any("--no-progress" in a.option_strings for a in command_parser._actions):
        command_parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
  return parser


def report_path(output: str | pathlib.Path) -> pathlib.Path:
  """Where a tool's report goes: the output path with its suffix replaced by `.report.json`."""
  return pathlib.Path(output).with_suffix(".report.json")


def _command_in(argv: Sequence[str]) -> str | None:
  return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  command = _command_in(argv)
  try:
    parser = build_parser([command] if command in COMMANDS else [])
    args = parser.parse_args(argv)
    reports = _load(args.command).run_cli(args)
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0
  except _UsageError as e:
    print(e, file=sys.stderr)
    return 2
  except (CurationError, ConfigError) as e:
    print(f"recipe-jax data {command}: error: {e}", file=sys.stderr)
    return 2
  for report in reports if isinstance(reports, (list, tuple)) else [reports]:
    if isinstance(report, CurationReport):
      if "output" in report.details:
        report.write(report_path(report.details["output"]))
      print(report.summary())
  return 0


if __name__ == "__main__":
  sys.exit(main())
