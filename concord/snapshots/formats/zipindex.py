"""Where each entry's bytes lie in a zip archive, from its central directory and local headers.

Only the metadata is read (end-of-central-directory record, its zip64 form, the central
directory, one local header per entry), with every length checked against the region before
it is used; nothing is decompressed or extracted. ``torch.save`` writes its archives this way:
entries stored uncompressed, data descriptors after the data, zip64 records always, each
entry's data aligned to 64 bytes with padding in the local header's extra field.

An archive may sit inside a larger file (a DCP ``.distcp`` record is a whole ``torch.save``
archive); its offsets are then relative to the region's start.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

from concord.snapshots.formats.common import Unreadable, pread

_EOCD = struct.Struct("<4sHHHHIIH")
_EOCD_SIG = b"PK\x05\x06"
_LOCATOR = struct.Struct("<4sIQI")
_LOCATOR_SIG = b"PK\x06\x07"
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_EOCD64_SIG = b"PK\x06\x06"
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_CENTRAL_SIG = b"PK\x01\x02"
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_SIG = b"PK\x03\x04"
_MAX_COMMENT = 0xFFFF
#: the largest central directory read (70 bytes an entry: about 3.5 million entries)
MAX_CENTRAL_BYTES = 256 * 1024 * 1024
_U16, _U32 = 0xFFFF, 0xFFFFFFFF


@dataclass(frozen=True)
class ZipEntry:
    """One entry: its ``size`` bytes as they lie in the file start at ``data_offset`` (absolute)."""

    name: str
    data_offset: int
    size: int
    stored: bool  # uncompressed: the bytes in the file are the entry's bytes


def is_zip(fd: int, base: int, length: int) -> bool:
    """Whether the region starts with a zip local header."""
    return length >= _LOCAL.size and pread(fd, 4, base) == _LOCAL_SIG


def read_entries(fd: int, base: int, length: int) -> list[ZipEntry]:
    """The entries of the archive in ``[base, base + length)``, in central-directory order."""
    eocd_at, (_, disk, cd_disk, _, n_total, cd_size, cd_offset, _) = _find_eocd(fd, base, length)
    if disk or cd_disk:
        raise Unreadable("multi-disk zip archive")
    if _U16 in (n_total,) or _U32 in (cd_size, cd_offset) or _has_locator(fd, base, eocd_at):
        n_total, cd_size, cd_offset = _zip64(fd, base, eocd_at)
    if cd_offset + cd_size > eocd_at or cd_size > MAX_CENTRAL_BYTES:
        raise Unreadable(f"central directory [{cd_offset}, {cd_offset + cd_size}) runs past its end record")
    if n_total * _CENTRAL.size > cd_size:
        raise Unreadable(f"{n_total} entries cannot fit a central directory of {cd_size} bytes")
    cd = pread(fd, cd_size, base + cd_offset)
    entries: list[ZipEntry] = []
    at = 0
    for _ in range(n_total):
        entries.append(_entry(fd, base, cd, at, cd_offset))
        at += _CENTRAL.size + sum(_CENTRAL.unpack_from(cd, at)[10:13])
    if at != cd_size:
        raise Unreadable(f"central directory holds {cd_size - at} bytes after its {n_total} entries")
    spans = sorted((e.data_offset, e.size) for e in entries)
    for (a, n), (b, _) in itertools.pairwise(spans):
        if a + n > b:
            raise Unreadable("two zip entries overlap")
    return entries


def _find_eocd(fd: int, base: int, length: int) -> tuple[int, tuple]:
    if length < _EOCD.size:
        raise Unreadable("too short for a zip archive")
    tail = pread(fd, _EOCD.size, base + length - _EOCD.size)
    if tail[:4] == _EOCD_SIG and _EOCD.unpack(tail)[7] == 0:  # no comment: the usual case
        return length - _EOCD.size, _EOCD.unpack(tail)
    n = min(length, _EOCD.size + _MAX_COMMENT)
    tail = pread(fd, n, base + length - n)
    i = tail.rfind(_EOCD_SIG)
    while i >= 0:
        if len(tail) - i >= _EOCD.size:
            rec = _EOCD.unpack_from(tail, i)
            if i + _EOCD.size + rec[7] == len(tail):
                return length - n + i, rec
        i = tail.rfind(_EOCD_SIG, 0, i)
    raise Unreadable("no end-of-central-directory record")


def _has_locator(fd: int, base: int, eocd_at: int) -> bool:
    return eocd_at >= _LOCATOR.size and pread(fd, 4, base + eocd_at - _LOCATOR.size) == _LOCATOR_SIG


def _zip64(fd: int, base: int, eocd_at: int) -> tuple[int, int, int]:
    if eocd_at < _LOCATOR.size:
        raise Unreadable("zip64 fields without a zip64 locator")
    sig, _, rec_at, _ = _LOCATOR.unpack(pread(fd, _LOCATOR.size, base + eocd_at - _LOCATOR.size))
    if sig != _LOCATOR_SIG or rec_at + _EOCD64.size > eocd_at - _LOCATOR.size:
        raise Unreadable("bad zip64 locator")
    rec = _EOCD64.unpack(pread(fd, _EOCD64.size, base + rec_at))
    if rec[0] != _EOCD64_SIG or rec[4] or rec[5]:
        raise Unreadable("bad zip64 end record")
    n_total, cd_size, cd_offset = rec[7], rec[8], rec[9]
    if cd_offset + cd_size > rec_at:
        raise Unreadable("zip64 central directory runs past its end record")
    return n_total, cd_size, cd_offset


def _entry(fd: int, base: int, cd: bytes, at: int, cd_offset: int) -> ZipEntry:
    if at + _CENTRAL.size > len(cd):
        raise Unreadable("central directory ends inside an entry")
    f = _CENTRAL.unpack_from(cd, at)
    if f[0] != _CENTRAL_SIG:
        raise Unreadable("bad central directory entry")
    method, csize, usize, nlen, xlen, clen, disk, lho = f[4], f[8], f[9], f[10], f[11], f[12], f[13], f[16]
    end = at + _CENTRAL.size + nlen + xlen + clen
    if end > len(cd):
        raise Unreadable("central directory ends inside an entry")
    raw_name = cd[at + _CENTRAL.size : at + _CENTRAL.size + nlen]
    extra = cd[at + _CENTRAL.size + nlen : at + _CENTRAL.size + nlen + xlen]
    usize, csize, lho, disk = _zip64_extra(extra, usize, csize, lho, disk)
    if disk:
        raise Unreadable("multi-disk zip archive")
    local = pread(fd, _LOCAL.size + nlen, base + lho) if lho + _LOCAL.size + nlen <= cd_offset else b""
    if len(local) < _LOCAL.size or local[:4] != _LOCAL_SIG or local[_LOCAL.size :] != raw_name:
        raise Unreadable(f"entry {raw_name[:80]!r}: its local header does not match the central directory")
    lnlen, lxlen = _LOCAL.unpack_from(local)[9:11]
    data = lho + _LOCAL.size + lnlen + lxlen
    if data + csize > cd_offset:
        raise Unreadable(f"entry {raw_name[:80]!r} runs into the central directory")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        name = raw_name.decode("cp437")
    return ZipEntry(name, base + data, csize, method == 0 and csize == usize)


def _zip64_extra(extra: bytes, usize: int, csize: int, lho: int, disk: int) -> tuple[int, int, int, int]:
    i = 0
    while i + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4 : i + 4 + n]
        if tag == 1:
            vals = []
            j = 0
            for v, width in ((usize, 8), (csize, 8), (lho, 8), (disk, 4)):
                if v == (_U32 if width == 8 else _U16):
                    if j + width > len(body):
                        raise Unreadable("short zip64 extra field")
                    v = int.from_bytes(body[j : j + width], "little")
                    j += width
                vals.append(v)
            return vals[0], vals[1], vals[2], vals[3]
        i += 4 + n
    return usize, csize, lho, disk
