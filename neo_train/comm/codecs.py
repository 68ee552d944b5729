"""Quantized communication: a codec encodes a tensor before it crosses the network and decodes it
after. fp16 and bf16 halve the bytes of pooled embeddings (forward) and their gradients
(backward); the sum of a reduce-scatter is taken after decoding, in float32.
"""
from __future__ import annotations

import torch

__all__ = ["Codec", "CastCodec", "make_codec", "CODECS"]

CODECS = ("fp32", "fp16", "bf16")


class Codec:
    """Identity: send as is."""

    name = "fp32"

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def decode(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return y if y.dtype == dtype else y.to(dtype)


class CastCodec(Codec):
    """Round to a narrower float type (round-to-nearest) on the wire."""

    def __init__(self, wire: torch.dtype, name: str) -> None:
        self.wire, self.name = wire, name

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.wire)


def make_codec(name: str | None) -> Codec:
    if name in (None, "", "fp32"):
        return Codec()
    if name == "fp16":
        return CastCodec(torch.float16, "fp16")
    if name == "bf16":
        return CastCodec(torch.bfloat16, "bf16")
    raise ValueError(f"unknown communication codec {name!r} (known: {', '.join(CODECS)})")
