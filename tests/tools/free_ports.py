#!/usr/bin/python3
"""free_ports.py -- free TCP ports for the shell and Python tests, by the one rule of src/app/ports.h.

Ports are taken outside the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), where
the kernel never hands a port to an outgoing connection or a port-0 listener: from the larger of
[10000, low - 1] and [high + 1, 65535] (10000-32767 with Linux's default range). A whole range is proved
free by binding (and listening on) every port of it without SO_REUSEADDR, all held until the last one is
bound, so a port with a listener or with connections in TIME_WAIT counts as busy. The start is random,
so tests running side by side (ctest -j) rarely probe the same ports; a probed port can still be taken
before the test's program binds it, so callers retry with a new range when the program says "Address
already in use". A program that can bind port 0 and report it (--port 0 --port-file) needs no probe.
src/common/ports.c implements the same rule for C; keep the two in step.

Command line:  free_ports.py COUNT [COUNT...]
  prints one base port per COUNT, the ranges adjacent and disjoint (carved from one free range), e.g.
  `read -r http hs nt < <(free_ports.py 1 4 4)`. Exits 1 with a message when no range is free.
As a module:   free_range(count) -> base, ephemeral_range(), safe_window(eph).
"""
import random
import socket
import sys

FLOOR = 10000                      # PDL_PORTS_FLOOR
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default, when /proc cannot be read
TAKE_MAX = 512                      # PDL_PORTS_TAKE_MAX


def ephemeral_range():
    """The kernel's ephemeral range (lo, hi), inclusive; Linux's default if unreadable or malformed."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return (lo, hi) if 1 <= lo <= hi <= 65535 else EPHEMERAL_DEFAULT


def safe_window(eph):
    """(lo, hi) inclusive: the larger side outside `eph`, from FLOOR up; lo > hi when there is none."""
    below = (FLOOR, eph[0] - 1)
    above = (max(eph[1] + 1, FLOOR), 65535)
    return below if below[1] - below[0] >= above[1] - above[0] else above


def range_free(base, count, host="127.0.0.1"):
    socks = []
    try:
        for port in range(base, base + count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, port))
            s.listen(1)
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def free_range(count, host="127.0.0.1", tries=2000):
    """First port of `count` consecutive ports free on `host` now; RuntimeError naming the window if none."""
    lo, hi = safe_window(ephemeral_range())
    if not 1 <= count <= min(TAKE_MAX, hi - lo + 1):
        raise ValueError("free_ports: range of %d ports requested (1..%d, window %d-%d)" % (count, TAKE_MAX, lo, hi))
    rng = random.SystemRandom()
    for _ in range(tries):
        base = rng.randrange(lo, hi - count + 2)
        if range_free(base, count, host):
            return base
    raise RuntimeError("free_ports: no %d consecutive free TCP ports on %s in %d-%d (outside the kernel's "
                       "ephemeral range) after %d tries" % (count, host, lo, hi, tries))


def main(argv):
    try:
        counts = [int(a) for a in argv]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        sys.stderr.write("usage: free_ports.py COUNT [COUNT...]  (each COUNT >= 1)\n")
        return 2
    try:
        base = free_range(sum(counts))
    except (RuntimeError, ValueError) as e:
        sys.stderr.write("%s\n" % e)
        return 1
    bases = []
    for n in counts:
        bases.append(base)
        base += n
    print(" ".join(str(b) for b in bases))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
