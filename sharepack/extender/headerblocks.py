"""HTTP/2 header blocks (HPACK, RFC 7541) for `extender.h2server`: requests' decoded, replies'
encoded.

kube-scheduler sends two header blocks per pod it schedules through the extender (the filter's
and the bind's). The `hpack` library's decoder is general (header tuple objects, text
conversion, checks per field); this one does only what a request needs, in about a quarter of the
CPU (`benchmarks/bench_headerblocks.py`). The static table and the Huffman code's decoding
state machine are the library's: data, not logic repeated here.

What it checks: every index names an entry, integers and strings end inside the block,
Huffman strings decode, table size updates come first and stay within our limit, and the
decoded list stays within `max_list` (RFC 7541 section 4.1's size: name, value and 32 bytes
per field). Any violation raises `BlockError`, a connection error (COMPRESSION_ERROR).

A reply's block is three fields from the static table, its values literal and never added to
the dynamic table, so the encoder keeps no table: its first block says so (a size update to 0).
"""

from __future__ import annotations

from collections import deque

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

Field = tuple[bytes, bytes]

STATIC: tuple[Field, ...] = tuple(HeaderTable.STATIC_TABLE)  # indices 1-61
ENTRY_OVERHEAD = 32  # RFC 7541 4.1
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's default, which our SETTINGS keep


class BlockError(ValueError):
    """A header block that does not decode."""


class Decoder:
    """One connection's decoding state: the dynamic table, newest entry first."""

    def __init__(self, max_list: int, table_limit: int = DEFAULT_TABLE_SIZE) -> None:
        self.max_list = max_list
        self._limit = table_limit  # what our SETTINGS allow the encoder
        self._max = table_limit  # the size the encoder chose (a table size update)
        self._size = 0
        self._table: deque[Field] = deque()

    def decode(self, block: bytes) -> list[Field]:
        fields: list[Field] = []
        total = 0
        i, end = 0, len(block)
        while i < end:
            b = block[i]
            if b & 0x80:  # indexed field
                index, i = _integer(block, i, 7)
                field = self._entry(index)
            elif b & 0x40:  # literal, added to the table
                index, i = _integer(block, i, 6)
                field, i = self._literal(block, i, index)
                self._add(field)
            elif b & 0x20:  # dynamic table size update
                if fields:
                    raise BlockError("a table size update after the first field")
                size, i = _integer(block, i, 5)
                if size > self._limit:
                    raise BlockError(f"table size update to {size}, over the {self._limit} allowed")
                self._max = size
                self._evict()
                continue
            else:  # literal not added (0000) or never to be added (0001)
                index, i = _integer(block, i, 4)
                field, i = self._literal(block, i, index)
            total += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if total > self.max_list:
                raise BlockError(f"a header list over {self.max_list} bytes")
            fields.append(field)
        return fields

    def _entry(self, index: int) -> Field:
        if 0 < index <= len(STATIC):
            return STATIC[index - 1]
        dynamic = index - len(STATIC) - 1
        if 0 <= dynamic < len(self._table):
            return self._table[dynamic]
        raise BlockError(f"index {index} names no table entry")

    def _literal(self, block: bytes, i: int, index: int) -> tuple[Field, int]:
        if index:
            name = self._entry(index)[0]
        else:
            name, i = _string(block, i)
        value, i = _string(block, i)
        return (name, value), i

    def _add(self, field: Field) -> None:
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        if size > self._max:  # RFC 7541 4.4: an entry larger than the table empties it
            self._table.clear()
            self._size = 0
            return
        self._table.appendleft(field)
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max:
            name, value = self._table.pop()
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD


def _integer(block: bytes, i: int, prefix: int) -> tuple[int, int]:
    """RFC 7541 5.1: the integer at `i` with an N-bit prefix, and where the next item starts."""
    mask = (1 << prefix) - 1
    value = block[i] & mask
    i += 1
    if value < mask:
        return value, i
    shift = 0
    while True:
        if i >= len(block):
            raise BlockError("an integer past the end of the block")
        b = block[i]
        i += 1
        value += (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
        if shift > 28:  # past any size a header block can have
            raise BlockError("an integer too large")


def _string(block: bytes, i: int) -> tuple[bytes, int]:
    """RFC 7541 5.2: the string literal at `i`, and where the next item starts."""
    if i >= len(block):
        raise BlockError("a string past the end of the block")
    huffman = block[i] & 0x80
    length, i = _integer(block, i, 7)
    if i + length > len(block):
        raise BlockError("a string longer than the block")
    raw = block[i : i + length]
    if not huffman:
        return raw, i + length
    try:
        return decode_huffman(raw), i + length
    except HPACKDecodingError as e:
        raise BlockError(f"a Huffman string that does not decode: {e}") from None


# --- replies ----------------------------------------------------------------------------------


def _static_index(name: bytes, value: bytes | None = None) -> int:
    """The static table's index of `name` (with `value`, when given)."""
    return 1 + next(i for i, (n, v) in enumerate(STATIC) if n == name and (value is None or v == value))


_STATUS_INDEXED = {code: _static_index(b":status", str(code).encode()) for code in (200, 204, 206, 304, 400, 404, 500)}
_STATUS, _CONTENT_TYPE, _CONTENT_LENGTH = _static_index(b":status"), _static_index(b"content-type"), _static_index(b"content-length")
_TABLE_SIZE_ZERO = b"\x20"  # a dynamic table size update to 0 (section 6.3)


def _encoded_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 5.1's prefixed integer, `first` holding the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name_index: int, value: bytes) -> bytes:
    """A literal field not added to the table (section 6.2.2), its name from the static table,
    its value not Huffman-coded."""
    return _encoded_integer(name_index, 4, 0x00) + _encoded_integer(len(value), 7, 0x00) + value


class ReplyEncoder:
    """One connection's reply blocks: `:status`, `content-type`, `content-length`."""

    def __init__(self) -> None:
        self._first = True

    def encode(self, status: int, content_type: str, length: int) -> bytes:
        indexed = _STATUS_INDEXED.get(status)
        block = bytes((0x80 | indexed,)) if indexed else _literal(_STATUS, str(status).encode())
        block += _literal(_CONTENT_TYPE, content_type.encode("latin-1")) + _literal(_CONTENT_LENGTH, str(length).encode())
        if self._first:
            self._first = False
            return _TABLE_SIZE_ZERO + block
        return block
