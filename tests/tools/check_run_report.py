#!/usr/bin/python3
"""check_run_report.py -- the checks every test_run_*.sh makes of `pdlink run --json`'s report.

All five seed topologies pass with every request answered, parity n/n with a single node, 0 mismatched
bytes, 0 expired transfers, 0 blocks held, KV moved and verified, and the releases (READ) or write_done
messages (WRITE) sent, received and expected all equal. No transfer handshaked: every peer was connected
ahead of need (READ decodes are told their producers, WRITE prefills their decodes, through
prewarm_peers). --vllm-router LOGDIR also checks that the real
vllm-router served each topology (its own log lines: MoRIIO READ mode, consistent_hash per leg).
--chaos checks a `pdlink run --chaos` report: the figures above are then the final batch's, sent after the
chaos schedule's kills and pauses (--schedule, the run's --chaos-schedule), while the nodes' counters
(releases, pulls, handshakes, bytes) also hold the chaos passes; so those are checked as lower bounds, and
the "chaos" object must show every event's victim serving again, no failure outside the outage windows,
every success equal to the reference, no byte mismatched by a victim before its kill, and no transfer
reaped during the phase beyond what its outage failures excuse (none behind pdlink-router); with two
prefills behind pdlink-router, the rows of the one not killed (its latencies before, during and after the
other's outage) are well formed and it served during it. --topologies checks a run of some of the seed
topologies only.
Exits 1 with the failed assertion on stderr.
"""
import argparse
import json
import os
import sys

SEED = ["1p1d", "2p1d", "1p2d", "p4d8", "p8d4"]


def check_healthy_prefill(t, vllm_router: bool) -> None:
    """With two prefills, the one not killed (named by pdlink-router's X-Pdlink-Prefill) has well-formed
    latency rows before, during and after the other's outage, and served requests during it; with one
    prefill there is none. Figures are checked for form and consistency only, never against a time."""
    n, h = t["name"], t["chaos"].get("healthy_prefill", "absent")
    if len(t["prefill_tp"]) < 2 or (vllm_router and h is None):
        # vllm-router names no instance in its answers: which prefill served a request is unknown.
        assert h is None, (n, "a healthy prefill with one prefill", h)
        return
    assert isinstance(h, dict), (n, "no healthy_prefill rows", h)
    host, _, port = h["prefill"].rpartition(":")
    assert host and port.isdigit(), (n, h["prefill"])
    m = h["min_samples"]
    assert m >= 1, (n, h)
    for phase in ("before", "during", "after"):
        p = h[phase]
        assert p["ok"] >= 0 and p["failed"] >= 0, (n, phase, p)
        assert (p["p50_ms"] is None) == (p["ok"] == 0), (n, phase, p)
        assert (p["p99_ms"] is None) == (p["ok"] < m), (n, phase, p)
        if p["p99_ms"] is not None:
            assert 0 < p["p50_ms"] <= p["p99_ms"], (n, phase, p)
    b, d = h["before"], h["during"]
    # The healthy prefill kept serving while the other was down.
    assert d["ok"] > 0, (n, "the healthy prefill served nothing during the outage", h)
    if b["p99_ms"] is None or d["p99_ms"] is None:
        assert h["p99_ratio"] is None, (n, h)
    else:
        assert abs(h["p99_ratio"] - d["p99_ms"] / b["p99_ms"]) < 1e-6 * max(1.0, h["p99_ratio"]), (n, h)


EVENTS = {"kill-decode": ("kill", "decode-0"), "kill-prefill": ("kill", "prefill-0"),
          "pause-decode": ("pause", "decode-0"), "pause-prefill": ("pause", "prefill-0")}


def check_chaos(t, schedule, vllm_router: bool) -> None:
    """The chaos object of one topology, and the counters that include the chaos passes (lower bounds)."""
    n, c = t["name"], t.get("chaos")
    assert c is not None, (n, "no chaos object")
    assert [(v["action"], v["node"]) for v in c["victims"]] == [EVENTS[e] for e in schedule], (n, c["victims"])
    for v in c["victims"]:
        assert (v["pause_seconds"] > 0) == (v["action"] == "pause"), (n, v)
        assert v["ok"] >= 0 and v["failed"] >= 0, (n, v)
        # Measured and shown, never judged: only present and ordered (healthy before or when serving).
        assert v["recovered"] is True, (n, v)
        assert v["restart_seconds"] is not None and v["recover_seconds"] is not None, (n, v)
        assert 0 <= v["restart_seconds"] <= v["recover_seconds"], (n, v)
    assert c["passes"] >= 1, (n, c)
    assert c["failed_outside"] == 0, (n, "failures outside the outage windows", c)
    assert c["parity_bad"] == 0, (n, "successes that differ from the reference", c)
    assert c["mismatched_killed"] == 0, (n, c)
    # A request failed in an outage may leave its hold to the reaper only where the router sends no failed
    # release for it (vllm-router): then at most one per rank of the prefill.
    assert c["expired"] <= c["expired_allowed"], (n, "transfers reaped during the chaos phase", c)
    if not vllm_router:
        assert c["expired_allowed"] == 0 and c["expired"] == 0, (n, c)
    else:
        assert c["expired_allowed"] == c["failed_outage"] * max(t["prefill_tp"]), (n, c)
    # The workload kept going around the kills: successes on both sides of each outage.
    assert c["ok_outside"] > 0 and c["ok_outage"] + c["failed_outage"] > 0, (n, c)
    check_healthy_prefill(t, vllm_router)
    assert t["pulls"] >= t["requests"] and t["releases_sent"] >= t["releases_expected"], (n, t["pulls"])
    assert t["releases_received"] >= t["releases_expected"], (n, t["releases_received"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("--mode", choices=["read", "write"], default="read")
    ap.add_argument("--backend", default="shm")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--streaming", type=int, default=3, help="streamed requests per topology")
    ap.add_argument("--vllm-router", metavar="LOGDIR", help="the router was vllm-router; its logs are here")
    ap.add_argument("--chaos", action="store_true", help="the report of pdlink run --chaos")
    ap.add_argument("--schedule", default="kill-decode,kill-prefill,pause-decode,pause-prefill",
                    help="--chaos: the run's --chaos-schedule")
    ap.add_argument("--topologies", default=",".join(SEED), help="the seed topologies the run was given, in order")
    a = ap.parse_args()
    r = json.load(open(a.report))
    n_req = a.requests
    names = [t["name"] for t in r["topologies"]]
    want = a.topologies.split(",")
    assert names == want, (names, want)
    assert r["pass"] is True and r["passed"] == len(want), r["passed"]
    assert r["model"] == "tiny" and r["backend"] == a.backend and r["mode"] == a.mode, (r["model"], r["backend"], r["mode"])
    assert r["ceiling"]["gbps"] is None or r["ceiling"]["gbps"] > 0, r["ceiling"]
    for t in r["topologies"]:
        n = t["name"]
        assert t["requests"] == n_req and t["ok"] == n_req and t["failed"] == 0, (n, t["ok"], t["failed"])
        assert t["parity_ok"] == t["parity_total"] == n_req, (n, t["parity_ok"])
        assert t["bytes_mismatched"] == 0, (n, t["bytes_mismatched"])
        assert t["expired"] == 0 and t["held_blocks"] == 0, (n, t["expired"], t["held_blocks"])
        # With --chaos a restarted node's counters start again: a WRITE prefill (which counts the moved
        # bytes) may have moved less since its restart than its decodes verified over the whole run.
        assert t["kv_bytes"] > 0 and 0 < t["bytes_verified"] and (a.chaos or t["bytes_verified"] <= t["kv_bytes"]), n
        assert t["descriptors"] > 0, n
        assert t["releases_expected"] == n_req * max(max(t["prefill_tp"]), max(t["decode_tp"])), \
            (n, t["releases_expected"])
        assert t["metrics_complete"] is True and t["pass"] is True, n
        if a.chaos:
            check_chaos(t, a.schedule.split(","), a.vllm_router is not None)
        else:
            assert t["pulls"] == n_req, (n, t["pulls"])
            # READ: every consumer rank releases every producer rank of its group; WRITE: every producer
            # rank sends write_done to every consumer rank of its notify set. Both are max(P, D) per request.
            assert t["releases_sent"] == t["releases_received"] == t["releases_expected"], \
                (n, t["releases_sent"], t["releases_received"], t["releases_expected"])
        # Counts, not timings: a pull (WRITE: a push) that had to handshake (and map the peer's region)
        # itself. A restarted node is a new peer: the transfers after a chaos restart handshake again.
        if not a.chaos:
            assert t["transfer_handshakes"] == 0, (n, "pulls that handshaked", t["transfer_handshakes"])
            assert t["prewarm_handshakes"] > 0, (n, "peers connected ahead of need", t["prewarm_handshakes"])
        for k in ("transfer_share_of_ttft", "transfer_share_of_request"):
            assert t[k] is None or t[k] >= 0, (n, k, t[k])
        assert (t["ttft_added_p50_ms"] is None) == (t["ttft_added_p99_ms"] is None), n
        # Ratios to a ceiling: alternating pairs, one per round of the workload (6 rounds, fewer only
        # with fewer requests), a median inside its min-max. A WRITE prefill counts no read seconds, so its
        # engine ratio has no pair (as its engine rate had no figure); a tcp ceiling may fail to measure.
        for k in ("ceiling_ratio", "engine_read_ceiling_ratio"):
            q = t[k]
            if k == "engine_read_ceiling_ratio" and a.mode == "write":
                assert q["pairs"] == 0, (n, k, q)
            elif a.backend == "shm":
                assert q["pairs"] == min(6, n_req), (n, k, q)
            else:
                assert q["pairs"] <= min(6, n_req), (n, k, q)
            if q["pairs"]:
                assert 0 <= q["min"] <= q["median"] <= q["max"], (n, k, q)
                # bench/pairs.h: "wide" is a spread (q3 - q1) / median over 0.25 with 5+ pairs
                assert q["spread"] is not None and q["spread"] >= 0, (n, k, q)
                assert q["wide"] == (q["pairs"] >= 5 and q["spread"] > 0.25), (n, k, q)
        if a.vllm_router is None:
            assert t["ttft_added_p50_ms"] is not None and t["ttft_added_p50_ms"] <= t["ttft_added_p99_ms"], n
        if a.vllm_router is None:
            assert t["streaming"] == a.streaming, (n, t["streaming"])
            assert t["ttft_p50_ms"] is not None and 0 < t["ttft_p50_ms"] <= t["ttft_p99_ms"], n
            assert t["transfer_gbps"] is not None and t["transfer_gbps"] > 0, n
        else:
            log = open(os.path.join(a.vllm_router, n + "-router.log"), errors="replace").read()
            assert "kv_connector=MoriIO" in log, n
            assert "MoRI-IO transfer mode set to %s" % ("Read" if a.mode == "read" else "Write") in log, n
            assert log.count("Consistent hash routing") >= 2 * n_req, (n, log.count("Consistent hash routing"))
    by = {t["name"]: t for t in r["topologies"]}
    if a.chaos:
        print("report OK (chaos):", ", ".join("%s outage %d ok/%d failed, outside %d/%d ok" % (
            t["name"], t["chaos"]["ok_outage"], t["chaos"]["failed_outage"], t["chaos"]["ok_outside"],
            t["chaos"]["ok_outside"] + t["chaos"]["failed_outside"]) for t in r["topologies"]))
        return 0
    # The split-head topologies move the same KV as the homogeneous one, in more descriptors.
    if "p4d8" in by and "1p1d" in by:
        assert by["p4d8"]["kv_bytes"] == by["1p1d"]["kv_bytes"], (by["p4d8"]["kv_bytes"], by["1p1d"]["kv_bytes"])
        assert by["p4d8"]["descriptors"] > by["1p1d"]["descriptors"], (by["p4d8"]["descriptors"], by["1p1d"]["descriptors"])
    print("report OK:", ", ".join("%s %d/%d" % (t["name"], t["parity_ok"], t["parity_total"]) for t in r["topologies"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
