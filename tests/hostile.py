"""Hostile inputs shared by the tests of Sluice's limits."""

from __future__ import annotations

import struct
import tarfile
import zlib


def bundle_declaring(name: str, size: int) -> bytes:
    """A valid tar.gz of one `size`-byte file of zeros (about 1 MB per GiB), built without
    compressing `size` bytes.

    After a full flush deflate's output for a block depends only on the block, so one compressed
    MiB of zeros is repeated; the gzip trailer carries the true CRC and length, so a reader that
    inflates it all finds nothing wrong.
    """
    block = bytes(1 << 20)
    assert size % len(block) == 0
    info = tarfile.TarInfo(name)
    info.size = size
    header, tail = info.tobuf(format=tarfile.PAX_FORMAT), bytes(1024)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = deflate.compress(header) + deflate.flush(zlib.Z_FULL_FLUSH)
    first = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    body = [head, first, *[again] * (size // len(block) - 1), deflate.compress(tail), deflate.flush()]
    crc = zlib.crc32(header)
    for _ in range(size // len(block)):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(tail, crc)
    trailer = struct.pack("<II", crc, (len(header) + size + len(tail)) & 0xFFFFFFFF)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + b"".join(body) + trailer


def billion_laughs(head: str, levels: int = 9, width: int = 9, indent: str = "      ") -> str:
    """`head` followed by anchors that each list the previous one `width` times (width**levels strings)."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * width)}]\n"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]\n" for i in range(1, levels)]
    return head + "".join(lines)
