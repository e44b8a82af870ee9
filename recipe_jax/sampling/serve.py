"""`recipe-jax serve`: JetStream's orchestrator and gRPC server over our `Engine`.

Clients send token ids (`DecodeRequest.token_content`) and receive token ids;
JetStream prepends `bos_id` to each request. Serving needs google-jetstream.
"""

from __future__ import annotations

import dataclasses
import logging

from recipe_jax.config import require
from recipe_jax.models.config import ModelConfig
from recipe_jax.parallel.mesh import MeshConfig
from recipe_jax.sampling import jetstream_compat
from recipe_jax.sampling.engine import Engine
from recipe_jax.sampling.sampler import SamplingParams

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  """A model served over gRPC.

  hf_checkpoint: a Hugging Face checkpoint directory (its config.json then
    defines the model); empty: `model` with fresh weights from `seed` (a demo).
  slots, max_len: decode slots and cache positions per slot.
  temperature, top_k, top_p: sampling for every request (0 = greedy).
  """

  model: ModelConfig
  hf_checkpoint: str = ""
  mesh: MeshConfig = MeshConfig(fsdp=1)
  slots: int = 8
  max_len: int = 256
  port: int = 9000
  threads: int = 32
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  stop_token_ids: tuple[int, ...] = ()
  bos_id: int = 0
  pad_id: int = 0

  def __post_init__(self):
    require(self.slots >= 1, "slots", f"must be >= 1, got {self.slots}")
    require(self.max_len >= 17, "max_len", f"JetStream pads prompts to at least 16 tokens; got {self.max_len}")
    require(0 < self.port < 65536, "port", f"must be a TCP port, got {self.port}")
    SamplingParams(self.temperature, self.top_k, self.top_p)


def build_engine(cfg: ServeConfig) -> Engine:
  """Loads (or creates) the weights on the configured mesh and wraps them in an `Engine`."""
  import jax

  from recipe_jax.models import init_params
  from recipe_jax.parallel.mesh import make_mesh

  mesh = make_mesh(cfg.mesh, jax.devices())
  mesh = None if mesh.size == 1 else mesh
  if cfg.hf_checkpoint:
    from recipe_jax.checkpoint import hf
    model, params = hf.load(cfg.hf_checkpoint, mesh, scan_layers=cfg.model.scan_layers)
  else:
    log.warning("no hf_checkpoint: serving %s with random weights (seed %d)", cfg.model.family, cfg.seed)
    model, params = cfg.model, init_params(cfg.model, mesh=mesh, seed=cfg.seed)
  return Engine(model, params, slots=cfg.slots, max_len=cfg.max_len, mesh=mesh,
                sampling=SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p), seed=cfg.seed,
                stop_token_ids=cfg.stop_token_ids, bos_id=cfg.bos_id, pad_id=cfg.pad_id)


def run(cfg: ServeConfig, *, block: bool = True):
  """Starts the server; with `block` waits until it terminates, else returns it (`.stop()`)."""
  engine = build_engine(cfg)
  server = jetstream_compat.run_server(engine, engine.params, port=cfg.port, threads=cfg.threads)
  log.info("JetStream server on port %d: %d slots x %d positions", cfg.port, cfg.slots, cfg.max_len)
  if block:
    server.wait_for_termination()
  return server
