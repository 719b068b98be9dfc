#!/usr/bin/python3
"""moriio_peer.py -- an independent MoRIIO control-plane peer, written from pdlink's docs/protocol.md
and docs/wire.md, with pyzmq and msgpack only.

It behaves the way the upstream Python connector does on the wire:
  * handshake client: a DEALER sends the one frame b"get_meta_msg" and expects two replies, each
    [b"", payload]: the agent metadata map, then the layer map (layer name -> list of bin);
  * release sender: typed releases are msgpack.dumps({"type": "release", "transfer_id": id,
    "consumer_tp_size": n}) (key order type, transfer_id, extra fields); legacy completions are the
    UTF-8 bytes of the transfer id;
  * producer front: serves the handshake (payloads fetched from a real producer, optionally with the
    pdlink keys removed so it looks like an upstream peer) and receives the releases a consumer sends
    on its notify ROUTER, decoding them as upstream's _handle_message would.

Sub-commands print one JSON object per line on stdout; exit status 0 means every check passed.
"""
import argparse
import json
import os
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import free_ports  # noqa: E402 (the tests' one port rule: outside the kernel's ephemeral range)

GET_META_MSG = b"get_meta_msg"
POP_DONE_RECV = b"pop_done_recv"
AGENT_KEYS = ("engine_id", "agent_metadata", "kv_caches_base_addr", "num_blocks", "block_len", "attn_backend_name")
PDLINK_KEYS = ("pdlink_version", "tp_size", "tp_rank", "dp_rank", "num_layers", "total_num_kv_heads", "head_dim",
               "kv_elem_size", "block_size", "layout", "is_mla")


def fail(msg):
    print(json.dumps({"error": msg}), flush=True)
    sys.exit(1)


def port_offset(dp_rank, tp_size, tp_rank):
    return dp_rank * tp_size + tp_rank


def fetch_meta(ctx, host, port, timeout_ms=5000):
    """One handshake, upstream style: a fresh DEALER, get_meta_msg, two [b"", payload] replies."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect("tcp://%s:%d" % (host, port))
    sock.send(GET_META_MSG)
    payloads = []
    for _ in range(2):
        if not sock.poll(timeout_ms):
            fail("handshake %s:%d: no reply" % (host, port))
        frames = sock.recv_multipart()
        if len(frames) != 2 or frames[0] != b"":
            fail("handshake %s:%d: reply of %d frames" % (host, port, len(frames)))
        payloads.append(frames[1])
    sock.close()
    return payloads


def decode_meta(payload):
    meta = msgpack.unpackb(payload, raw=False)
    if not isinstance(meta, dict):
        fail("agent metadata is not a map")
    for k in AGENT_KEYS:
        if k not in meta:
            fail("agent metadata lacks %s" % k)
    if not isinstance(meta["agent_metadata"], bytes):
        fail("agent_metadata is not bin")
    if not isinstance(meta["kv_caches_base_addr"], list) or not all(isinstance(a, int) for a in meta["kv_caches_base_addr"]):
        fail("kv_caches_base_addr is not an array of int")
    for k in ("num_blocks", "block_len"):
        if not isinstance(meta[k], int) or meta[k] <= 0:
            fail("%s is not a positive int" % k)
    return meta


def decode_layers(payload):
    layers = msgpack.unpackb(payload, raw=False)
    if not isinstance(layers, dict) or not layers:
        fail("layer map is not a non-empty map")
    for name, descs in layers.items():
        if not isinstance(name, str) or not isinstance(descs, list) or not descs:
            fail("layer map entry %r is not str -> non-empty array" % (name,))
        if not all(isinstance(d, bytes) for d in descs):
            fail("layer %s: descriptors are not bin" % name)
    return layers


def typed_release(transfer_id, consumer_tp_size, extra=None):
    # send_notify(...): {"type": T, "transfer_id": id} then payload.update(fields)
    payload = {"type": "release", "transfer_id": transfer_id}
    payload.update({"consumer_tp_size": consumer_tp_size})
    if extra:
        payload.update(extra)
    return msgpack.dumps(payload)


def handle_message(msg):
    """Upstream's decoding order (docs/protocol.md#legacy-completions): msgpack map first, else a UTF-8 completion id."""
    try:
        data = msgpack.loads(msg, raw=False)
        if isinstance(data, dict):
            return data
    except (msgpack.ExtraData, msgpack.UnpackException, ValueError):
        pass
    return {"legacy": msg.decode("utf-8")}


def cmd_selftest(_args):
    want = bytes.fromhex("83a474797065a772656c65617365ab7472616e736665725f6964a474782d31"
                         "b0636f6e73756d65725f74705f73697a6508")
    got = typed_release("tx-1", 8)
    if got != want:
        fail("release encoding %s != reference %s" % (got.hex(), want.hex()))
    if handle_message(b"tx-plain") != {"legacy": "tx-plain"}:
        fail("legacy decoding")
    if handle_message(b"7") != {"legacy": "7"}:
        fail("1-byte legacy id must fall through to the string path")
    print(json.dumps({"selftest": "ok"}), flush=True)


def cmd_interop(args):
    """Handshake every rank of a pdlink producer, then send typed and legacy releases to each."""
    ctx = zmq.Context()
    result = {"ranks": []}
    for r in range(args.tp):
        p1, p2 = fetch_meta(ctx, args.host, args.hs_port + port_offset(0, args.tp, r))
        meta, layers = decode_meta(p1), decode_layers(p2)
        if "pdlink_version" not in meta:
            fail("rank %d: pdlink keys missing" % r)
        for k in PDLINK_KEYS:
            if k not in meta:
                fail("rank %d: pdlink key %s missing" % (r, k))
        if meta["tp_rank"] != r or meta["tp_size"] != args.tp:
            fail("rank %d: handshake says tp_rank %d of %d" % (r, meta["tp_rank"], meta["tp_size"]))
        if len(layers) != meta["num_layers"] or len(meta["kv_caches_base_addr"]) != meta["num_layers"]:
            fail("rank %d: %d layers in the map, num_layers %d" % (r, len(layers), meta["num_layers"]))
        result["ranks"].append({"engine_id": meta["engine_id"], "num_blocks": meta["num_blocks"],
                                "block_len": meta["block_len"], "layers": len(layers), "layout": meta["layout"],
                                "head_dim": meta["head_dim"]})
    # The legacy handshake request is accepted and ignored (with the frame upstream sends after it).
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 1000)
    s.connect("tcp://%s:%d" % (args.host, args.hs_port))
    s.send(POP_DONE_RECV)
    s.send(b"some-req-id")
    s.close()
    for r in range(args.tp):
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 5000)
        d.connect("tcp://%s:%d" % (args.host, args.notify_port + port_offset(0, args.tp, r)))
        d.send(typed_release(args.typed, 1))
        d.send(args.legacy.encode("utf-8"))
        d.close()
    result["sent"] = 2 * args.tp
    print(json.dumps(result), flush=True)
    ctx.term()


def cmd_front(args):
    """A producer front: serves the handshake of a real producer rank 0 (pdlink keys stripped with
    --strip-pdlink, re-encoded by Python's msgpack), receives the consumer's releases, decodes them,
    forwards them to the real producer's notify port so it frees its blocks, and prints them."""
    ctx = zmq.Context()
    p1, p2 = fetch_meta(ctx, args.producer_host, args.producer_hs_port)
    meta, layers = decode_meta(p1), decode_layers(p2)
    if args.strip_pdlink:
        meta = {k: meta[k] for k in AGENT_KEYS}  # exactly upstream's MoRIIOAgentMetadata fields, in order
    p1 = msgpack.dumps(meta)
    p2 = msgpack.dumps(layers)
    # Bound directly at random ports of the safe window and reported, so there is no probe to race.
    lo, hi = free_ports.safe_window(free_ports.ephemeral_range())
    hs = ctx.socket(zmq.ROUTER)
    hs.setsockopt(zmq.LINGER, 0)
    hs_port = hs.bind_to_random_port("tcp://127.0.0.1", min_port=lo, max_port=hi + 1, max_tries=1000)
    nt = ctx.socket(zmq.ROUTER)
    nt.setsockopt(zmq.LINGER, 0)
    nt_port = nt.bind_to_random_port("tcp://127.0.0.1", min_port=lo, max_port=hi + 1, max_tries=1000)
    fwd = ctx.socket(zmq.DEALER)
    fwd.setsockopt(zmq.LINGER, 5000)
    fwd.connect("tcp://%s:%d" % (args.producer_host, args.producer_notify_port))
    print(json.dumps({"handshake_port": hs_port, "notify_port": nt_port}), flush=True)
    poller = zmq.Poller()
    poller.register(hs, zmq.POLLIN)
    poller.register(nt, zmq.POLLIN)
    got = 0
    served = 0
    deadline = time.time() + args.timeout
    while got < args.expect and time.time() < deadline:
        for sock, _ in poller.poll(200):
            frames = sock.recv_multipart()
            if sock is hs:
                if frames[1:] == [GET_META_MSG]:
                    hs.send_multipart([frames[0], b"", p1])
                    hs.send_multipart([frames[0], b"", p2])
                    served += 1
                continue
            if len(frames) != 2:
                fail("notify message of %d frames" % len(frames))
            msg = handle_message(frames[1])
            if msg.get("type") not in ("release",):
                fail("unexpected notify message %r (an upstream producer would kill its listener)" % (msg,))
            if not isinstance(msg.get("transfer_id"), str) or int(msg.get("consumer_tp_size", 1)) <= 0:
                fail("bad release %r" % (msg,))
            print(json.dumps({"release": msg}), flush=True)
            fwd.send(frames[1])
            got += 1
    print(json.dumps({"done": got, "handshakes_served": served}), flush=True)
    fwd.close()
    ctx.destroy(linger=0)
    sys.exit(0 if got == args.expect else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest")
    a = sub.add_parser("interop")
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--hs-port", type=int, required=True)
    a.add_argument("--notify-port", type=int, required=True)
    a.add_argument("--tp", type=int, required=True)
    a.add_argument("--typed", required=True)
    a.add_argument("--legacy", required=True)
    f = sub.add_parser("front")
    f.add_argument("--producer-host", default="127.0.0.1")
    f.add_argument("--producer-hs-port", type=int, required=True)
    f.add_argument("--producer-notify-port", type=int, required=True)
    f.add_argument("--strip-pdlink", action="store_true")
    f.add_argument("--expect", type=int, required=True)
    f.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    {"selftest": cmd_selftest, "interop": cmd_interop, "front": cmd_front}[args.cmd](args)


if __name__ == "__main__":
    main()
