"""extender.headerblocks against the hpack library: the same header lists from any sequence of
blocks its encoder writes, and errors for blocks that break RFC 7541."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharepack.extender import headerblocks
from sharepack.extender.headerblocks import BlockError, Decoder

names = st.sampled_from([b":method", b":path", b":authority", b"content-length", b"content-type",
                         b"user-agent", b"accept-encoding", b"x-custom"]) | st.binary(min_size=1, max_size=20)  # fmt: skip
values = st.sampled_from([b"POST", b"/filter", b"/bind", b"application/json", b"gzip", b"12345"]) | st.binary(max_size=300)
field = st.tuples(names, values, st.booleans())  # the last: sensitive (never indexed)
blocks = st.lists(
    st.tuples(st.lists(field, max_size=12), st.booleans(), st.none() | st.sampled_from([0, 100, 256, 4096])),
    min_size=1, max_size=8,
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=blocks)
def test_the_same_fields_as_the_hpack_library_block_after_block(
    blocks: list[tuple[list[tuple[bytes, bytes, bool]], bool, int | None]],
) -> None:
    encoder = hpack.Encoder()
    theirs = hpack.Decoder(max_header_list_size=1 << 20)
    ours = Decoder(max_list=1 << 20)
    for fields, huffman, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size  # the next block starts with a size update
        headers = [hpack.HeaderTuple(n, v) if not s else hpack.NeverIndexedHeaderTuple(n, v) for n, v, s in fields]
        block = encoder.encode(headers, huffman=huffman)
        assert ours.decode(block) == [tuple(h) for h in theirs.decode(block, raw=True)]


def test_an_entry_evicts_the_oldest_and_one_too_large_empties_the_table() -> None:
    d = Decoder(max_list=1 << 20, table_limit=100)
    # Literal with incremental indexing, new name: 0x40, then name and value as plain strings.
    def add(name: bytes, value: bytes) -> bytes:
        return b"\x40" + bytes([len(name)]) + name + bytes([len(value)]) + value

    d.decode(add(b"a", b"x" * 20) + add(b"b", b"y" * 20))  # 53 + 53 bytes: "a" evicted
    assert d.decode(b"\xbe") == [(b"b", b"y" * 20)]  # index 62: the newest
    with pytest.raises(BlockError, match="index 63 names no table entry"):
        d.decode(b"\xbf")
    d.decode(add(b"c", b"z" * 80))  # 113 > 100: the table empties
    with pytest.raises(BlockError, match="index 62 names no table entry"):
        d.decode(b"\xbe")


@pytest.mark.parametrize(
    "block, message",
    [
        (b"\x80", "index 0 names no table entry"),
        (b"\xff\x80", "integer past the end"),
        (b"\xff\xff\xff\xff\xff\xff\x01", "integer too large"),
        (b"\x40\x05ab", "string longer than the block"),
        (b"\x40", "string past the end"),
        (b"\x40\x81\xff\x00", "Huffman string that does not decode"),
        (b"\x82\x20", "table size update after the first field"),
        (b"\x3f\xe2\x1f", "table size update to 4097, over the 4095 allowed"),
    ],
)
def test_blocks_that_break_the_rules_are_named(block: bytes, message: str) -> None:
    with pytest.raises(BlockError, match=message):
        Decoder(max_list=1 << 20, table_limit=4095).decode(block)


def test_a_header_list_over_the_limit_is_refused() -> None:
    one = b"\x00\x01a\x0a" + b"v" * 10  # a literal not indexed: 1 + 10 + 32 = 43 bytes
    assert len(Decoder(max_list=86).decode(one * 2)) == 2
    with pytest.raises(BlockError, match="header list over 85 bytes"):
        Decoder(max_list=85).decode(one * 2)


def test_the_static_table_is_rfc_7541s() -> None:
    assert len(headerblocks.STATIC) == 61
    assert headerblocks.STATIC[1] == (b":method", b"GET") and headerblocks.STATIC[60] == (b"www-authenticate", b"")


def test_replies_decode_as_their_three_fields_and_leave_no_table_state() -> None:
    encoder = headerblocks.ReplyEncoder()
    theirs = hpack.Decoder()
    first = encoder.encode(200, "application/json", 12)
    second = encoder.encode(429, "text/plain; charset=utf-8", 70000)
    assert first[:1] == b"\x20" and second[:1] != b"\x20"  # the table size update once, first
    assert theirs.decode(first, raw=True) == [(b":status", b"200"), (b"content-type", b"application/json"),
                                              (b"content-length", b"12")]  # fmt: skip
    assert theirs.decode(second, raw=True) == [(b":status", b"429"), (b"content-type", b"text/plain; charset=utf-8"),
                                               (b"content-length", b"70000")]  # fmt: skip
    assert len(theirs.header_table.dynamic_entries) == 0
