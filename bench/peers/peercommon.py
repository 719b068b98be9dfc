"""peercommon.py -- what the peer drivers (nixl_bench.py, mooncake_bench.py) share, so that NIXL and
Mooncake are measured exactly as `pdlink bench` measures pdlink (bench/bench_engine.c):

* two processes: the initiator starts the target (this same program with --serve) and reads its
  "READY {json}" line; the target owns the remote region, fills it with a known pattern and waits;
* a point is `batch` descriptors of `block` bytes, local blocks in order and remote blocks in reverse
  order (no two descriptors merge), points with block * batch above --max-batch-bytes skipped;
* stop-and-wait: post one batch, wait for it, post the next; a whole-loop timer over the timed batches,
  right after warm-up batches (memory idle for a few seconds is several times slower in this VM), and
  for READ the bytes of the first batch of every point are verified (WRITE is not verified);
* both regions are pre-faulted before anything is timed (first touch runs at ~0.3 GB/s in this VM).

GB/s is 10^9 bytes/s. Only the standard library is used here; the peer libraries are imported by the
drivers, from the venv scripts/install-peers makes.
"""
import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import time

PATTERN_PERIOD = 251  # a prime, so a block read from the wrong offset cannot match by accident
DEFAULT_BLOCKS = "4K,64K,1M,16M"
DEFAULT_BATCHES = "1,16"
FULL_BLOCKS = "4K,16K,64K,256K,1M,4M,16M,64M"
FULL_BATCHES = "1,4,16,64,256,1024"


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    u = s[-1:].upper()
    try:
        return int(s[:-1]) * units[u] if u in units else int(s)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s': expected a size like 4K, 1M or 4096" % s)


def parse_list(s, conv):
    try:
        return [conv(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError("'%s': expected a comma-separated list" % s)


def fmt_size(v):
    for shift, u in ((30, "G"), (20, "M"), (10, "K")):
        if v % (1 << shift) == 0:
            return "%d%s" % (v >> shift, u)
    return str(v)


def arg_parser(prog, what):
    p = argparse.ArgumentParser(
        prog=prog,
        description="%s between two processes on this host, the way `pdlink bench` measures pdlink "
        "(bench/peers/peercommon.py says how), printed as a table and optionally as JSON." % what)
    p.add_argument("--block-sizes", default=DEFAULT_BLOCKS, help="e.g. %s (default %s)" % (FULL_BLOCKS, DEFAULT_BLOCKS))
    p.add_argument("--batch-sizes", default=DEFAULT_BATCHES, help="descriptors per batch (default %s)" % DEFAULT_BATCHES)
    p.add_argument("--full", action="store_true", help="the whole grid: blocks %s, batches %s" % (FULL_BLOCKS, FULL_BATCHES))
    p.add_argument("--op", choices=("read", "write"), default="read", help="READ (remote -> local, default) or WRITE")
    p.add_argument("--max-batch-bytes", default="256M", help="skip points with block*batch above this (default 256M)")
    p.add_argument("--bytes-per-point", default=None,
                   help="timed bytes per point (default 400M; 200M for tcp transports), 3..2001 batches")
    p.add_argument("--max-seconds", type=float, default=1.5,
                   help="stop a point's timed loop after this long, its warm-up after a third of it (default 1.5)")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--region", type=int, default=0, help=argparse.SUPPRESS)
    return p


def grid(args):
    blocks = parse_list(FULL_BLOCKS if args.full else args.block_sizes, parse_size)
    batches = parse_list(FULL_BATCHES if args.full else args.batch_sizes, int)
    cap = parse_size(args.max_batch_bytes)
    if not blocks or not batches or min(blocks) <= 0 or min(batches) <= 0:
        sys.exit("%s: block and batch sizes must be positive" % os.path.basename(sys.argv[0]))
    points = [(b, n) for b in blocks for n in batches if b * n <= cap]
    if not points:
        sys.exit("%s: every point is above --max-batch-bytes %s" % (os.path.basename(sys.argv[0]), args.max_batch_bytes))
    return points


class Region:
    """Anonymous memory, pre-faulted, with its address for the peer library's registration."""

    def __init__(self, size):
        self.size = size
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        ctypes.memset(self.addr, 0, size)  # first touch, off the clock

    def fill_pattern(self):
        period = bytes(range(PATTERN_PERIOD))
        chunk = period * ((1 << 20) // PATTERN_PERIOD + 2)
        step = (len(chunk) // PATTERN_PERIOD - 1) * PATTERN_PERIOD  # keeps each chunk in phase
        off = 0
        while off < self.size:
            n = min(step, self.size - off)
            self.map[off:off + n] = chunk[:n]
            off += n

    def clear(self, length):
        ctypes.memset(self.addr, 0, length)

    def matches_pattern(self, off, remote_off, length):
        """True when [off, off+length) holds the pattern as it lies at remote_off in a filled region."""
        period = bytes(range(PATTERN_PERIOD))
        phase = remote_off % PATTERN_PERIOD
        want = (period * (length // PATTERN_PERIOD + 2))[phase:phase + length]
        return self.map[off:off + length] == want


def layout(block, batch):
    """(local offsets, remote offsets) of a point: local in order, remote in reverse order."""
    return [k * block for k in range(batch)], [(batch - 1 - k) * block for k in range(batch)]


def iterations(args, block, batch, tcp):
    budget = parse_size(args.bytes_per_point) if args.bytes_per_point else (200 << 20 if tcp else 400 << 20)
    n = budget // (block * batch)
    return max(3, min(2001, n))


def measure(post_and_wait, block, batch, iters, max_seconds):
    """Warm-up (a tenth, at least 1) then the timed loop; returns (GB/s, batches timed, median us). Both
    stop early after their share of max_seconds: over UCX's tcp a get can take milliseconds here."""
    t0 = time.perf_counter()
    for _ in range(max(1, iters // 10)):
        post_and_wait()
        if time.perf_counter() - t0 > max_seconds / 3:
            break
    lat = []
    t0 = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        post_and_wait()
        lat.append(time.perf_counter() - t)
        if t - t0 > max_seconds and len(lat) >= 3:
            break
    dt = time.perf_counter() - t0
    lat.sort()
    return block * batch * len(lat) / dt / 1e9, len(lat), lat[len(lat) // 2] * 1e6


def point(args, local, post_and_wait, block, batch, tcp):
    """One grid point: with --op read the first batch is checked byte for byte (local blocks in order,
    remote reversed: layout()), then the point is timed. Returns its row; raises RuntimeError naming the
    point when a transfer fails or a block differs from the target's bytes."""
    loffs, roffs = layout(block, batch)
    try:
        if args.op == "read":
            local.clear(block * batch)
            post_and_wait()
            bad = [k for k in range(batch) if not local.matches_pattern(loffs[k], roffs[k], block)]
            if bad:
                raise RuntimeError("%d of %d blocks differ from the target's bytes" % (len(bad), batch))
        gbps, iters, lat = measure(post_and_wait, block, batch, iterations(args, block, batch, tcp), args.max_seconds)
    except RuntimeError as e:
        raise RuntimeError("block %s batch %d: %s" % (fmt_size(block), batch, e)) from None
    return {"block": block, "batch": batch, "gbps": gbps, "iters": iters, "lat_us_median": lat}


def start_target(args, region):
    """Start this program as the target; returns (process, its READY info dict)."""
    cmd = [sys.executable, sys.argv[0], "--serve", "--region", str(region)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    # The libraries log to stdout too, so the line that matters is the one that starts with READY.
    for line in proc.stdout:
        if line.startswith("READY "):
            return proc, json.loads(line[6:])
    proc.wait()
    sys.exit("%s: the target (%s) exited with status %s before it was ready" %
             (os.path.basename(sys.argv[0]), " ".join(cmd), proc.returncode))


def serve_ready(info):
    """Target side: announce the READY line, then wait until the initiator closes our stdin."""
    print("READY " + json.dumps(info), flush=True)
    sys.stdin.read()


def stop_target(proc):
    try:
        proc.stdin.close()
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def report(system, transport, op, rows, args):
    print("%s (%s), %s, GB = 10^9 B/s; stop-and-wait batches, local in order, remote in reverse order" %
          (system, transport, op.upper()))
    print("%6s %6s %9s %7s %12s" % ("block", "batch", "GB/s", "iters", "lat med us"))
    for r in rows:
        print("%6s %6d %9.3f %7d %12.1f" % (fmt_size(r["block"]), r["batch"], r["gbps"], r["iters"], r["lat_us_median"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"system": system, "transport": transport, "op": op, "rows": rows}, f, indent=1)
