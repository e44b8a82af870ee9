"""recipe_jax.rewards.ifeval: registry, reference parsing and validation, multi-constraint and loose scoring."""

import json
import pathlib

import pytest

from recipe_jax.rewards import Score
from recipe_jax.rewards.ifeval import REGISTRY, instruction_ids, is_ifeval, loose_variants, parse_reference, score

IFEVAL_IDS = {
  "keywords:existence", "keywords:frequency", "keywords:forbidden_words", "keywords:letter_frequency",
  "language:response_language", "length_constraints:number_sentences", "length_constraints:number_paragraphs",
  "length_constraints:number_words", "length_constraints:nth_paragraph_first_word",
  "detectable_content:number_placeholders", "detectable_content:postscript", "detectable_format:number_bullet_lists",
  "detectable_format:constrained_response", "detectable_format:number_highlighted_sections",
  "detectable_format:multiple_sections", "detectable_format:json_format", "detectable_format:title",
  "combination:two_responses", "combination:repeat_prompt", "startend:end_checker",
  "change_case:capital_word_frequency", "change_case:english_capital", "change_case:english_lowercase",
  "punctuation:no_comma", "startend:quotation",
}

def _one(instruction_id, **kwargs):
  return {"instructions": [{"id": instruction_id, "kwargs": kwargs}]}


THREE = {
  "instructions": [
    {"id": "punctuation:no_comma"},
    {"id": "length_constraints:number_words", "kwargs": {"relation": "at least", "num_words": 8}},
    {"id": "startend:end_checker", "kwargs": {"end_phrase": "Is there anything else?"}},
  ]
}


def test_registry_has_exactly_54_types_including_all_of_ifeval():
  assert len(REGISTRY) == 54
  assert IFEVAL_IDS <= set(REGISTRY)
  assert {i for i in instruction_ids() if is_ifeval(i)} == IFEVAL_IDS
  assert all(spec.summary for spec in REGISTRY.values())


def test_docs_list_every_instruction_id():
  docs = (pathlib.Path(__file__).parents[2] / "docs" / "rewards.md").read_text()
  assert [i for i in instruction_ids() if f"`{i}`" not in docs] == []


def test_all_constraints_followed_scores_one():
  result = score("Here are eight plain words for you. Is there anything else?", THREE)
  assert result == Score(1.0, "correct", result.details)
  assert result.details["followed"] == 3 and result.details["total"] == 3
  assert [r["id"] for r in result.details["results"]] == [i["id"] for i in THREE["instructions"]]
  json.dumps(result.details)


def test_one_failing_constraint_scores_zero_and_is_named():
  result = score("Here, a comma and words enough to pass. Is there anything else?", THREE)
  assert result.value == 0.0
  assert result.reason == "instructions_not_followed: punctuation:no_comma"
  assert [r["passed"] for r in result.details["results"]] == [False, True, True]


def test_every_failing_constraint_is_named_in_order():
  result = score("Short, yes.", THREE)
  assert result.reason == (
    "instructions_not_followed: punctuation:no_comma, length_constraints:number_words, startend:end_checker"
  )
  assert result.details["followed"] == 0


def test_dataset_row_shape_with_null_kwargs_and_json_string():
  row = {
    "key": 1, "prompt": "...",
    "instruction_id_list": ["punctuation:no_comma", "keywords:existence"],
    "kwargs": [{"keywords": None, "num_words": None}, {"keywords": ["tea"], "relation": None}],
  }
  assert score("I like tea", row).value == 1.0
  assert score("I like tea", json.dumps(row)).value == 1.0
  assert score("I like coffee", row).reason == "instructions_not_followed: keywords:existence"
  assert parse_reference({"instruction_id_list": ["punctuation:no_comma"]}) == [("punctuation:no_comma", {})]


@pytest.mark.parametrize(
  "reference, message",
  [
    ({"instructions": [{"id": "keywords:nonexistent"}]}, "unknown instruction id 'keywords:nonexistent'"),
    (_one("length_constraints:number_words", relation="at least"),
     "'length_constraints:number_words': missing argument(s) ['num_words']"),
    (_one("punctuation:no_comma", num_words=3),
     "'punctuation:no_comma': unknown argument(s) ['num_words']"),
    (_one("length_constraints:number_words", relation="around", num_words=3),
     "argument 'relation' must be one of ['less than', 'at least']"),
    (_one("length_constraints:number_words", relation="at least", num_words="3"),
     "argument 'num_words' must be a whole number"),
    (_one("length_constraints:number_words", relation="at least", num_words=True),
     "argument 'num_words' must be a whole number"),
    (_one("length_constraints:number_words", relation="at least", num_words=-1),
     "argument 'num_words' must be >= 0"),
    (_one("keywords:existence", keywords="tea"),
     "argument 'keywords' must be a non-empty list of strings"),
    (_one("keywords:letter_frequency", letter="ab", let_frequency=1, let_relation="at least"),
     "argument 'letter': must be a single letter"),
    (_one("language:response_language", language="xx"),
     "argument 'language' must be one of"),
    (_one("count:word_count_range", min_words=9, max_words=3),
     "'count:word_count_range': min_words 9 > max_words 3"),
    ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}, "as long as 'instruction_id_list' (1)"),
    ({"instructions": []}, "reference lists no instructions"),
    ({"instructions": [{"kwargs": {}}]}, "reference instruction 0 must be a dict with an 'id'"),
    ("not json", "reference is a string but not JSON"),
    (["punctuation:no_comma"], "reference must be a dict"),
  ],
)
def test_bad_reference_raises_or_scores_zero(reference, message):
  with pytest.raises(ValueError) as error:
    score("anything", reference)
  assert message in str(error.value)
  lenient = score("anything", reference, strict=False)
  assert lenient.value == 0.0 and lenient.reason.startswith("invalid_reference: ") and message in lenient.reason


def test_non_string_response():
  with pytest.raises(ValueError, match="response must be a string"):
    score(None, THREE)
  assert score(None, THREE, strict=False).reason.startswith("invalid_response: ")


def test_integral_float_arguments_are_accepted():
  reference = _one("length_constraints:number_words", relation="at least", num_words=2.0)
  assert score("two words", reference).value == 1.0


def test_loose_variants_follow_ifeval():
  names = [name for name, _ in loose_variants("Sure!\n**Body**\nBye")]
  assert names == [
    "original", "without_first_line", "without_last_line", "without_first_and_last_line",
    "original_no_asterisks", "without_first_line_no_asterisks", "without_last_line_no_asterisks",
    "without_first_and_last_line_no_asterisks",
  ]
  assert dict(loose_variants("Sure!\n**Body**\nBye"))["without_first_and_last_line_no_asterisks"] == "Body"
  assert [name for name, _ in loose_variants("one line")] == ["original", "original_no_asterisks"]


def test_loose_mode_forgives_a_preamble_line_and_asterisks():
  quoted = {"instructions": [{"id": "startend:quotation"}]}
  response = 'Sure, here it is:\n"The whole answer in quotes"'
  assert score(response, quoted).value == 0.0
  loose = score(response, quoted, loose=True)
  assert loose.value == 1.0 and loose.details["mode"] == "loose"
  assert loose.details["results"][0]["variant"] == "without_first_line"
  ending = _one("startend:end_checker", end_phrase="Any questions?")
  assert score("Done. **Any questions?**", ending).value == 0.0
  loose = score("Done. **Any questions?**", ending, loose=True)
  assert loose.details["results"][0]["variant"] == "original_no_asterisks"


def test_loose_mode_still_fails_when_no_variant_follows():
  reference = {"instructions": [{"id": "punctuation:no_comma"}, {"id": "startend:quotation"}]}
  result = score("Sure,\nno quotes, anywhere\nbye,", reference, loose=True)
  assert result.value == 0.0
  assert result.reason == "instructions_not_followed: punctuation:no_comma, startend:quotation"


def test_loose_is_per_instruction():
  # Each instruction may pass on a different variant: IFEval's loose accuracy.
  reference = {"instructions": [
    {"id": "startend:quotation"},
    {"id": "startend:end_checker", "kwargs": {"end_phrase": "the end."}},
  ]}
  response = '"quoted body"\nthe end.'
  assert score(response, reference).value == 0.0
  result = score(response, reference, loose=True)
  assert result.value == 1.0
  assert [r["variant"] for r in result.details["results"]] == ["without_last_line", "original"]
