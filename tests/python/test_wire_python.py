#!/usr/bin/python3
"""test_wire_python.py -- pdlink's C codecs against msgpack-python, the library upstream MoRIIO uses.

Random messages are built as Python dicts and packed with msgpack.dumps, in shuffled key order; the C
codec (through the re-encoding filter unit_test_wire_interop --reencode) must accept each one and write
back exactly msgpack.dumps of the same dict in pdlink's canonical key order, i.e. the bytes an upstream
peer produces. Truncated and corrupted frames must be refused. Skips (77) when the filter is not built.
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

try:
    import msgpack
except ImportError:
    print("python3-msgpack is not installed")
    sys.exit(77)

BUILD = os.environ.get("PDLINK_BUILD_DIR", "build")
FILTER = os.path.join(BUILD, "tests", "unit_test_wire_interop")
RNG = random.Random(20261202)

RELEASE_ORDER = ["type", "transfer_id", "consumer_tp_size", "consumer_tp_rank", "status",
                 "producer_tp_size", "producer_tp_rank"]
BLOCKS_ORDER = ["req_id", "transfer_id", "block_notify_list", "decode_rank", "type"]
META_ORDER = ["engine_id", "agent_metadata", "kv_caches_base_addr", "num_blocks", "block_len",
              "attn_backend_name", "pdlink_version", "tp_size", "tp_rank", "dp_rank", "num_layers",
              "total_num_kv_heads", "head_dim", "kv_elem_size", "block_size", "layout", "is_mla"]
REG_ORDER = ["type", "http_address", "zmq_address", "dp_size", "tp_size", "transfer_mode"]


def ordered(d, order):
    return {k: d[k] for k in order if k in d}


def shuffled(d):
    items = list(d.items())
    RNG.shuffle(items)
    return dict(items)


def rand_text(lo, hi):
    n = RNG.randint(lo, hi)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_.:é"
    s = "".join(RNG.choice(alphabet) for _ in range(n))
    while len(s.encode()) > hi:  # 'é' is two bytes
        s = s[:-1]
    return s or "x"


def rand_uint(bits):
    width = RNG.choice([7, 8, 16, 32, bits])
    return RNG.randint(0, (1 << min(width, bits)) - 1)


def gen_msg():
    kind = RNG.choice(["release", "keepalive", "write_done", "remote_blocks"])
    if kind == "remote_blocks":
        d = {"req_id": rand_text(1, 300), "transfer_id": rand_text(1, 512),
             "block_notify_list": [rand_uint(32) for _ in range(RNG.randint(1, 600))],
             "decode_rank": RNG.randint(0, 70000), "type": "remote_blocks"}
        if RNG.random() < 0.2:
            del d["transfer_id"]
        return d, BLOCKS_ORDER
    d = {"type": kind, "transfer_id": rand_text(1, 512)}
    if kind != "write_done":
        size = RNG.choice([1, 2, 4, 8, 200, 300, 65536])
        d["consumer_tp_size"] = size
        if RNG.random() < 0.5:
            d["consumer_tp_rank"] = RNG.randint(0, size - 1)
    if RNG.random() < 0.5:
        d["status"] = RNG.choice(["ok", "failed"])
    if RNG.random() < 0.5:
        psize = RNG.choice([1, 4, 300])
        d["producer_tp_size"] = psize
        if RNG.random() < 0.5:
            d["producer_tp_rank"] = RNG.randint(0, psize - 1)
    return d, RELEASE_ORDER


def gen_meta():
    d = {"engine_id": rand_text(1, 512), "agent_metadata": RNG.randbytes(RNG.choice([0, 5, 40, 300, 65536])),
         "kv_caches_base_addr": [rand_uint(64) for _ in range(RNG.randint(0, 200))],
         "num_blocks": rand_uint(63), "block_len": rand_uint(63), "attn_backend_name": rand_text(0, 127)}
    if RNG.random() < 0.6:
        tp = RNG.choice([1, 2, 4, 8, 256])
        d.update({"pdlink_version": "0.1.0", "tp_size": tp, "tp_rank": RNG.randint(0, tp - 1),
                  "dp_rank": RNG.randint(0, 3), "num_layers": RNG.randint(0, 200),
                  "total_num_kv_heads": RNG.randint(1, 128), "head_dim": RNG.choice([64, 128, 576]),
                  "kv_elem_size": RNG.choice([1, 2]), "block_size": RNG.choice([1, 16, 256]),
                  "layout": RNG.choice(["hnd", "nhd"]), "is_mla": RNG.random() < 0.5})
        for k in ["tp_rank", "dp_rank", "num_layers", "layout"]:
            if RNG.random() < 0.2:
                del d[k]
        d.setdefault("is_mla", False)
    return d, META_ORDER


def gen_lmap():
    d = {}
    for i in range(RNG.randint(0, 40)):
        d[f"model.layers.{i}.{rand_text(1, 20)}"] = [RNG.randbytes(RNG.choice([0, 3, 40, 300]))
                                                      for _ in range(RNG.randint(1, 16))]
    return d, None


def gen_reg():
    def host():
        return RNG.choice(["10.0.0.%d" % RNG.randint(1, 254), "::1", "fd00::%x" % RNG.randint(1, 4095),
                           "node-%d.example" % RNG.randint(0, 99)])
    h = host()
    http = ("[%s]" % h if ":" in h else h) + ":%d" % RNG.randint(1, 65535)
    d = {"type": RNG.choice("PD"), "http_address": http,
         "zmq_address": "host:%s,handshake:%d,notify:%d" % (host(), RNG.randint(1, 65535), RNG.randint(1, 65535)),
         "dp_size": RNG.randint(1, 300), "tp_size": RNG.choice([1, 2, 4, 8, 65536]),
         "transfer_mode": RNG.choice(["READ", "WRITE"])}
    return d, REG_ORDER


def run_filter(kind, frames):
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        with open(src, "wb") as f:
            for fr in frames:
                f.write(struct.pack("<I", len(fr)) + fr)
        subprocess.run([FILTER, "--reencode", kind, src, dst], check=True, timeout=120)
        out = []
        with open(dst, "rb") as f:
            data = f.read()
        pos = 0
        while pos < len(data):
            st, n = struct.unpack_from("<iI", data, pos)
            pos += 8
            out.append((st, data[pos:pos + n]))
            pos += n
        assert len(out) == len(frames), (len(out), len(frames))
        return out


def check_kind(kind, gen, count):
    dicts = [gen() for _ in range(count)]
    frames = [msgpack.dumps(shuffled(d)) for d, _ in dicts]
    results = run_filter(kind, frames)
    for (d, order), frame, (st, got) in zip(dicts, frames, results):
        # A layer map keeps the sender's order; the other messages come out in pdlink's canonical order.
        want = msgpack.dumps(ordered(d, order)) if order else frame
        assert st == 0, f"{kind}: status {st} for {d!r:.200}"
        assert got == want, f"{kind}: bytes differ for {d!r:.200}\n got {got.hex()[:200]}\nwant {want.hex()[:200]}"
        assert msgpack.loads(got) == (ordered(d, order) if order else d)
    # Every truncation and a trailing byte are refused (sampled for speed).
    bad = []
    for fr in frames[:40]:
        for cut in sorted(set(RNG.randint(0, len(fr) - 1) for _ in range(8))):
            bad.append(fr[:cut])
        bad.append(fr + b"\xc0")
    for st, _ in run_filter(kind, bad):
        assert st != 0, f"{kind}: a truncated or extended frame was accepted"
    return count, len(bad)


def check_legacy():
    ids = [rand_text(1, 512).encode() for _ in range(200)] + [b"7", b"tx-1"]
    for (st, got), want in zip(run_filter("msg", ids), ids):
        assert st == 0 and got == want, (st, got, want)
    hostile = [b"", b"\xff", b"tx\x00", b"\xed\xa0\x80", b"a" * 513, msgpack.dumps({"type": "nope"}),
               msgpack.dumps({"type": "release", "transfer_id": "t", "consumer_tp_size": 0}),
               msgpack.dumps({"type": "release", "transfer_id": "t", "consumer_tp_size": -1}),
               msgpack.dumps({"type": "remote_blocks", "req_id": "r", "block_notify_list": []}),
               msgpack.dumps({"type": "release", "transfer_id": 5}),
               msgpack.dumps({"transfer_id": "t"})]
    for st, _ in run_filter("msg", hostile):
        assert st != 0
    return len(ids), len(hostile)


def main():
    if not os.access(FILTER, os.X_OK):
        print(f"skip: {FILTER} not built")
        return 77
    totals = {}
    totals["msg"] = check_kind("msg", gen_msg, 1500)
    totals["meta"] = check_kind("meta", gen_meta, 300)
    totals["lmap"] = check_kind("lmap", gen_lmap, 100)
    totals["reg"] = check_kind("reg", gen_reg, 800)
    totals["legacy"] = check_legacy()
    for k, (good, bad) in totals.items():
        print(f"{k}: {good} frames byte-identical to msgpack-python, {bad} malformed frames refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
