#!/usr/bin/python3
"""zmq_relay.py -- copy every MoRIIO discovery registration to several routers (Debian's python3-zmq).

vLLM's MoRIIO connector, and pdlink-node, ping exactly one router (proxy_ip:proxy_ping_port). To put
two routers in front of the same instances (tests/pypi/test_hash_parity.py), this binds a ROUTER
socket where the instances ping and forwards each registration payload, unchanged, from one DEALER
per target router, exactly as an instance would send it. Usage:
    zmq_relay.py --bind 127.0.0.1:PORT --to 127.0.0.1:A --to 127.0.0.1:B [--port-file F]
With PORT 0 the bound port is written to --port-file. Runs until SIGTERM.
"""
import argparse
import signal
import sys

import zmq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", required=True)
    ap.add_argument("--to", action="append", required=True)
    ap.add_argument("--port-file")
    a = ap.parse_args()
    ctx = zmq.Context()
    front = ctx.socket(zmq.ROUTER)
    host, port = a.bind.rsplit(":", 1)
    if port == "0":
        bound = front.bind_to_random_port(f"tcp://{host}")
    else:
        front.bind(f"tcp://{a.bind}")
        bound = int(port)
    outs = []
    for t in a.to:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{t}")
        outs.append(s)
    if a.port_file:
        with open(a.port_file + ".tmp", "w") as f:
            f.write(str(bound))
        import os
        os.rename(a.port_file + ".tmp", a.port_file)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        parts = front.recv_multipart()
        # [identity, payload]: the payload is the registration, as the router reads it.
        for s in outs:
            s.send(parts[-1])


if __name__ == "__main__":
    main()
