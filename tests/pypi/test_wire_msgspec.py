"""test_wire_msgspec.py -- pdlink's handshake metadata against msgspec, the library upstream MoRIIO encodes
and decodes it with (MoRIIOAgentMetadata is a msgspec Struct, omit_defaults=True, dict=True, decoded with
msgspec.msgpack.Decoder(MoRIIOAgentMetadata); docs/protocol.md#handshake).

Both directions, through pdlink's C codec (the filter unit_test_wire_interop --reencode meta):
  * what an upstream peer sends (msgspec's encoding of the Struct) is accepted and written back
    byte for byte the same: pdlink encodes the upstream fields exactly as msgspec does;
  * what pdlink sends, including its additive fields (tp_size, layout, …), decodes with upstream's
    typed msgspec Decoder to the same upstream fields (msgspec ignores the extra keys).
"""
import os
import random
import struct
import subprocess
import tempfile

import msgspec

BUILD = os.environ.get("PDLINK_BUILD_DIR", "build")
FILTER = os.path.join(BUILD, "tests", "unit_test_wire_interop")
RNG = random.Random(20261203)


class MoRIIOAgentMetadata(msgspec.Struct, omit_defaults=True, dict=True):
    engine_id: str
    agent_metadata: bytes
    kv_caches_base_addr: list[int]
    num_blocks: int
    block_len: int
    attn_backend_name: str


def reencode_all(frames):
    """pdlink's re-encoding of each frame (the filter reads [u32 len][bytes] frames and writes
    [i32 status][u32 len][bytes] for each, native byte order)."""
    with tempfile.TemporaryDirectory() as d:
        i, o = os.path.join(d, "in"), os.path.join(d, "out")
        with open(i, "wb") as f:
            for fr in frames:
                f.write(struct.pack("=I", len(fr)) + fr)
        subprocess.run([FILTER, "--reencode", "meta", i, o], check=True, timeout=120)
        out, data, pos = [], open(o, "rb").read(), 0
        while pos < len(data):
            st, n = struct.unpack_from("=iI", data, pos)
            pos += 8
            assert st == 0, f"pdlink refused frame {len(out)} (status {st}): {frames[len(out)][:80]!r}"
            out.append(data[pos:pos + n])
            pos += n
        assert len(out) == len(frames)
        return out


def random_meta():
    return MoRIIOAgentMetadata(
        engine_id=f"10.0.{RNG.randint(0, 255)}.{RNG.randint(1, 254)}:{RNG.randint(1024, 65535)}",
        agent_metadata=RNG.randbytes(RNG.choice([0, 5, 40, 300, 65536])),  # pdlink: at most 64 KiB
        kv_caches_base_addr=[RNG.randint(0, (1 << RNG.choice([7, 16, 32, 48, 64])) - 1)
                             for _ in range(RNG.randint(0, 160))],
        num_blocks=RNG.randint(0, 1 << RNG.choice([7, 16, 31, 40])),
        block_len=RNG.randint(0, 1 << RNG.choice([7, 16, 31])),
        attn_backend_name=RNG.choice(["", "TRITON_ATTN", "ROCM_AITER_FA", "x" * 40]))


def test_upstream_encoding_round_trips_byte_for_byte():
    assert os.access(FILTER, os.X_OK), f"{FILTER} not built"
    enc = msgspec.msgpack.Encoder()
    metas = [random_meta() for _ in range(300)]
    frames = [enc.encode(m) for m in metas]
    for m, sent, back in zip(metas, frames, reencode_all(frames)):
        assert back == sent, m


def test_pdlink_extensions_decode_with_upstreams_decoder():
    dec = msgspec.msgpack.Decoder(MoRIIOAgentMetadata)
    metas, frames = [], []
    for _ in range(150):
        m = random_meta()
        # pdlink's own metadata: the upstream fields plus its additive ones, built by msgspec as a dict
        # and canonicalised by pdlink's codec, i.e. the bytes a pdlink rank sends.
        d = msgspec.structs.asdict(m)
        tp = RNG.choice([1, 4, 8])
        d.update({"pdlink_version": "0.1.0", "tp_size": tp, "tp_rank": RNG.randint(0, tp - 1), "dp_rank": 0,
                  "num_layers": 32, "total_num_kv_heads": 8, "head_dim": 128, "kv_elem_size": 2,
                  "block_size": 16, "layout": "hnd", "is_mla": False})
        metas.append(m)
        frames.append(msgspec.msgpack.encode(d))
    for m, sent in zip(metas, reencode_all(frames)):
        assert b"pdlink_version" in sent and dec.decode(sent) == m
