"""`recipe-jax serve`: a real gRPC round trip to JetStream's server over our engine."""

import socket

import pytest

pytest.importorskip("jetstream")

import grpc  # noqa: E402
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402

from recipe_jax.cli import build_parser  # noqa: E402
from recipe_jax.config import ConfigError, override  # noqa: E402
from recipe_jax.models import get_preset  # noqa: E402
from recipe_jax.sampling import generate, serve  # noqa: E402


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_grpc_round_trip_matches_driver():
  cfg = serve.ServeConfig(model=get_preset("tiny-dense"), slots=2, max_len=32, port=_free_port(), bos_id=1)
  server = serve.run(cfg, block=False)
  try:
    with grpc.insecure_channel(f"localhost:{cfg.port}") as channel:
      stub = jetstream_pb2_grpc.OrchestratorStub(channel)
      request = jetstream_pb2.DecodeRequest(
          token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=[7, 8, 9]), max_tokens=4)
      got = [t for r in stub.Decode(request, timeout=300) for s in r.stream_content.samples for t in s.token_ids]
    engine = serve.build_engine(cfg)
    assert got == generate(engine, [[1, 7, 8, 9]], max_new_tokens=4, temperature=0.0)[0].token_ids
  finally:
    server.stop()


def test_serve_config_errors_and_parser():
  with pytest.raises(ConfigError, match="max_len"):
    serve.ServeConfig(model=get_preset("tiny-dense"), max_len=8)
  with pytest.raises(ValueError, match="top_p"):
    override(serve.ServeConfig(model=get_preset("tiny-dense")), ["top_p=2.0"])
  args = build_parser().parse_args(["serve", "--set", "port=9001"])
  assert args.fn.__name__ == "cmd_serve" and args.set == ["port=9001"]
