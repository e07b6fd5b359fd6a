"""A minimal SPDY/3.1 framer, the server half of what Kubernetes' streaming protocols need: kube-apiserver
talks SPDY/3.1 to a kubelet for exec, attach and port-forward (workers/kubelet_api.py serves them).

Pure: `FrameDecoder` turns bytes into frames, `FrameEncoder` frames into bytes; each keeps its direction's
zlib stream for header blocks (SPDY/3 compresses every header block of a connection in one stream, primed
with the dictionary below). No flow control: like Kubernetes' own SPDY library, WINDOW_UPDATE and SETTINGS
are read and ignored, and none are sent."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
FLAG_FIN = 0x01

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9

# RST_STREAM status codes used here.
RST_PROTOCOL_ERROR = 1
RST_REFUSED_STREAM = 3
RST_CANCEL = 5

# Data frames carry at most this many bytes (the length field has 24 bits; peers buffer whole frames).
MAX_DATA = 32 * 1024
# A frame longer than this is refused rather than buffered (a control frame never needs more).
MAX_FRAME = 1 << 24


def _dictionary() -> bytes:
    """The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00, 2.6.10.1): common header
    names and values, each preceded by its length as a 32-bit big-endian integer, then one run of text."""
    words = (
        "options head post put delete trace accept accept-charset accept-encoding accept-language accept-ranges "
        "age allow authorization cache-control connection content-base content-encoding content-language "
        "content-length content-location content-md5 content-range content-type date etag expect expires from "
        "host if-match if-modified-since if-none-match if-range if-unmodified-since last-modified location "
        "max-forwards pragma proxy-authenticate proxy-authorization range referer retry-after server te trailer "
        "transfer-encoding upgrade user-agent vary via warning www-authenticate method get status"
    ).split() + ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
    tail = (
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
        "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
        "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
        "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
        "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
    )
    return b"".join(struct.pack(">I", len(w)) + w.encode() for w in words) + tail.encode()


DICTIONARY = _dictionary()

Headers = dict[str, list[str]]


class ProtocolError(Exception):
    """The peer sent something that is not SPDY/3.1: the connection cannot go on."""


@dataclass(frozen=True)
class SynStream:
    stream_id: int
    headers: Headers
    fin: bool = False
    associated_id: int = 0
    priority: int = 0


@dataclass(frozen=True)
class SynReply:
    stream_id: int
    headers: Headers = field(default_factory=dict)
    fin: bool = False


@dataclass(frozen=True)
class HeadersFrame:
    stream_id: int
    headers: Headers
    fin: bool = False


@dataclass(frozen=True)
class Data:
    stream_id: int
    data: bytes
    fin: bool = False


@dataclass(frozen=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True)
class Ping:
    ping_id: int


@dataclass(frozen=True)
class GoAway:
    last_stream_id: int
    status: int = 0


@dataclass(frozen=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class Settings:
    values: dict[int, int]


Frame = SynStream | SynReply | HeadersFrame | Data | RstStream | Ping | GoAway | WindowUpdate | Settings


def header(headers: Headers, name: str) -> str | None:
    """The first value of a header, or None."""
    values = headers.get(name.lower())
    return values[0] if values else None


class FrameDecoder:
    """Bytes in, frames out, for one direction of one connection."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            length = int.from_bytes(self._buffer[5:8], "big")
            if length >= MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes")
            if len(self._buffer) < 8 + length:
                break
            head, body = bytes(self._buffer[:8]), bytes(self._buffer[8 : 8 + length])
            del self._buffer[: 8 + length]
            frame = self._frame(head, body)
            if frame is not None:
                frames.append(frame)
        return frames

    def _frame(self, head: bytes, body: bytes) -> Frame | None:
        first, flags = struct.unpack(">I", head[:4])[0], head[4]
        fin = bool(flags & FLAG_FIN)
        if not first & 0x80000000:
            return Data(stream_id=first & 0x7FFFFFFF, data=body, fin=fin)
        version, kind = (first >> 16) & 0x7FFF, first & 0xFFFF
        if version != VERSION:
            raise ProtocolError(f"SPDY version {version}")
        try:
            if kind == SYN_STREAM:
                stream_id, associated, priority = struct.unpack(">IIB", body[:9])
                return SynStream(stream_id=stream_id & 0x7FFFFFFF, associated_id=associated & 0x7FFFFFFF,
                                 priority=priority >> 5, headers=self._headers(body[10:]), fin=fin)  # fmt: skip
            if kind == SYN_REPLY:
                return SynReply(stream_id=_stream_id(body), headers=self._headers(body[4:]), fin=fin)
            if kind == HEADERS:
                return HeadersFrame(stream_id=_stream_id(body), headers=self._headers(body[4:]), fin=fin)
            if kind == RST_STREAM:
                return RstStream(stream_id=_stream_id(body), status=struct.unpack(">I", body[4:8])[0])
            if kind == PING:
                return Ping(ping_id=struct.unpack(">I", body[:4])[0])
            if kind == GOAWAY:
                return GoAway(last_stream_id=_stream_id(body), status=struct.unpack(">I", body[4:8])[0])
            if kind == WINDOW_UPDATE:
                return WindowUpdate(stream_id=_stream_id(body), delta=struct.unpack(">I", body[4:8])[0] & 0x7FFFFFFF)
            if kind == SETTINGS:
                (count,) = struct.unpack(">I", body[:4])
                entries = (struct.unpack(">II", body[4 + 8 * i : 12 + 8 * i]) for i in range(count))
                return Settings(values={first_word & 0xFFFFFF: value for first_word, value in entries})
        except struct.error as e:
            raise ProtocolError(f"short control frame of type {kind}") from e
        return None  # unknown control frames are ignored, as the spec asks

    def _headers(self, block: bytes) -> Headers:
        try:
            raw = self._inflate.decompress(block)
        except zlib.error as e:
            raise ProtocolError(f"header block: {e}") from e
        headers: Headers = {}
        try:
            (count,), offset = struct.unpack(">I", raw[:4]), 4
            for _ in range(count):
                name, offset = _string(raw, offset)
                value, offset = _string(raw, offset)
                # Several values of one name are joined by NUL; names are lowercase on the wire.
                headers.setdefault(name.lower(), []).extend(value.split("\0"))
        except (struct.error, UnicodeDecodeError) as e:
            raise ProtocolError("malformed header block") from e
        return headers


def _stream_id(body: bytes) -> int:
    return int(struct.unpack(">I", body[:4])[0]) & 0x7FFFFFFF


def _string(raw: bytes, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack(">I", raw[offset : offset + 4])
    end = offset + 4 + length
    if end > len(raw):
        raise struct.error("string past the end of the block")
    return raw[offset + 4 : end].decode(), end


class FrameEncoder:
    """Frames in, bytes out, for one direction of one connection."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15, 8,
                                         zlib.Z_DEFAULT_STRATEGY, zdict=DICTIONARY)  # fmt: skip

    def encode(self, frame: Frame) -> bytes:
        fin = FLAG_FIN if getattr(frame, "fin", False) else 0
        match frame:
            case Data(stream_id=stream_id, data=data):
                return struct.pack(">IB", stream_id & 0x7FFFFFFF, fin) + len(data).to_bytes(3, "big") + data
            case SynStream():
                body = struct.pack(">IIBB", frame.stream_id, frame.associated_id, (frame.priority & 7) << 5, 0)
                return _control(SYN_STREAM, fin, body + self._headers(frame.headers))
            case SynReply(stream_id=stream_id, headers=headers):
                return _control(SYN_REPLY, fin, struct.pack(">I", stream_id) + self._headers(headers))
            case HeadersFrame(stream_id=stream_id, headers=headers):
                return _control(HEADERS, fin, struct.pack(">I", stream_id) + self._headers(headers))
            case RstStream(stream_id=stream_id, status=status):
                return _control(RST_STREAM, 0, struct.pack(">II", stream_id, status))
            case Ping(ping_id=ping_id):
                return _control(PING, 0, struct.pack(">I", ping_id))
            case GoAway(last_stream_id=last, status=status):
                return _control(GOAWAY, 0, struct.pack(">II", last, status))
            case WindowUpdate(stream_id=stream_id, delta=delta):
                return _control(WINDOW_UPDATE, 0, struct.pack(">II", stream_id, delta))
            case Settings(values=values):
                entries = b"".join(struct.pack(">II", key & 0xFFFFFF, value) for key, value in values.items())
                return _control(SETTINGS, 0, struct.pack(">I", len(values)) + entries)
        raise TypeError(f"not a SPDY frame: {frame!r}")

    def _headers(self, headers: Headers) -> bytes:
        parts = [struct.pack(">I", len(headers))]
        for name, values in headers.items():
            key, value = name.lower().encode(), "\0".join(values).encode()
            parts += [struct.pack(">I", len(key)), key, struct.pack(">I", len(value)), value]
        raw = b"".join(parts)
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)


def _control(kind: int, flags: int, body: bytes) -> bytes:
    return struct.pack(">HHB", 0x8000 | VERSION, kind, flags) + len(body).to_bytes(3, "big") + body
