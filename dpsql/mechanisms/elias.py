"""Elias gamma and delta codes for arrays of positive integers, packed into bytes.

Both are prefix codes for the integers ``1, 2, …, 2**64 - 1`` (Elias 1975): with ``L`` the bit
length of ``v``, gamma writes ``L - 1`` zeros and then ``v`` in ``L`` bits (``2L - 1`` bits in all;
1 bit for ``v = 1``); delta writes ``L`` in gamma code and then the ``L - 1`` bits of ``v`` below
its leading one (``L + 2⌊log2 L⌋`` bits). A message is the codewords of a known number of values,
most significant bit first, padded with zero bits to a whole byte. Encoding and decoding run on
whole arrays: decoding finds every codeword boundary at once by pointer doubling over the
"next codeword starts here" map, so there is no Python loop per value.

>>> data = encode([1, 2, 5, 2**64 - 1], code="gamma")
>>> decode(data, 4, code="gamma").tolist()
[1, 2, 5, 18446744073709551615]
>>> int(code_lengths([1, 2, 5], code="gamma").sum()), int(code_lengths([1, 2, 5], code="delta").sum())
(9, 10)
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsql.errors import ParameterError

__all__ = ["Code", "bit_length", "code_lengths", "decode", "encode"]

Code = Literal["gamma", "delta"]
_ONE = np.uint64(1)


def _check_code(code: str) -> None:
    if code not in ("gamma", "delta"):
        raise ParameterError(f"code must be 'gamma' or 'delta', got {code!r}")


def _as_positive(values: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ParameterError(f"values must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if array.dtype == object:
        if any(int(v) < 1 or int(v) >= 2**64 for v in array):
            raise ParameterError("values must be integers in [1, 2**64)")
        return np.array([int(v) for v in array], dtype=np.uint64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ParameterError(f"values must be integers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.signedinteger) and int(array.min()) < 1:
        raise ParameterError("values must be integers in [1, 2**64)")
    unsigned = array.astype(np.uint64)
    if int(unsigned.min()) < 1:
        raise ParameterError("values must be integers in [1, 2**64)")
    return unsigned


def bit_length(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Exact bit length of each unsigned 64-bit value (0 for 0), without float rounding."""
    rest = np.asarray(values, dtype=np.uint64).copy()
    length = np.zeros(rest.shape, dtype=np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        high = rest >> np.uint64(shift)
        moved = high != 0
        rest = np.where(moved, high, rest)
        length += np.where(moved, shift, 0)
    return length + (rest != 0)


def code_lengths(values: npt.ArrayLike, *, code: Code = "gamma") -> npt.NDArray[np.int64]:
    """The length in bits of each value's codeword."""
    _check_code(code)
    length = bit_length(_as_positive(values))
    if code == "gamma":
        return 2 * length - 1
    return length + 2 * bit_length(length.astype(np.uint64)) - 2


def _pack_fields(values: npt.NDArray[np.uint64], widths: npt.NDArray[np.int64]) -> bytes:
    """Write each value in its width (MSB first, widths <= 64), in order; pad to a byte."""
    values = values.ravel()
    widths = widths.ravel()
    total = int(widths.sum())
    bits = np.zeros(-(-total // 8) * 8, dtype=np.uint8)
    if total:
        field = np.repeat(np.arange(widths.size), widths)
        starts = np.cumsum(widths) - widths
        within = np.arange(total) - starts[field]
        shift = (widths[field] - 1 - within).astype(np.uint64)
        bits[:total] = ((values[field] >> shift) & _ONE).astype(np.uint8)
    return np.packbits(bits).tobytes()


def encode(values: npt.ArrayLike, *, code: Code = "gamma") -> bytes:
    """Concatenate the codewords of ``values`` (integers in ``[1, 2**64)``) into padded bytes."""
    _check_code(code)
    array = _as_positive(values)
    length = bit_length(array)
    if code == "gamma":
        fields = np.stack([np.zeros_like(array), array], axis=1)
        widths = np.stack([length - 1, length], axis=1)
    else:
        width_of_length = bit_length(length.astype(np.uint64))
        below_leading = array & ((_ONE << (length - 1).astype(np.uint64)) - _ONE)
        fields = np.stack([np.zeros_like(array), length.astype(np.uint64), below_leading], axis=1)
        widths = np.stack([width_of_length - 1, width_of_length, length - 1], axis=1)
    return _pack_fields(fields, widths)


def _read(bits: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], widths: npt.NDArray[np.int64]):
    """The unsigned integers stored MSB first at ``starts`` with ``widths`` (<= 64) bits."""
    if starts.size == 0:
        return np.zeros(0, dtype=np.uint64)
    span = int(widths.max(initial=0))
    offsets = np.arange(max(span, 1))
    inside = offsets[None, :] < widths[:, None]
    positions = np.where(inside, starts[:, None] + offsets[None, :], 0)
    chosen = np.where(inside, bits[positions], 0).astype(np.uint64)
    shifts = np.where(inside, widths[:, None] - 1 - offsets[None, :], 0).astype(np.uint64)
    return np.bitwise_or.reduce(chosen << shifts, axis=1)


def decode(data: bytes, count: int, *, code: Code = "gamma") -> npt.NDArray[np.uint64]:
    """The ``count`` values encoded in ``data``; raises ParameterError unless ``data`` is exactly
    ``count`` codewords followed by fewer than 8 zero bits."""
    _check_code(code)
    if count < 0:
        raise ParameterError(f"count must be >= 0, got {count}")
    bits = np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))
    size = bits.size
    if count == 0:
        if size:
            raise ParameterError("message: expected no codewords, got extra bytes")
        return np.zeros(0, dtype=np.uint64)
    ones = np.flatnonzero(bits)
    if ones.size == 0:
        raise ParameterError(f"message: not exactly {count} {code} codewords plus zero padding")
    positions = np.arange(size)
    slot = np.searchsorted(ones, positions)
    next_one = np.where(slot < ones.size, ones[np.minimum(slot, ones.size - 1)], size)
    zeros = next_one - positions
    valid = (next_one < size) & (zeros <= (63 if code == "gamma" else 6))
    if code == "gamma":
        follow = positions + 2 * zeros + 1
    else:
        window = np.where(valid, zeros + 1, 1)
        fits = valid & (next_one + window <= size)
        length_field = _read(bits, np.where(fits, next_one, 0), window).astype(np.int64)
        valid = fits & (length_field >= 1) & (length_field <= 64)
        follow = next_one + window + length_field - 1
    sink = size + 1
    jump = np.full(size + 2, sink, dtype=np.int64)
    usable = valid & (follow <= size)
    jump[:size][usable] = follow[usable]
    jump[size] = sink
    starts = np.zeros(1, dtype=np.int64)
    power = jump
    while starts.size < count:
        starts = np.concatenate([starts, power[starts]])
        power = power[power]
    starts = starts[:count]
    end = int(jump[starts[-1]])
    if np.any(starts >= size) or end > size or size - end >= 8 or bits[end:].any():
        raise ParameterError(f"message: not exactly {count} {code} codewords plus zero padding")
    lead = next_one[starts]
    width = lead - starts + 1
    if code == "gamma":
        return _read(bits, lead, width)
    length = _read(bits, lead, width).astype(np.int64)
    low = _read(bits, lead + width, length - 1)
    return (_ONE << (length - 1).astype(np.uint64)) | low
