"""JetStream's own orchestrator, run in-process over our engine, gives the driver's greedy tokens."""

import asyncio

import pytest

pytest.importorskip("jetstream")

from jetstream.core.proto import jetstream_pb2  # noqa: E402
from jetstream.engine import engine_api  # noqa: E402

from recipe_jax.sampling import Engine, generate  # noqa: E402
from recipe_jax.sampling import jetstream_compat  # noqa: E402

orchestrator = jetstream_compat._orchestrator()  # JetStream's module, its logging side effects undone

BOS = 1


async def _decode(service, prompt, max_tokens):
  request = jetstream_pb2.DecodeRequest(
      token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=prompt), max_tokens=max_tokens)
  tokens = []
  async for response in service.Decode(request):
    for sample in response.stream_content.samples:
      tokens.extend(sample.token_ids)
  return tokens


def _run_then_stop(service, coroutine):
  """Runs `coroutine`, stops the driver, then closes the loop: JetStream's detokenizer may still
  call into the loop just after a stream ends (a closed loop would kill the process)."""
  loop = asyncio.new_event_loop()
  try:
    return loop.run_until_complete(coroutine)
  finally:
    service._driver.stop()
    loop.close()


def test_orchestrator_matches_driver(tiny_model):
  cfg, params = tiny_model("tiny-moe")
  engine = Engine(cfg, params, slots=2, max_len=24, bos_id=BOS)
  assert isinstance(engine, engine_api.Engine)
  prompts = [[5, 9, 14], [200, 3, 3, 3, 71, 8], [60]]
  want = [c.token_ids for c in generate(engine, [[BOS] + p for p in prompts], max_new_tokens=5,
                                         temperature=0.0)]
  service = orchestrator.LLMOrchestrator(driver=jetstream_compat.start_driver(engine, engine.params))

  async def all_requests():
    return await asyncio.gather(*(_decode(service, p, 5) for p in prompts))

  assert _run_then_stop(service, all_requests()) == want


def test_stop_token_ends_a_jetstream_sample(tiny_model):
  cfg, params = tiny_model("tiny-dense")
  plain = Engine(cfg, params, slots=1, max_len=24, bos_id=BOS)
  want = generate(plain, [[BOS, 4, 5]], max_new_tokens=4, temperature=0.0)[0].token_ids
  engine = Engine(cfg, params, slots=1, max_len=24, bos_id=BOS, stop_token_ids=(want[1],))
  service = orchestrator.LLMOrchestrator(driver=jetstream_compat.start_driver(engine, engine.params))
  got = _run_then_stop(service, _decode(service, [4, 5], 4))
  assert got == want[:want.index(want[1])]   # JetStream drops the stop token itself
