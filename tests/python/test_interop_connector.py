#!/usr/bin/python3
"""test_interop_connector.py -- interop between pdlink's connector and an independent Python MoRIIO peer.

1. moriio_peer.py's own codec checks against known example bytes and
   upstream's decoding order (msgpack map first, then a UTF-8 completion id).
2. The live part: tests/integration/test_connector_pyinterop.c starts a pdlink producer (and consumer)
   and runs moriio_peer.py against them (handshake + both payloads, typed and legacy releases counted
   by pdlink, releases sent by a pdlink consumer decoded by the peer). This script runs that program
   from the build directory, so the interop also shows up as a Python test.
Exit 77 (skip) when python3-zmq / python3-msgpack or the built program are missing.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    try:
        import msgpack  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as e:
        print("skip: %s" % e)
        return 77
    peer = os.path.join(HERE, "moriio_peer.py")
    r = subprocess.run([sys.executable, peer, "selftest"], capture_output=True, text=True, timeout=60)
    print(r.stdout.strip())
    if r.returncode != 0:
        print("moriio_peer.py selftest failed: %s %s" % (r.stdout, r.stderr))
        return 1
    build = os.environ.get("PDLINK_BUILD_DIR")
    prog = os.path.join(build, "tests", "integration_test_connector_pyinterop") if build else None
    if not prog or not os.access(prog, os.X_OK):
        print("skip: %s not built" % prog)
        return 77
    env = dict(os.environ)
    env.setdefault("PDLINK_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
    r = subprocess.run([prog], capture_output=True, text=True, timeout=240, env=env)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0 or "[  PASSED  ] 2 test(s)." not in r.stdout + r.stderr:
        print("interop program failed (exit %d)" % r.returncode)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
