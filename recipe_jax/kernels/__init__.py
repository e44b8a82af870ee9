"""Pallas attention kernels (TPU and GPU) for training and decoding, with one dispatcher.

* `flash_attention`: causal attention within segments of packed rows, GQA,
  custom VJP: splash attention on TPU (`flash_tpu`), a Triton-lowered Pallas
  kernel on GPU (`flash_gpu`).
* `decode_attention`: one query token per row against a ragged KV cache
  (`decode_tpu`, `decode_gpu`; reference `decode_attention_xla`).
* `choose_attention_kernel` / `choose_decode_kernel`: which one runs and why.

See docs/kernels.md.
"""

from recipe_jax.kernels.dispatch import (IMPLS, KernelChoice, choose_attention_kernel, choose_decode_kernel,
                                         decode_attention, flash_attention, run_flash_attention)
from recipe_jax.kernels.reference import check_attention_shapes, check_decode_shapes, decode_attention_xla

__all__ = [
    "IMPLS", "KernelChoice", "check_attention_shapes", "check_decode_shapes", "choose_attention_kernel",
    "choose_decode_kernel", "decode_attention", "decode_attention_xla", "flash_attention",
    "run_flash_attention",
]
