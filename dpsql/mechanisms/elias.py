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
>>> code_lengths([1, 2, 5], code="gamma").tolist(), code_lengths([1, 2, 5], code="delta").tolist()
([1, 3, 5], [1, 4, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpsql.errors import ParameterError

__all__ = [
    "Code",
    "bit_length",
    "code_lengths",
    "decode",
    "decode_many",
    "encode",
    "encode_rows",
]

Code = Literal["gamma", "delta"]
_ONE = np.uint64(1)


def _check_code(code: str) -> None:
    if code not in ("gamma", "delta"):
        raise ParameterError(f"code must be 'gamma' or 'delta', got {code!r}")


def _as_positive(values: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Validated unsigned 64-bit copy of a 1-D collection of integers in ``[1, 2**64)``."""
    if not isinstance(values, np.ndarray) or values.dtype == object:
        items = list(values)  # type: ignore[call-overload]
        if not all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items):
            raise ParameterError("values must be integers in [1, 2**64)")
        if any(int(v) < 1 or int(v) >= 2**64 for v in items):
            raise ParameterError("values must be integers in [1, 2**64)")
        return np.array([int(v) for v in items], dtype=np.uint64)
    if values.ndim != 1:
        raise ParameterError(f"values must be one-dimensional, got shape {values.shape}")
    if values.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if not np.issubdtype(values.dtype, np.integer) or int(values.min()) < 1:
        raise ParameterError("values must be integers in [1, 2**64)")
    return values.astype(np.uint64)


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


def _fields(
    array: npt.NDArray[np.uint64], code: Code
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The bit fields (values and widths, one row per value) of each value's codeword."""
    length = bit_length(array)
    if code == "gamma":
        fields = np.stack([np.zeros_like(array), array], axis=1)
        widths = np.stack([length - 1, length], axis=1)
        return fields, widths
    width_of_length = bit_length(length.astype(np.uint64))
    below_leading = array & ((_ONE << (length - 1).astype(np.uint64)) - _ONE)
    fields = np.stack([np.zeros_like(array), length.astype(np.uint64), below_leading], axis=1)
    widths = np.stack([width_of_length - 1, width_of_length, length - 1], axis=1)
    return fields, widths


def encode(values: npt.ArrayLike, *, code: Code = "gamma") -> bytes:
    """Concatenate the codewords of ``values`` (integers in ``[1, 2**64)``) into padded bytes."""
    _check_code(code)
    return _pack_fields(*_fields(_as_positive(values), code))


def encode_rows(rows: npt.ArrayLike, *, code: Code = "gamma") -> list[bytes]:
    """One padded message per row of a 2-D array of positive integers, packed in one pass."""
    _check_code(code)
    table = np.asarray(rows)
    if table.ndim != 2:
        raise ParameterError(f"rows must be two-dimensional, got shape {table.shape}")
    count = table.shape[0]
    if count == 0:
        return []
    fields, widths = _fields(_as_positive(table.reshape(-1)), code)
    fields = fields.reshape(count, -1)
    widths = widths.reshape(count, -1)
    padding = -widths.sum(axis=1) % 8
    fields = np.concatenate([fields, np.zeros((count, 1), dtype=np.uint64)], axis=1)
    widths = np.concatenate([widths, padding[:, None]], axis=1)
    data = _pack_fields(fields, widths)
    ends = np.cumsum(widths.sum(axis=1) // 8)
    starts = ends - widths.sum(axis=1) // 8
    return [data[int(a) : int(b)] for a, b in zip(starts, ends, strict=True)]


def _read(
    bits: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], widths: npt.NDArray[np.int64]
):
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
    return decode_many([data], count, code=code)[0]


def decode_many(
    messages: Sequence[bytes], count: int, *, code: Code = "gamma"
) -> npt.NDArray[np.uint64]:
    """:func:`decode` of many messages with ``count`` values each, as a ``(messages, count)``
    array, in one vectorized pass over their concatenated bits."""
    _check_code(code)
    if count < 0:
        raise ParameterError(f"count must be >= 0, got {count}")
    sizes = np.array([len(message) for message in messages], dtype=np.int64) * 8
    bits = np.unpackbits(np.frombuffer(b"".join(bytes(m) for m in messages), dtype=np.uint8))
    size = bits.size
    message_end = np.cumsum(sizes)
    message_start = message_end - sizes
    malformed = f"message: not exactly {count} {code} codewords plus zero padding"
    if count == 0:
        if size:
            raise ParameterError(malformed)
        return np.zeros((len(messages), 0), dtype=np.uint64)
    ones = np.flatnonzero(bits)
    if ones.size == 0:
        raise ParameterError(malformed)
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
    starts = np.minimum(message_start, size)[:, None]
    power = jump
    while starts.shape[1] < count:
        starts = np.concatenate([starts, power[starts]], axis=1)
        power = power[power]
    starts = starts[:, :count]
    end = jump[starts[:, -1]]
    ones_before = np.concatenate([[0], np.cumsum(bits, dtype=np.int64)])
    bad = (
        np.any(starts >= message_end[:, None], axis=1)
        | (end > message_end)
        | (message_end - end >= 8)
    )
    if np.any(bad) or np.any(ones_before[message_end] != ones_before[np.minimum(end, size)]):
        raise ParameterError(malformed)
    flat = starts.ravel()
    lead = next_one[flat]
    width = lead - flat + 1
    if code == "gamma":
        values = _read(bits, lead, width)
    else:
        length = _read(bits, lead, width).astype(np.int64)
        values = (_ONE << (length - 1).astype(np.uint64)) | _read(bits, lead + width, length - 1)
    return values.reshape(len(messages), count)
