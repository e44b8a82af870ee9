"""Tokenizers: load a model's own, or train a small local one for tests and demos.

A trained tokenizer is a byte-level BPE with the control tokens and the chat
template of one of our templates (`qwen3` or `glm45`), wrapped in a
`transformers.PreTrainedTokenizerFast`, so the chat-template renderers and
`apply_chat_template` treat it exactly like the real model's.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable

from recipe_jax.data.chat_template import template_text

# Pre-tokenizer split patterns of the two families (single digits for Qwen3, up to 3 for GLM).
SPLIT_PATTERNS = {
    "qwen3": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "glm45": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
}
CONTROL_TOKENS = {
    "qwen3": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
              "</tool_call>", "<tool_response>", "</tool_response>"],
    "glm45": ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
              "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
              "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
}
EOS = {"qwen3": "<|im_end|>", "glm45": "<|user|>"}


def train_tokenizer(texts: Iterable[str], *, template: str = "qwen3", vocab_size: int = 512):
  """A byte-level BPE trained on `texts`, with `template`'s control tokens and chat template."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast

  if template not in CONTROL_TOKENS:
    raise ValueError(f"template {template!r} is not one of {sorted(CONTROL_TOKENS)}")
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(SPLIT_PATTERNS[template]), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS[template],
                                 pad_token="<|endoftext|>")
  fast.add_special_tokens({"additional_special_tokens": [t for t in CONTROL_TOKENS[template]
                                                         if t not in (EOS[template], "<|endoftext|>")]})
  fast.chat_template = template_text(template)
  return fast


def load_tokenizer(path: str | pathlib.Path):
  """A tokenizer saved with `save_pretrained` (a model directory or a trained local one)."""
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(str(path))
