"""The SPDY/3.1 framer (kube/spdy.py), without a network: what one side encodes the other decodes, header
blocks share one zlib stream per direction, and frames split anywhere are reassembled."""

from __future__ import annotations

import struct
import zlib

import pytest

from kube import spdy


def _roundtrip(frames: list[spdy.Frame]) -> list[spdy.Frame]:
    encoder, decoder = spdy.FrameEncoder(), spdy.FrameDecoder()
    return decoder.feed(b"".join(encoder.encode(f) for f in frames))


@pytest.mark.parametrize("frame", [
    pytest.param(spdy.SynStream(1, {"streamtype": ["error"]}), id="syn stream"),
    pytest.param(spdy.SynStream(3, {"streamtype": ["data"], "port": ["80"], "requestid": ["0"]}, fin=True, priority=2),
                 id="syn stream with fin and priority"),
    pytest.param(spdy.SynReply(5), id="syn reply without headers"),
    pytest.param(spdy.HeadersFrame(5, {"a": ["1", "2"]}), id="headers with two values of one name"),
    pytest.param(spdy.Data(7, b"\x00\xffbinary", fin=True), id="data with fin"),
    pytest.param(spdy.Data(7, b""), id="empty data"),
    pytest.param(spdy.RstStream(9, spdy.RST_CANCEL), id="rst stream"),
    pytest.param(spdy.Ping(0xFFFFFFFF), id="ping"),
    pytest.param(spdy.GoAway(11, 0), id="goaway"),
    pytest.param(spdy.WindowUpdate(1, 65536), id="window update"),
    pytest.param(spdy.Settings({4: 100, 7: 65536}), id="settings"),
])  # fmt: skip
def test_a_frame_decodes_to_what_was_encoded(frame: spdy.Frame) -> None:
    assert _roundtrip([frame]) == [frame]


def test_header_blocks_share_one_compression_stream_per_direction() -> None:
    frames: list[spdy.Frame] = [spdy.SynStream(i, {"streamtype": [t]}) for i, t in enumerate(["a", "b", "c"], 1)]
    encoder = spdy.FrameEncoder()
    wire = [encoder.encode(f) for f in frames]
    assert len(wire[2]) < len(wire[0])  # the second block refers back to the first
    assert spdy.FrameDecoder().feed(b"".join(wire)) == frames
    with pytest.raises(spdy.ProtocolError):  # a later block alone cannot be read
        spdy.FrameDecoder().feed(wire[1])


def test_frames_split_at_any_byte_are_reassembled() -> None:
    frames: list[spdy.Frame] = [spdy.SynStream(1, {"streamtype": ["stdout"]}), spdy.Data(1, b"x" * 1000), spdy.Ping(1)]
    encoder, decoder = spdy.FrameEncoder(), spdy.FrameDecoder()
    wire = b"".join(encoder.encode(f) for f in frames)
    received = [f for i in range(len(wire)) for f in decoder.feed(wire[i : i + 1])]
    assert received == frames


def test_header_names_are_lowercase_on_the_wire_and_values_split_at_nul() -> None:
    decoded = _roundtrip([spdy.SynStream(1, {"StreamType": ["error"]})])[0]
    assert isinstance(decoded, spdy.SynStream) and decoded.headers == {"streamtype": ["error"]}
    assert spdy.header(decoded.headers, "StreamType") == "error"


def test_a_header_block_from_a_spec_conforming_peer_is_read() -> None:
    """Built by hand as the spec lays it out (and as Go's SPDY library writes it): zlib with the dictionary."""
    raw = struct.pack(">I", 1) + struct.pack(">I", 10) + b"streamtype" + struct.pack(">I", 5) + b"stdin"
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    block = deflate.compress(raw) + deflate.flush(zlib.Z_SYNC_FLUSH)
    body = struct.pack(">IIBB", 1, 0, 0, 0) + block
    wire = struct.pack(">HHB", 0x8003, spdy.SYN_STREAM, 0) + len(body).to_bytes(3, "big") + body
    assert spdy.FrameDecoder().feed(wire) == [spdy.SynStream(1, {"streamtype": ["stdin"]})]


def test_the_dictionary_is_the_spdy3_one() -> None:
    assert len(spdy.DICTIONARY) == 1423
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.DICTIONARY.endswith(b"utf-,*,enq=0.")
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2  # the dictionary id in every SPDY/3 header stream


@pytest.mark.parametrize("wire", [
    pytest.param(struct.pack(">HHB", 0x8002, spdy.PING, 0) + (4).to_bytes(3, "big") + b"\0\0\0\1", id="spdy/2"),
    pytest.param(struct.pack(">HHB", 0x8003, spdy.RST_STREAM, 0) + (2).to_bytes(3, "big") + b"\0\0", id="short rst"),
])  # fmt: skip
def test_what_is_not_spdy3_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(spdy.ProtocolError):
        spdy.FrameDecoder().feed(wire)


def test_unknown_control_frames_are_skipped() -> None:
    unknown = struct.pack(">HHB", 0x8003, 0x77, 0) + (2).to_bytes(3, "big") + b"\0\0"
    assert spdy.FrameDecoder().feed(unknown + spdy.FrameEncoder().encode(spdy.Ping(7))) == [spdy.Ping(7)]
