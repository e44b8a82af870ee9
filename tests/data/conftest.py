"""Local test tokenizers with the Qwen3 and GLM-4.5 control tokens, and random conversations.

Nothing is downloaded: a small byte-level BPE is trained on generated text
(well under a second), then wrapped twice in a `PreTrainedTokenizerFast`, once
with Qwen3's added tokens and template, once with GLM-4.5's. The two use the
pre-tokenizer split patterns of their models, so boundary effects around
newlines and spaces are like the real ones.
"""

from __future__ import annotations

import functools
import json
import random

import pytest

from recipe_jax.data import Conversation, Message, ToolCall, template_text
from recipe_jax.data.tokenizer import CONTROL_TOKENS, SPLIT_PATTERNS

QWEN_SPLIT, GLM_SPLIT = SPLIT_PATTERNS["qwen3"], SPLIT_PATTERNS["glm45"]
QWEN_CONTROL = CONTROL_TOKENS["qwen3"][:3]
QWEN_TAGS = CONTROL_TOKENS["qwen3"][3:]
GLM_CONTROL = CONTROL_TOKENS["glm45"][:7]
GLM_TAGS = CONTROL_TOKENS["glm45"][7:]

WORDS = ("the a of to and is in it you that answer tool call weather city temperature search result "
         "think step first then so because value key name query error file path line code test "
         "Paris Berlin Tokyo 東京 café naïve ünïcode 🚀 λ x y z foo bar baz").split()


def random_text(rng: random.Random, *, specials: bool = False) -> str:
  """Short text with the whitespace shapes that stress BPE boundaries."""
  r = rng.random()
  if r < 0.06:
    return ""
  if r < 0.12:
    return rng.choice(["\n", "\n\n", " ", "  \n", "\t"])
  parts = []
  for _ in range(rng.randint(1, 12)):
    w = rng.choice(WORDS)
    parts.append(rng.choice(["", "", "", " ", "\n", "\n\n", "  ", ", ", ". ", ":\n"]) + w)
  text = "".join(parts)
  if rng.random() < 0.15:
    text += " " + json.dumps({"k": rng.randint(0, 999), "s": rng.choice(WORDS)})
  if rng.random() < 0.1:
    text += rng.choice([" <", "<tool", " </b>", "<|", " [x]"])
  if specials and rng.random() < 0.05:
    text += rng.choice(["<|im_end|>", "<|user|>", "<tool_call>"])
  return rng.choice(["", "", "\n", " ", "\n\n"]) + text + rng.choice(["", "", "\n", " ", "\n\n"])


def _corpus(n: int = 400) -> list[str]:
  rng = random.Random(0)
  out = [random_text(rng) for _ in range(n)]
  out += [json.dumps({"a": i, "b": [True, None, 1.5], "c": "x y"}, ensure_ascii=False) for i in range(50)]
  out += ["<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n", "\n\n</think>\n\n",
          "<tool_response>\n"] * 20
  return out


@functools.lru_cache(maxsize=None)
def _trained_bpe_json() -> str:
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=1200, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_corpus(), trainer)
  return tok.to_str()


@functools.lru_cache(maxsize=None)
def make_tokenizer(family: str):
  """A `PreTrainedTokenizerFast` with `family`'s ("qwen3" or "glm45") control tokens and template."""
  from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  split, control, tags = {"qwen3": (QWEN_SPLIT, QWEN_CONTROL, QWEN_TAGS),
                          "glm45": (GLM_SPLIT, GLM_CONTROL, GLM_TAGS)}[family]
  tok = Tokenizer.from_str(_trained_bpe_json())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(split), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
  tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in tags])
  eos = "<|im_end|>" if family == "qwen3" else "<|user|>"
  return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token="<|endoftext|>",
                                 chat_template=template_text(family))


@pytest.fixture(scope="session")
def qwen_tok():
  pytest.importorskip("transformers")  # the `hf` extra
  return make_tokenizer("qwen3")


@pytest.fixture(scope="session")
def glm_tok():
  pytest.importorskip("transformers")
  return make_tokenizer("glm45")


# --- random conversations -------------------------------------------------------

def _random_value(rng: random.Random, depth: int = 0):
  kind = rng.randrange(7 if depth < 2 else 5)
  return [lambda: random_text(rng), lambda: rng.randint(-5, 10 ** 6), lambda: round(rng.uniform(-9, 9), 3),
          lambda: rng.choice([True, False]), lambda: None,
          lambda: [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))],
          lambda: {rng.choice(WORDS): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}][kind]()


def _assistant(rng: random.Random, *, calls: int = 0, specials: bool = False) -> Message:
  reasoning = None
  content = random_text(rng, specials=specials)
  r = rng.random()
  if r < 0.35:
    reasoning = random_text(rng, specials=specials)
  elif r < 0.5:
    nl = rng.choice(["", "\n"])
    content = f"<think>{nl}{random_text(rng)}{nl}</think>" + content
  tool_calls = tuple(
      ToolCall(rng.choice(["get_weather", "search", "run_python"]),
               {rng.choice(WORDS) + str(j): _random_value(rng) for j in range(rng.randint(0, 3))},
               id=f"call_{rng.randrange(10 ** 6)}" if rng.random() < 0.5 else None)
      for _ in range(calls))
  if calls and rng.random() < 0.5:
    content = ""
  return Message("assistant", content, reasoning, tool_calls, trainable=rng.random() > 0.1)


def random_conversation(rng: random.Random, *, specials: bool = False) -> Conversation:
  """A well-formed random conversation: system prompt, tools, reasoning, tool calls and results."""
  msgs: list[Message] = []
  if rng.random() < 0.5:
    msgs.append(Message("system", random_text(rng, specials=specials)))
  for _ in range(rng.randint(1, 4)):
    msgs.append(Message("user", random_text(rng, specials=specials)))
    for _ in range(rng.choice([0, 0, 1, 2])):
      n = rng.randint(1, 3)
      msgs.append(_assistant(rng, calls=n, specials=specials))
      msgs.extend(Message("tool", random_text(rng, specials=specials)) for _ in range(rng.randint(1, n)))
    msgs.append(_assistant(rng, specials=specials))
  tools = ()
  if rng.random() < 0.5:
    tools = tuple({"type": "function", "function": {
        "name": name, "description": random_text(rng),
        "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "é"}}}}}
        for name in rng.sample(["get_weather", "search", "run_python"], rng.randint(1, 2)))
  return Conversation(tuple(msgs), tools=tools, source="random", index=0)


@pytest.fixture(scope="session")
def make_conversation():
  """`make_conversation(seed, specials=False) -> Conversation`."""
  return lambda seed, specials=False: random_conversation(random.Random(seed), specials=specials)
