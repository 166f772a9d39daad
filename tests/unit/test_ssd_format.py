"""The SSD object file format, without a disk."""

from __future__ import annotations

import pytest

from kvstore.store import ssd_format as fmt


def test_header_round_trip() -> None:
    header = fmt.Header(key_len=32, data_len=1 << 20, checksum=0xDEADBEEF12345678)
    raw = fmt.pack_header(header)
    assert len(raw) == fmt.HEADER_SIZE
    assert raw[:4] == b"KVS1"
    assert fmt.unpack_header(raw) == header


@pytest.mark.parametrize("offset", range(0, fmt.HEADER_SIZE, 7))
def test_any_flipped_header_byte_is_rejected(offset: int) -> None:
    raw = bytearray(fmt.pack_header(fmt.Header(key_len=8, data_len=100, checksum=42)))
    raw[offset] ^= 0x01
    with pytest.raises(fmt.FormatError):
        fmt.unpack_header(raw)


def test_short_header_is_rejected() -> None:
    raw = fmt.pack_header(fmt.Header(key_len=8, data_len=100, checksum=42))
    with pytest.raises(fmt.FormatError, match="truncated"):
        fmt.unpack_header(raw[:-1])


@pytest.mark.parametrize(
    ("key_len", "data_len", "expected"),
    [(1, 0, 4096), (1, 1, 4096), (32, 4096 - 64 - 32, 4096), (32, 4096 - 64 - 31, 8192),
     (32, 1 << 20, (1 << 20) + 4096)],
)  # fmt: skip
def test_files_are_padded_to_whole_blocks(key_len: int, data_len: int, expected: int) -> None:
    assert fmt.file_length(key_len, data_len) == expected
    assert fmt.HEADER_SIZE + key_len + data_len + len(fmt.padding(key_len, data_len)) == expected


def test_names_are_sharded_hashes_of_the_key() -> None:
    stem = fmt.object_name(b"some key")
    assert len(stem) == 32 and fmt.stem_of(stem + ".kvs") == stem
    assert fmt.relative_path(b"some key") == f"{stem[:2]}/{stem}.kvs"
    assert fmt.object_name(b"other key") != stem
    assert len(fmt.shard_names()) == 256
    temp = fmt.temp_name(stem, "1-2")
    assert fmt.is_temp_name(temp) and fmt.stem_of(temp) is None
    assert fmt.stem_of("notes.txt") is None and fmt.stem_of("Z" * 32 + ".kvs") is None
