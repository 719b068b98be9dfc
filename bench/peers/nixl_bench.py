#!/usr/bin/env python3
"""nixl_bench.py -- NIXL (PyPI nixl, its UCX backend) moving DRAM to DRAM between two agents in two
processes on this host, measured as `pdlink bench` measures pdlink (peercommon.py). The UCX transport is
UCX's own choice, narrowed by UCX_TLS / UCX_NET_DEVICES as for ucx_perftest and pdlink's ucx engine.

Per point the descriptor lists are prepared once (prep_xfer_dlist on both sides) and one transfer
request is made from them (make_prepped_xfer) and posted again for every batch, which is NIXL's fast
path (what nixlbench does); completion is polled with check_xfer_state while NIXL's progress thread
serves the target.

Runs from the venv of scripts/install-peers. NIXL's `nixl` meta package only chooses between its CUDA
12 and 13 wheels (and pulls torch and CUDA for that choice); the API is the nixl-cu12 wheel's, imported
here directly, with no CUDA present (DRAM only).
"""
import base64
import os
import sys

import peercommon as pc

try:
    from nixl_cu12._api import nixl_agent, nixl_agent_config
except ImportError as e:
    sys.exit("nixl_bench: cannot import NIXL (%s); install it with scripts/install-peers and run this with "
             "build/peers-venv/bin/python" % e)

# UCX 1.13+ keeps its shared-memory transports out of endpoints with peer-failure handling, which NIXL
# always asks for, unless these are set (docs/ucx.md, "Peer failure on shared memory"). Set before the
# agent creates its UCX context; never over the user's own value.
for var in ("UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING"):
    os.environ.setdefault(var, "y")
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


def agent(name, progress_thread):
    return nixl_agent(name, nixl_agent_config(enable_prog_thread=progress_thread, backends=["UCX"]))


def serve(args):
    ag = agent("target", True)
    region = pc.Region(args.region)
    region.fill_pattern()
    ag.register_memory([(region.addr, region.size, 0, "")], "DRAM")
    pc.serve_ready({"meta": base64.b64encode(ag.get_agent_metadata()).decode(), "addr": region.addr})


def main():
    args = pc.arg_parser("nixl_bench.py", "NIXL (UCX backend) DRAM-to-DRAM transfers").parse_args()
    if args.serve:
        serve(args)
        os._exit(0)  # NIXL 1.5.1's teardown at interpreter exit crashes at times; nothing is left to flush
    points = pc.grid(args)
    size = max(b * n for b, n in points)
    target, info = pc.start_target(args, size)
    ag = agent("initiator", False)
    local = pc.Region(size)
    if args.op == "write":
        local.fill_pattern()
    ag.register_memory([(local.addr, local.size, 0, "")], "DRAM")
    peer = ag.add_remote_agent(base64.b64decode(info["meta"]))
    tls = os.environ.get("UCX_TLS", "UCX default")
    tcp = tls == "tcp"
    rows, failed = [], None
    for block, batch in points:
        loffs, roffs = pc.layout(block, batch)
        lside = ag.prep_xfer_dlist("NIXL_INIT_AGENT", [(local.addr + o, block, 0) for o in loffs], "DRAM")
        rside = ag.prep_xfer_dlist(peer, [(info["addr"] + o, block, 0) for o in roffs], "DRAM")
        idx = list(range(batch))
        h = ag.make_prepped_xfer(args.op.upper(), lside, idx, rside, idx)

        def post_and_wait():
            st = ag.transfer(h)
            while st == "PROC":
                st = ag.check_xfer_state(h)
            if st != "DONE":
                raise RuntimeError("transfer state %s" % st)

        try:
            rows.append(pc.point(args, local, post_and_wait, block, batch, tcp))
        except RuntimeError as e:
            failed = str(e)
            break
        finally:
            ag.release_xfer_handle(h)
            ag.release_dlist_handle(lside)
            ag.release_dlist_handle(rside)
    pc.stop_target(target)
    pc.report("nixl", "UCX_TLS=" + tls, args.op, rows, args)
    if failed:
        print("nixl_bench: %s" % failed, file=sys.stderr)
    sys.stdout.flush()
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
