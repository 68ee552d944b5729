"""Quantized communication: a codec encodes a tensor before it crosses the network and decodes it
after. They narrow the pooled embeddings (forward) and their gradients (backward); the sum of a
reduce-scatter is taken after decoding, in float32.

    codec      on the wire, per row of D values                              bytes per row
    fp32       as is                                                         4D
    fp16/bf16  cast (round-to-nearest)                                       2D
    fp8_e4m3   float8_e4m3fn of x/s, s = max|x| / 448; then s as float32      D + 4
    fp8_e5m2   float8_e5m2 of x/s, s = max|x| / 57344; then s as float32      D + 4
    int8       q = round((x - min) / s), s = (max - min) / 255, as uint8;     D + 8
               then s and min as float32 (FBGEMM's fused 8-bit row-wise)

Per value at D = 64: fp32 4 bytes, fp16/bf16 2, fp8 1.0625, int8 1.125.

A row is one sample's block of an exchange: in a table-wise output dist, the pooled vectors of
every table the sending rank owns; in a row-wise one, the partial sums of the group's features.
The scale is per row because a gradient row's values (~1e-5) sit far below what fp8 resolves
unscaled (e4m3's smallest subnormal is 2^-9): one scale for the whole tensor would flush the rows
of small gradients next to large ones. A row of zeros gets s = 1; a constant row decodes exactly
under int8 (s = 1, q = 0, min = the value). Worst error per element, from the formats: e4m3 keeps
3 mantissa bits, |error| <= 2^-4 max|x| of its row; e5m2 keeps 2, <= 2^-3 max|x|; int8 <= s/2 =
(max - min)/510.

Interface: ``encode`` takes rows x (n, D) and returns the wire tensor with the same n leading rows
(the dim that the collectives split on), ``decode(y, dtype)`` returns (n, D) in ``dtype``. The
row codecs' wire is uint8 bytes (n, D + 4 | D + 8), payload then scale (then min), which every
backend sends (gloo has no float8). A flat exchange (1-D, splits counted in values; the
table-wise output dist, whose segment j is rows of its own width) goes through ``encode_flat``,
``wire_splits`` and ``decode_flat``, which take each segment's row width; the element-wise codecs
ignore the rows there.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch

__all__ = ["Codec", "CastCodec", "Fp8Codec", "Int8Codec", "make_codec", "CODECS"]

CODECS = ("fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8")


class Codec:
    """Identity: send as is."""

    name = "fp32"

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def decode(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return y if y.dtype == dtype else y.to(dtype)

    def row_bytes(self, dim: int) -> int:
        """Bytes on the wire for one row of ``dim`` float32 values (the table in the docstring)."""
        return 4 * dim

    def encode_flat(self, x: torch.Tensor, splits: Sequence[int], widths: Sequence[int]) -> torch.Tensor:
        """x (sum splits,): segment j holds splits[j] values in rows of widths[j] -> wire (1-D)."""
        return self.encode(x)

    def wire_splits(self, splits: Sequence[int], widths: Sequence[int]) -> list[int]:
        """Wire elements of each segment of a flat x (see ``encode_flat``)."""
        return list(splits)

    def decode_flat(self, y: torch.Tensor, splits: Sequence[int], widths: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Inverse of ``encode_flat``: wire (sum wire_splits,) -> (sum splits,) in ``dtype``."""
        return self.decode(y, dtype)


class CastCodec(Codec):
    """Round to a narrower float type (round-to-nearest) on the wire."""

    def __init__(self, wire: torch.dtype, name: str) -> None:
        self.wire, self.name = wire, name

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.wire)

    def row_bytes(self, dim: int) -> int:
        return self.wire.itemsize * dim


class _RowCodec(Codec):
    """A row-scaled codec: each row of D values becomes D payload bytes and ``extra`` bytes of
    float32 scale (and bias) after them."""

    extra: int

    def pack_into(self, x: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """x (n, D) float32 -> its payload written into ``payload`` ((n, D) uint8, a view of the
        wire); returns params (n, extra // 4) float32."""
        raise NotImplementedError

    def unpack(self, payload: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        """Inverse of ``pack_into``: (n, D) float32."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        n, D = x.shape
        out = torch.empty(n, D + self.extra, dtype=torch.uint8, device=x.device)  # (n, D + extra)
        # the payload quantized straight into the wire, the params after it: no cat of two copies
        out[:, D:].copy_(self.pack_into(x, out[:, :D]).view(torch.uint8))
        return out

    def decode(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        D = y.shape[1] - self.extra
        params = y[:, D:].clone(memory_format=torch.contiguous_format)  # at offset 0: viewable as float32
        return self.unpack(y[:, :D], params.view(torch.float32)).to(dtype)

    def row_bytes(self, dim: int) -> int:
        return dim + self.extra

    def wire_splits(self, splits: Sequence[int], widths: Sequence[int]) -> list[int]:
        return [n // w * (w + self.extra) if n else 0 for n, w in zip(splits, widths)]

    def encode_flat(self, x: torch.Tensor, splits: Sequence[int], widths: Sequence[int]) -> torch.Tensor:
        w = _one_width(splits, widths)
        if w is not None:  # every segment has the same rows (the sender's side of a table-wise dist)
            return self.encode(x.view(-1, w)).view(-1)
        parts = [self.encode(s.view(-1, w)).view(-1) for s, w in zip(x.split(list(splits)), widths) if s.numel()]
        return torch.cat(parts)

    def decode_flat(self, y: torch.Tensor, splits: Sequence[int], widths: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        w = _one_width(splits, widths)
        if w is not None:
            return self.decode(y.view(-1, w + self.extra), dtype).view(-1)
        parts = zip(y.split(self.wire_splits(splits, widths)), widths)
        return torch.cat([self.decode(s.view(-1, w + self.extra), dtype).view(-1) for s, w in parts if s.numel()])


def _one_width(splits: Sequence[int], widths: Sequence[int]) -> int | None:
    """The row width shared by every non-empty segment (1 when all are empty), else None."""
    ws = {w for n, w in zip(splits, widths) if n}
    return (ws.pop() if ws else 1) if len(ws) <= 1 else None


def _row_extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of each row of x (n, D), as (n, 1); 0 for rows of no values (D = 0). Two
    reductions, not ``torch.aminmax``: on a CPU its row reduction is ~6x slower than amin and
    amax together (32k rows of 128: 7.0 vs 1.2 ms)."""
    if x.shape[1] == 0:
        z = x.new_zeros(x.shape[0], 1)
        return z, z
    return x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)


@functools.lru_cache(maxsize=1)
def _e4m3_values() -> torch.Tensor:
    """The 256 float8_e4m3fn values as float32 (CPU), by torch's own conversion."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


def _fp8_to_float(payload: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """uint8 bytes of float8 ``fmt`` -> float32. On a CPU, e4m3's conversion is slow (32k x 128:
    18 ms); a lookup in its 256 values, built by the same conversion, gives the same bits in ~4
    ms. e5m2 (a truncated float16) and GPUs convert directly."""
    if payload.device.type != "cpu" or fmt != torch.float8_e4m3fn:
        return payload.view(fmt).float()
    flat = payload.reshape(-1).to(torch.int32)  # index_select takes int32 indices; int64 would cost 8x the bytes
    return _e4m3_values().index_select(0, flat).view(payload.shape)


class Fp8Codec(_RowCodec):
    """Row-scaled float8: x / s rounded to nearest, s = max|x| over the format's largest finite
    value, so every row uses the format's whole range."""

    extra = 4

    def __init__(self, fmt: torch.dtype, name: str) -> None:
        self.fmt, self.name = fmt, name
        self.fmax = torch.finfo(fmt).max

    def pack_into(self, x: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        lo, hi = _row_extremes(x)
        s = torch.maximum(-lo, hi) / self.fmax
        s = torch.where(s > 0, s, torch.ones_like(s))
        # the clamp: the scale of a row of float32 subnormals is itself rounded, and x / s may pass
        # the largest finite value (e5m2 would make it inf)
        payload.view(self.fmt).copy_(torch.div(x, s).clamp_(-self.fmax, self.fmax))  # rounds to nearest
        return s

    def unpack(self, payload: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        return _fp8_to_float(payload, self.fmt).mul_(params)


class Int8Codec(_RowCodec):
    """Row-wise affine 8-bit: q = round((x - min) / s) in [0, 255], s = (max - min) / 255."""

    extra = 8
    name = "int8"

    def pack_into(self, x: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        lo, hi = _row_extremes(x)
        s = (hi - lo) / 255
        s = torch.where(s > 0, s, torch.ones_like(s))
        payload.copy_(torch.sub(x, lo).div_(s).round_().clamp_(0, 255))  # whole numbers in [0, 255]
        return torch.cat([s, lo], dim=1)

    def unpack(self, payload: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        return payload.float().mul_(params[:, :1]).add_(params[:, 1:])


def make_codec(name: str | None) -> Codec:
    if name in (None, "", "fp32"):
        return Codec()
    if name == "fp16":
        return CastCodec(torch.float16, "fp16")
    if name == "bf16":
        return CastCodec(torch.bfloat16, "bf16")
    if name == "fp8_e4m3":
        return Fp8Codec(torch.float8_e4m3fn, "fp8_e4m3")
    if name == "fp8_e5m2":
        return Fp8Codec(torch.float8_e5m2, "fp8_e5m2")
    if name == "int8":
        return Int8Codec()
    raise ValueError(f"unknown communication codec {name!r} (known: {', '.join(CODECS)})")
