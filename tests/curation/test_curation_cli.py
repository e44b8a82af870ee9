"""`recipe-jax data ...` runs the tools end to end in-process; mistakes are one line and exit 2."""

import json
import types

from recipe_jax.curation import cli
from recipe_jax.curation.records import CurationReport


def write(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
  return path


def words(prefix, n):
  return " ".join(f"{prefix}{i}" for i in range(n))


def test_decontaminate_end_to_end(tmp_path, capsys):
  write(tmp_path / "gsm.jsonl", [{"question": words("g", 20)}, {"question": words("h", 20)}])
  write(tmp_path / "sft.jsonl", [
      {"messages": [{"role": "user", "content": "Solve: " + words("g", 15)}, {"role": "assistant", "content": "4"}]},
      {"messages": [{"role": "user", "content": words("g", 10)}, {"role": "assistant", "content": "no"}]},
      "broken"])
  code = cli.main(["decontaminate", "--train", str(tmp_path / "sft.jsonl"), "--eval", str(tmp_path / "gsm.jsonl"),
                   "--eval-field", "question", "--output-dir", str(tmp_path / "out"), "--no-progress"])
  out, err = capsys.readouterr()
  assert code == 0 and err == ""
  assert "| " + str(tmp_path / "sft.jsonl") + " | gsm | 1 | 2 | 50.00% | yes | 1 |" in out
  assert "decontaminate: read 3, kept 1; removed overlaps:gsm 1; malformed invalid_json 1" in out
  kept = [json.loads(x) for x in (tmp_path / "out" / "sft.jsonl").read_text().splitlines()]
  assert kept[0]["messages"][1]["content"] == "no"
  report = json.loads((tmp_path / "out" / "sft.report.json").read_text())
  assert report["eval_sets"]["gsm"]["pairs"] == [[1, 1]] and report["examples"]["invalid_json"][0][1] == 3


def test_dedup_end_to_end_with_leakage(tmp_path, capsys):
  statement = "Read n numbers and print the sum of the squares of the even ones. " + words("x", 30)
  write(tmp_path / "lcb.jsonl", [{"prompt": statement}])
  write(tmp_path / "a.jsonl", [{"prompt": words("p", 50)}, {"prompt": statement.lower()}])
  write(tmp_path / "b.jsonl", [{"prompt": words("P", 50) + " "}, {"prompt": words("p", 49) + " q"},
                               {"prompt": words("r", 50)}])
  code = cli.main(["dedup", "--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
                   "--output", str(tmp_path / "out.jsonl"), "--leakage-eval", str(tmp_path / "lcb.jsonl"),
                   "--no-progress"])
  out, err = capsys.readouterr()
  assert code == 0 and err == ""
  assert out.strip() == ("dedup: read 5, kept 2; removed exact_duplicate 1, leak_prefix:lcb 1, near_duplicate 1")
  assert [json.loads(x)["prompt"] for x in (tmp_path / "out.jsonl").read_text().splitlines()] == \
      [words("p", 50), words("r", 50)]
  report = json.loads((tmp_path / "out.report.json").read_text())
  assert report["near"]["bands"] == 12 and report["leakage_eval_sets"]["lcb"]["instances"] == 1
  assert cli.main(["dedup", "--input", str(tmp_path / "b.jsonl"), "--output", str(tmp_path / "exact.jsonl"),
                   "--no-near", "--no-progress"]) == 0
  assert "kept 3" in capsys.readouterr().out


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
  cases = [
      ["dedup", "--input", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o.jsonl")],
      ["dedup", "--output", str(tmp_path / "o.jsonl")],                    # --input missing
      ["dedup", "--input", "x.jsonl", "--output", "o.jsonl", "--ngram", "five"],
      ["decontaminate", "--train", "t.jsonl"],
      ["no-such-command"],
      [],
  ]
  for argv in cases:
    assert cli.main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err, (argv, err)
  (tmp_path / "empty.jsonl").write_text("")
  assert cli.main(["dedup", "--input", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "o.jsonl")]) == 2
  err = capsys.readouterr().err   # the progress bar (on by default), then the error
  assert "empty.jsonl: 0.00B" in err
  assert err.splitlines()[-1] == f"recipe-jax data dedup: error: {tmp_path / 'empty.jsonl'}: the file is empty"


def test_help_lists_every_command_without_importing_them(capsys):
  assert cli.main(["--help"]) == 0
  out = capsys.readouterr().out
  assert all(command in out for command in ("decontaminate", "dedup", "grade", "score", "mix"))


def test_dispatch_to_another_module_writes_its_report(tmp_path, monkeypatch, capsys):
  fake = types.ModuleType("fake_curation_tool")

  def add_arguments(parser):
    parser.add_argument("--output", required=True)

  def run_cli(args):
    assert args.no_progress is True
    report = CurationReport("fake", inputs=["in.jsonl"])
    report.read = report.kept = 3
    report.details["output"] = args.output
    return [report]

  fake.add_arguments, fake.run_cli = add_arguments, run_cli
  monkeypatch.setitem(__import__("sys").modules, "fake_curation_tool", fake)
  monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_curation_tool", "a fake tool"))
  monkeypatch.setitem(cli.COMMANDS, "gone", ("recipe_jax.curation.not_written_yet", "missing"))
  assert cli.main(["fake", "--output", str(tmp_path / "x.jsonl"), "--no-progress"]) == 0
  assert capsys.readouterr().out == "fake: read 3, kept 3\n"
  assert json.loads((tmp_path / "x.report.json").read_text())["kept"] == 3
  assert cli.main(["gone"]) == 2
  assert "not available" in capsys.readouterr().err
