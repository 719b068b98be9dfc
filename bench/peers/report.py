#!/usr/bin/env python3
"""report.py -- the table, CSV files and plot of bench/compare-peers.sh, from the per-pass files that
script leaves in its scratch directory:

  ucx.CLASS.BATCH.SIZE.K          ucx_perftest's GB/s of pass K (or n/a)
  ucxfp.CLASS.BATCH.SIZE.K        ucx_perftest's GB/s for one get of BATCH x SIZE bytes (the batch's
                                  footprint; batches > 1 only: for batch 1 it is the ucx.* run)
  pdl.CLASS.BACKEND.BATCH.K.json  pdlink bench --json of pass K (all sizes); BACKEND "ucxsame" is the ucx
                                  backend with --same-block (batches > 1 only: for batch 1 it is pdl.*.ucx.*)
  PEER.CLASS.BATCH.K.json         bench/peers/PEER_bench.py --json of pass K (all sizes)
  status.PEER                     "ok", or why the peer did not run (shown in the table's notes)

Method (bench/pairs.h, as pdlink bench): every pass measured every system of a row back to back, so a
ratio is taken per pass and the row shows the median of the per-pass ratios with their min-max; a ratio
whose spread ((q3 - q1) / median) is above 0.25 is printed as "unstable". GB/s cells are medians.
Writes RESULTS/table.md, RESULTS/table.csv (the summary), RESULTS/raw.csv (every pass of every
system) and, when matplotlib imports, RESULTS/peers.png. Only the standard library is needed otherwise.

usage: report.py TMP RESULTS PAIRS SIZES BATCHES CLASSES      CLASSES like "shm=posix,cma;tcp=tcp"
"""
import csv
import json
import math
import os
import sys

SYSTEMS = ["ucx_perftest", "ucx_perftest_fp", "nixl", "mooncake", "pdlink", "pdlink_ucx", "pdlink_ucx_same"]
MAX_SPREAD = 0.25


def to_bytes(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s)


def med(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def rank(v, q):  # nearest rank, as bench/pairs.c
    v = sorted(v)
    k = math.ceil(q * len(v))
    return v[min(max(k, 1), len(v)) - 1]


def load_json_rows(path):
    try:
        with open(path) as f:
            return {(r["block"], r["batch"]): r for r in json.load(f)["rows"]}
    except (OSError, ValueError, KeyError):
        return {}


def collect(tmp, pairs, sizes, batches, classes):
    """raw[(cls, batch, size)][system] = list of (pass, GB/s); pdlink also keeps its ceiling."""
    raw, ceil = {}, {}
    for cls, _ in classes:
        for batch in batches:
            for k in range(1, pairs + 1):
                pdl = load_json_rows(os.path.join(tmp, "pdl.%s.%s.%d.%d.json" % (cls, cls, batch, k)))
                pdu = load_json_rows(os.path.join(tmp, "pdl.%s.ucx.%d.%d.json" % (cls, batch, k)))
                pds = pdu if batch == 1 else load_json_rows(os.path.join(tmp, "pdl.%s.ucxsame.%d.%d.json" % (cls, batch, k)))
                nx = load_json_rows(os.path.join(tmp, "nixl.%s.%d.%d.json" % (cls, batch, k)))
                mc = load_json_rows(os.path.join(tmp, "mooncake.%s.%d.%d.json" % (cls, batch, k)))
                for s in sizes:
                    key, b = (cls, batch, s), to_bytes(s)
                    cell = raw.setdefault(key, {x: [] for x in SYSTEMS})
                    for name, prefix in (("ucx_perftest", "ucx"), ("ucx_perftest_fp", "ucx" if batch == 1 else "ucxfp")):
                        try:
                            with open(os.path.join(tmp, "%s.%s.%d.%s.%d" % (prefix, cls, batch, s, k))) as f:
                                u = float(f.read())
                            if u > 0:
                                cell[name].append((k, u))
                        except (OSError, ValueError):
                            pass
                    for name, rows in (("pdlink", pdl), ("pdlink_ucx", pdu), ("pdlink_ucx_same", pds), ("nixl", nx),
                                       ("mooncake", mc)):
                        r = rows.get((b, batch))
                        if r is not None and r["gbps"] > 0:
                            cell[name].append((k, r["gbps"]))
                            if name.startswith("pdlink"):
                                ceil.setdefault((key, name), []).append(r.get("ceiling_gbps", 0))
    return raw, ceil


def ratio(cell, num, den):
    """Median per-pass ratio num/den over the passes where both ran: (median, lo, hi, spread, n)."""
    a, b = dict(cell[num]), dict(cell[den])
    rs = [a[k] / b[k] for k in a if k in b and b[k] > 0]
    if not rs:
        return None
    m = med(rs)
    spread = (rank(rs, 0.75) - rank(rs, 0.25)) / m if m > 0 else 0.0
    return m, min(rs), max(rs), spread, len(rs)


def fmt_ratio(r, pairs):
    if r is None:
        return "n/a"
    m, lo, hi, spread, n = r
    few = "" if n >= min(pairs, 5) else " (%d passes)" % n
    if spread > MAX_SPREAD:
        return "unstable %.2f-%.2f%s" % (lo, hi, few)
    return "%.2f (%.2f-%.2f)%s" % (m, lo, hi, few)


def fmt_gbps(v):
    if not v:
        return "-"
    return "%.3f" % med([x for _, x in v])


def main():
    if len(sys.argv) != 7 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    tmp, results, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sizes = [s for s in sys.argv[4].split(",") if s]
    batches = [int(b) for b in sys.argv[5].split(",") if b]
    classes = [tuple(c.split("=", 1)) for c in sys.argv[6].split(";") if c]
    status = {}
    for peer in ("nixl", "mooncake"):
        try:
            with open(os.path.join(tmp, "status." + peer)) as f:
                status[peer] = f.read().strip()
        except OSError:
            status[peer] = "not run"
    raw, ceil = collect(tmp, pairs, sizes, batches, classes)
    os.makedirs(results, exist_ok=True)

    with open(os.path.join(results, "raw.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["class", "ucx_tls", "batch", "block", "system", "pass", "gbps"])
        for cls, tls in classes:
            for batch in batches:
                for s in sizes:
                    for name in SYSTEMS:
                        for k, g in raw[(cls, batch, s)][name]:
                            w.writerow([cls, tls, batch, to_bytes(s), name, k, "%.6f" % g])

    head = ["class", "batch", "block", "ucx_perftest", "ucx_perftest footprint", "NIXL", "Mooncake (tcp)", "pdlink shm/tcp",
            "pdlink ucx", "pdlink ucx same-block", "pdlink / NIXL", "pdlink / Mooncake",
            "pdlink ucx same-block / ucx_perftest", "pdlink ucx / ucx_perftest footprint", "pdlink ucx / ucx_perftest",
            "pdlink ucx / NIXL"]
    table = []
    for cls, tls in classes:
        for batch in batches:
            for s in sizes:
                c = raw[(cls, batch, s)]
                table.append([cls, str(batch), s, fmt_gbps(c["ucx_perftest"]), fmt_gbps(c["ucx_perftest_fp"]),
                              fmt_gbps(c["nixl"]), fmt_gbps(c["mooncake"]), fmt_gbps(c["pdlink"]), fmt_gbps(c["pdlink_ucx"]),
                              fmt_gbps(c["pdlink_ucx_same"]),
                              fmt_ratio(ratio(c, "pdlink", "nixl"), pairs), fmt_ratio(ratio(c, "pdlink", "mooncake"), pairs),
                              fmt_ratio(ratio(c, "pdlink_ucx_same", "ucx_perftest"), pairs),
                              fmt_ratio(ratio(c, "pdlink_ucx", "ucx_perftest_fp"), pairs),
                              fmt_ratio(ratio(c, "pdlink_ucx", "ucx_perftest"), pairs),
                              fmt_ratio(ratio(c, "pdlink_ucx", "nixl"), pairs)])
    with open(os.path.join(results, "table.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        w.writerows(table)

    notes = ["class shm: UCX_TLS=%s for ucx_perftest, NIXL and pdlink ucx; pdlink shm is pdlink's own shared-memory "
             "engine" % dict(classes).get("shm", "-"),
             "class tcp: UCX_TLS=%s (+ UCX_NET_DEVICES=lo) for ucx_perftest, NIXL and pdlink ucx; pdlink tcp is pdlink's "
             "own tcp engine" % dict(classes).get("tcp", "-"),
             "Mooncake runs its TCP transport in both classes (the one that needs no RDMA device; no other was tried)",
             "ucx_perftest: -O N gets of one block re-reading one buffer (cache-resident); footprint: one get of "
             "N x block bytes, the bytes and memory a pdlink batch of N blocks reads (N > 1, blocks >= 64K; for N = 1 "
             "the same run)",
             "pdlink ucx same-block: pdlink bench --same-block, a batch of N descriptors all naming one block on both "
             "sides, what ucx_perftest -O N measures (for N = 1 the pdlink ucx run); like for like: same-block / "
             "ucx_perftest, and pdlink ucx / footprint",
             "GB/s = 10^9 B/s, medians over %d alternating passes; ratios: median of per-pass ratios (min-max), "
             "'unstable' when (q3 - q1) / median > %.2f" % (pairs, MAX_SPREAD),
             "NIXL: %s" % status["nixl"], "Mooncake: %s" % status["mooncake"]]
    with open(os.path.join(results, "table.md"), "w") as f:
        f.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for row in table:
            f.write("| " + " | ".join(row) + " |\n")
        f.write("\n" + "".join("- %s\n" % n for n in notes))

    widths = [max(len(head[i]), *(len(r[i]) for r in table)) for i in range(len(head))]
    for row in [head] + table:
        print("  ".join(x.rjust(widths[i]) if 3 <= i <= 9 else x.ljust(widths[i]) for i, x in enumerate(row)).rstrip())
    for n in notes:
        print(n)

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib not importable here (scripts/install-peers puts it in the peers venv): no plot",
              file=sys.stderr)
        return
    labels = {"ucx_perftest": "ucx_perftest ucp_get", "ucx_perftest_fp": "ucx_perftest, batch footprint", "nixl": "NIXL (UCX)", "mooncake": "Mooncake TE (tcp)",
              "pdlink": "pdlink shm/tcp", "pdlink_ucx": "pdlink ucx", "pdlink_ucx_same": "pdlink ucx, same block"}
    fig, axes = plt.subplots(len(classes), len(batches), figsize=(max(4.2 * len(batches), 7.5), 3.6 * len(classes)),
                             squeeze=False)
    for i, (cls, tls) in enumerate(classes):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            for name in SYSTEMS:
                if name in ("ucx_perftest_fp", "pdlink_ucx_same") and batch == 1:  # the same run as another line
                    continue
                xs, ys, lo, hi = [], [], [], []
                for s in sizes:
                    v = [g for _, g in raw[(cls, batch, s)][name]]
                    if v:
                        xs.append(to_bytes(s)); ys.append(med(v)); lo.append(med(v) - min(v)); hi.append(max(v) - med(v))
                if xs:
                    lab = labels[name].replace("shm/tcp", cls)
                    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", ms=3, capsize=2, label=lab)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title("%s (UCX_TLS=%s), batch %d" % (cls, tls, batch), fontsize=9)
            ax.set_xlabel("block bytes", fontsize=8)
            ax.set_ylabel("GB/s (median, min-max)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="both", alpha=0.3)
        axes[i][0].legend(fontsize=7)
    fig.suptitle("READ, DRAM to DRAM, two processes on one 2-vCPU VM\nmedians of %d alternating passes, bars min-max"
                 % pairs, fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(results, "peers.png"), dpi=110)


if __name__ == "__main__":
    main()
