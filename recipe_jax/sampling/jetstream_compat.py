"""Everything that touches google-jetstream (0.2.2), kept in one module so it can go later.

JetStream is archived upstream. What this module papers over:

* The package may be missing (the GPU machines lack it): `EngineBase` is then
  `object`, and only the JetStream-facing calls raise, naming the package.
* 0.2.2 calls `jax.tree_map`, removed from current JAX; `patch_jax()` puts
  back an alias to `jax.tree.map` before the orchestrator runs.
* Importing its orchestrator sets the root logger to DEBUG and adds a stdout
  handler; `_orchestrator()` undoes that.
* Its default tokenizer is SentencePiece from a file; `TokenIdTokenizer` is
  the id-in, id-out tokenizer our engine serves with (clients send token ids).
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np

try:
  from jetstream.engine import engine_api as _engine_api
  from jetstream.engine import tokenizer_api as _tokenizer_api
  from jetstream.engine import tokenizer_pb2 as _tokenizer_pb2
except ImportError:  # serving is optional; sampling works without it
  _engine_api = _tokenizer_api = _tokenizer_pb2 = None

HAVE_JETSTREAM = _engine_api is not None
EngineBase: type = _engine_api.Engine if HAVE_JETSTREAM else object
_TokenizerBase: type = _tokenizer_api.Tokenizer if HAVE_JETSTREAM else object
TOKENIZER_PATH = "recipe-jax:token-ids"


def require_jetstream(what: str) -> None:
  if not HAVE_JETSTREAM:
    raise ImportError(f"{what} needs the google-jetstream package (0.2.2), which is not installed")


def patch_jax() -> None:
  """Restores `jax.tree_map` (used by JetStream 0.2.2's orchestrator) as an alias of `jax.tree.map`."""
  if not hasattr(jax, "tree_map"):
    jax.tree_map = jax.tree.map


def result_tokens(table: jax.Array) -> Any:
  """JetStream's `ResultTokens` from a `[slots, 3]` table of (token, valid, length) columns."""
  require_jetstream("Engine.generate")
  return _engine_api.ResultTokens(data=table, tokens_idx=(0, 1), valid_idx=(1, 2), length_idx=(2, 3),
                                  samples_per_slot=1)


def tokenizer_parameters() -> Any:
  require_jetstream("Engine.get_tokenizer")
  return _tokenizer_pb2.TokenizerParameters(path=TOKENIZER_PATH)


class TokenIdTokenizer(_TokenizerBase):
  """Token ids in, token ids out: requests must carry token ids (`DecodeRequest.token_content`).

  JetStream prepends `bos_id` to every fresh request's ids; `stop_tokens` end a
  sample in its detokenizer.
  """

  def __init__(self, *, bos_id: int, pad_id: int, stop_token_ids: tuple[int, ...]):
    self._bos_id, self._pad_id, self._stop = bos_id, pad_id, set(stop_token_ids)

  def encode(self, s: str, **kwargs):
    raise ValueError("this server takes token ids, not text: send DecodeRequest.token_content")

  def decode(self, token_ids: list[int], **kwargs) -> str:
    return " ".join(str(t) for t in token_ids)

  def decode_str(self, token_ids: list[int]) -> str:  # older JetStream spelling
    return self.decode(token_ids)

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def eos_id(self) -> int:
    return min(self._stop) if self._stop else -1

  @property
  def bos_id(self) -> int:
    return self._bos_id

  @property
  def stop_tokens(self) -> set[int]:
    return self._stop


def _orchestrator():
  """JetStream's orchestrator module, imported with `jax.tree_map` restored and logging left as it was."""
  patch_jax()
  root = logging.getLogger()
  level, handlers = root.level, list(root.handlers)
  from jetstream.core import orchestrator
  root.setLevel(level)
  for handler in root.handlers[:]:
    if handler not in handlers:
      root.removeHandler(handler)
  return orchestrator


def start_driver(engine, params, *, interleaved: bool = True):
  """A JetStream `Driver` running `engine` for both prefill and generate, threads started."""
  require_jetstream("serving")
  return _orchestrator().Driver(prefill_engines=[engine], generate_engines=[engine],
                             prefill_params=[params], generate_params=[params],
                             interleaved_mode=interleaved)


def run_server(engine, params, *, port: int, threads: int = 32):
  """Starts JetStream's gRPC server (plaintext) over `engine` on `port`; returns it (`.stop()` ends it)."""
  require_jetstream("serving")
  import grpc
  _orchestrator()
  from jetstream.core import server_lib
  server = server_lib.JetStreamServer(start_driver(engine, params), threads, port,
                                      credentials=grpc.insecure_server_credentials())
  server.start()
  return server


def numpy_tokens(padded_tokens) -> np.ndarray:
  return np.asarray(padded_tokens, dtype=np.int32).reshape(-1)
