#!/usr/bin/env python3
"""mooncake_bench.py -- Mooncake Transfer Engine (PyPI mooncake-transfer-engine, non-CUDA wheel) moving
DRAM to DRAM over its TCP transport between two engines in two processes on this host, measured as
`pdlink bench` measures pdlink (peercommon.py).

Both engines start with the P2PHANDSHAKE metadata mode (no etcd or HTTP metadata server: a peer is
named host:rpc_port and its segment is fetched by a handshake on first use) and the "tcp" protocol on
127.0.0.1. Memory is registered with register_memory; every batch is one batch_transfer_sync_read (or
_write) call of `batch` descriptors, which submits them together and returns when all are done.

Runs from the venv of scripts/install-peers, which installs the project's non-CUDA wheel
(mooncake-transfer-engine-non-cuda, same version as mooncake-transfer-engine): this host has no GPU.
"""
import os
import sys

import peercommon as pc

try:
    from mooncake.engine import TransferEngine
except ImportError as e:
    sys.exit("mooncake_bench: cannot import Mooncake (%s); install it with scripts/install-peers and run this "
             "with build/peers-venv/bin/python" % e)

HOST = "127.0.0.1"


def engine():
    te = TransferEngine()
    rc = te.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        sys.exit("mooncake_bench: TransferEngine.initialize(%r, 'P2PHANDSHAKE', 'tcp', '') returned %d" % (HOST, rc))
    return te


def register(te, region):
    rc = te.register_memory(region.addr, region.size)
    if rc != 0:
        sys.exit("mooncake_bench: register_memory of %d bytes returned %d" % (region.size, rc))


def serve(args):
    te = engine()
    region = pc.Region(args.region)
    region.fill_pattern()
    register(te, region)
    pc.serve_ready({"peer": "%s:%d" % (HOST, te.get_rpc_port()), "addr": region.addr})


def main():
    args = pc.arg_parser("mooncake_bench.py", "Mooncake Transfer Engine (TCP transport) DRAM-to-DRAM transfers").parse_args()
    if args.serve:
        serve(args)
        os._exit(0)  # the engine's threads need no orderly teardown once the initiator is gone
    points = pc.grid(args)
    size = max(b * n for b, n in points)
    target, info = pc.start_target(args, size)
    te = engine()
    local = pc.Region(size)
    if args.op == "write":
        local.fill_pattern()
    register(te, local)
    xfer = te.batch_transfer_sync_read if args.op == "read" else te.batch_transfer_sync_write
    rows, failed = [], None
    for block, batch in points:
        loffs, roffs = pc.layout(block, batch)
        laddrs = [local.addr + o for o in loffs]
        raddrs = [info["addr"] + o for o in roffs]
        lens = [block] * batch

        def post_and_wait():
            rc = xfer(info["peer"], laddrs, raddrs, lens)
            if rc != 0:
                raise RuntimeError("batch_transfer_sync_%s returned %d" % (args.op, rc))

        try:
            rows.append(pc.point(args, local, post_and_wait, block, batch, True))
        except RuntimeError as e:
            failed = str(e)
            break
    pc.stop_target(target)
    pc.report("mooncake", "tcp", args.op, rows, args)
    if failed:
        print("mooncake_bench: %s" % failed, file=sys.stderr)
    sys.stdout.flush()
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
