"""Every instruction type against hand-written responses: at least one that follows it and one that does not."""

import pytest

from recipe_jax.rewards.ifeval import REGISTRY, check_instruction
from recipe_jax.rewards.ifeval.registry import validate_kwargs


def _csv(rows: int) -> str:
  lines = ["ID,Country,City,Year,Count"] + [f"{i},France,Paris,{2000 + i},{i * 10}" for i in range(1, rows + 1)]
  return "\n".join(lines)


SECTIONS = {"section_spliter": "Section", "num_sections": 2}
CAPS_AT_LEAST_2 = {"capital_frequency": 2, "capital_relation": "at least"}
CAPS_LESS_THAN_2 = {"capital_frequency": 2, "capital_relation": "less than"}
SENTENCES_AT_LEAST_2 = {"num_sentences": 2, "relation": "at least"}

# (instruction id, kwargs, response, expected verdict)
CASES = [
  # --- IFEval ---
  ("keywords:existence", {"keywords": ["apple", "banana"]}, "I like Apple and banana.", True),
  ("keywords:existence", {"keywords": ["apple", "banana"]}, "I like apple only.", False),
  ("keywords:frequency", {"keyword": "cat", "frequency": 3, "relation": "at least"}, "cat cat Cat", True),
  ("keywords:frequency", {"keyword": "cat", "frequency": 3, "relation": "at least"}, "cat cat", False),
  ("keywords:frequency", {"keyword": "dog", "frequency": 2, "relation": "less than"}, "one dog", True),
  ("keywords:frequency", {"keyword": "dog", "frequency": 2, "relation": "less than"}, "dog and dog", False),
  ("keywords:forbidden_words", {"forbidden_words": ["bad", "ugly"]}, "A badge is fine.", True),
  ("keywords:forbidden_words", {"forbidden_words": ["bad", "ugly"]}, "That is Bad.", False),
  ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zebra zone", True),
  ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "Zebra only", False),
  ("keywords:letter_frequency", {"letter": "Z", "let_frequency": 2, "let_relation": "less than"}, "Zebra only", True),
  ("language:response_language", {"language": "fr"}, "Le chat est dans la maison et il ne veut pas sortir.", True),
  ("language:response_language", {"language": "fr"}, "The cat is in the house and does not want to leave.", False),
  ("language:response_language", {"language": "ja"}, "犬は家にいて、外に出たくないです。", True),
  ("language:response_language", {"language": "zh"}, "犬は家にいて、外に出たくないです。", False),
  ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two.", True),
  ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One. Two. Three.", False),
  ("length_constraints:number_sentences", SENTENCES_AT_LEAST_2, "Dr. Who came. He left.", True),
  ("length_constraints:number_sentences", SENTENCES_AT_LEAST_2, "Dr. Who came at 3.30 p.m. today.", False),
  ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First para.\n***\nSecond para.", True),
  ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\n***\nSecond.", False),
  ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "Only one paragraph.", False),
  ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five", True),
  ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four", False),
  ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
   "Intro text.\n\n\"However, we go.\"", True),
  ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
   "Intro text.\n\nBut we go.", False),
  ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "however"},
   "Intro.\n\nHowever, one.\n\nHowever, two.", False),
  ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].", True),
  ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name].", False),
  ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. Bye", True),
  ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi. PS bye", False),
  ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\np. p. s. see you", True),
  ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Intro\n* a\n* b\n**bold** line", True),
  ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* a\n* b\n- c", False),
  ("detectable_format:constrained_response", {}, "My answer is yes.", True),
  ("detectable_format:constrained_response", {}, "Yes.", False),
  ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", True),
  ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and ** **", False),
  ("detectable_format:multiple_sections", SECTIONS, "Section 1\nA\nSection 2\nB", True),
  ("detectable_format:multiple_sections", SECTIONS, "Section 1\nA\nsection 2", False),
  ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', True),
  ("detectable_format:json_format", {}, "{a: 1}", False),
  ("detectable_format:title", {}, "<<My Title>>\nText", True),
  ("detectable_format:title", {}, "<< >> My Title", False),
  ("combination:two_responses", {}, "Answer A\n******\nAnswer B", True),
  ("combination:two_responses", {}, "Answer A\n******\nAnswer A", False),
  ("combination:two_responses", {}, "A\n******\n\n******\nB", False),
  ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem."}, "write a poem. Roses are red.", True),
  ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem."}, "Sure: Write a poem.", False),
  ("startend:end_checker", {"end_phrase": "Any other questions?"}, '"Done. Any other questions?"', True),
  ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Any other questions? Bye.", False),
  ("startend:quotation", {}, ' "all of it" ', True),
  ("startend:quotation", {}, 'all of it"', False),
  ("change_case:capital_word_frequency", CAPS_AT_LEAST_2, "NASA and ESA", True),
  ("change_case:capital_word_frequency", CAPS_AT_LEAST_2, "NASA and Esa", False),
  ("change_case:capital_word_frequency", CAPS_LESS_THAN_2, "NASA and Esa", True),
  ("change_case:english_capital", {}, "THIS IS THE ANSWER IN ENGLISH.", True),
  ("change_case:english_capital", {}, "This is the answer in English.", False),
  ("change_case:english_capital", {}, "ESTO ES UNA RESPUESTA EN ESPAÑOL PARA TODOS.", False),
  ("change_case:english_lowercase", {}, "this is the answer in english.", True),
  ("change_case:english_lowercase", {}, "This is the answer.", False),
  ("punctuation:no_comma", {}, "No commas here.", True),
  ("punctuation:no_comma", {}, "Yes, one comma.", False),
  # --- open multi-constraint sets (IFBench) ---
  ("count:word_count_range", {"min_words": 3, "max_words": 5}, "one two three four", True),
  ("count:word_count_range", {"min_words": 3, "max_words": 5}, "one two", False),
  ("count:word_count_range", {"min_words": 3, "max_words": 5}, "one two three four five six", False),
  ("count:unique_word_count", {"N": 3}, "a b c", True),
  ("count:unique_word_count", {"N": 3}, "a a A b", False),
  ("count:numbers", {"N": 2}, "I have 3.5 apples and 1,000 pears.", True),
  ("count:numbers", {"N": 2}, "1 2 3", False),
  ("ratio:stop_words", {"percentage": 50}, "Quick brown foxes jump over lazy dogs.", True),
  ("ratio:stop_words", {"percentage": 50}, "It is the one that was in the box.", False),
  ("ratio:sentence_type", {}, "I eat. You sleep. Why?", True),
  ("ratio:sentence_type", {}, "I eat. Why?", False),
  ("ratio:sentence_type", {}, "", False),
  ("words:alphabet", {}, "Apples bake cakes daily.", True),
  ("words:alphabet", {}, "Young zebras always bounce.", True),
  ("words:alphabet", {}, "Apples cake.", False),
  ("words:vowel", {}, "A cat and a rat ran at last.", True),
  ("words:vowel", {}, "Audio is unique.", False),
  ("words:vowel", {}, "cat\nrat", False),
  ("words:consonants", {}, "Strong brave clowns.", True),
  ("words:consonants", {}, "Strong idea.", False),
  ("words:palindrome", {}, "level radar civic rotor kayak madam refer stats tenet solos", True),
  ("words:palindrome", {}, "level radar civic rotor kayak madam refer stats tenet level", False),
  ("words:last_first", {}, "I like cats. Cats like milk.", True),
  ("words:last_first", {}, "I like cats. Dogs like milk.", False),
  ("words:last_first", {}, "Just one sentence.", False),
  ("words:paragraph_last_first", {}, "Home is where I go home.\nLove makes love.", True),
  ("words:paragraph_last_first", {}, "Home is where I go home.\nLove is here.", False),
  ("words:odd_even_syllables", {}, "cat table dog paper", True),
  ("words:odd_even_syllables", {}, "cat dog", False),
  ("words:no_consecutive", {}, "alpha beta cat", True),
  ("words:no_consecutive", {}, "alpha Apple", False),
  ("words:start_verb", {}, "Imagine a world without war.", True),
  ("words:start_verb", {}, "Running is fun.", True),
  ("words:start_verb", {}, "The cat runs.", False),
  ("words:repeats", {"small_n": 2}, "a b a b", True),
  ("words:repeats", {"small_n": 2}, "a A a", False),
  ("sentence:alliteration_increment", {}, "Dogs dig. Big brown bears bounce.", True),
  ("sentence:alliteration_increment", {}, "Big brown bears bounce. Dogs dig.", False),
  ("sentence:increment", {"small_n": 1}, "Go. Go now. Go right now.", True),
  ("sentence:increment", {"small_n": 1}, "Go. Go right now.", False),
  ("sentence:keyword", {"word": "zebra", "N": 2}, "First one. A Zebra ran.", True),
  ("sentence:keyword", {"word": "zebra", "N": 2}, "A zebra ran. Then zebras came.", False),
  ("format:options", {"options": "yes/no/maybe"}, "Yes.", True),
  ("format:options", {"options": "yes/no/maybe"}, "Yes, because it rains.", False),
  ("format:options", {"options": "I know or I don't know"}, "I don't know", True),
  ("format:options", {"options": "a), b), c), d)"}, "b)", True),
  ("format:options", {"options": "a), b), c), d)"}, "B", False),
  ("format:newline", {}, "one\ntwo\n\nthree.", True),
  ("format:newline", {}, "one two\nthree", False),
  ("format:emoji", {}, "Hello 🙂. Bye 🚀!", True),
  ("format:emoji", {}, "Done. 🎉 Next one 👍", True),
  ("format:emoji", {}, "Hello 🙂. Bye!", False),
  ("format:line_indent", {}, "a\n  b\n    c", True),
  ("format:line_indent", {}, "a\n  b\n  c", False),
  ("format:quote_unquote", {}, 'He said "hello" to greet us.', True),
  ("format:quote_unquote", {}, 'He said "hello"', False),
  ("format:quote_unquote", {}, "No quotes at all.", False),
  ("format:list", {"sep": "SEPARATOR"}, "SEPARATOR one\nSEPARATOR two", True),
  ("format:list", {"sep": "SEPARATOR"}, "SEPARATOR one\n- two", False),
  ("format:sub-bullets", {}, "* a\n  - a1\n* b\n  - b1", True),
  ("format:sub-bullets", {}, "* a\n  - a1\n* b", False),
  ("format:no_bullets_bullets", {}, "First point. Second point.\n* a\n* b", True),
  ("format:no_bullets_bullets", {}, "Only one.\n* a\n* b", False),
  ("format:no_bullets_bullets", {}, "First. Second.\n* a\n* b\nTrailing text.", False),
  ("format:parentheses", {}, "(a [b {c (d [e])}])", True),
  ("format:parentheses", {}, "((((x))))", False),
  ("format:parentheses", {}, "(((((x", False),
  ("format:quotes", {}, "\"a 'b \"c\" b' a\"", True),
  ("format:quotes", {}, "\"I don't 'know' it\"", False),
  ("custom:csv_city", {}, _csv(7), True),
  ("custom:csv_city", {}, "```csv\n" + _csv(7) + "\n```", True),
  ("custom:csv_city", {}, _csv(6), False),
]


@pytest.mark.parametrize(
  "instruction_id, kwargs, response, expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_checker_verdict(instruction_id, kwargs, response, expected):
  result = check_instruction(response, instruction_id, validate_kwargs(instruction_id, kwargs))
  assert result["passed"] is expected, result["note"]
  assert isinstance(result["note"], str) and result["note"]


def test_every_instruction_has_a_passing_and_a_failing_case():
  verdicts = {instruction_id: set() for instruction_id in REGISTRY}
  for instruction_id, _, _, expected in CASES:
    verdicts[instruction_id].add(expected)
  uncovered = sorted(i for i, seen in verdicts.items() if seen != {True, False})
  assert not uncovered
