#!/usr/bin/env bash
# test_e2e_seed.sh -- the seed's deployments on loopback: pdlink-node instances behind pdlink-router,
# curl as the client. Topologies (model "tiny": 8 KV heads, so TP4 <-> TP8 splits heads):
#   1P1D TP8/TP8, 2P1D (TP4 + TP4 -> TP8), 1P2D (TP8 -> TP4 + TP4), P4/D8, P8/D4.
# For each: every completion (streaming and not, completions and chat) equals a single reference
# node's output for the same prompt; nodes report 0 mismatched KV bytes, the decodes verified KV
# bytes, every prefill block is freed (pdlink_held_blocks 0) and nothing was reaped (expired 0).
# Ports: the router binds port 0; node port ranges come from tests/tools/free_ports.py just before use.
# Exits 77 (skip) when pdlink-node or pdlink-router has not been built.
set -euo pipefail
B=${PDLINK_BUILD_DIR:-build}
for prog in pdlink-node pdlink-router; do
  [ -x "$B/$prog" ] || { echo "skip: $B/$prog does not exist yet"; exit 77; }
done
exec /usr/bin/python3 - "$B" "$(dirname "$0")/../tools" <<'PYEOF'
import json, os, shutil, signal, subprocess, sys, tempfile, time

B = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from free_ports import free_range  # noqa: E402 (the tests' one port rule, outside the ephemeral range)
from prom_text import sums  # noqa: E402
T = tempfile.mkdtemp(prefix="pdl-e2e-seed-")
procs = []
DEADLINE = 240.0  # how long a node may take to be ready: a TP8 node under TSan on 2 busy cores took over 60 s


def log(*a):
    print(*a, flush=True)


def spawn(args, name):
    f = open(os.path.join(T, name + ".log"), "w")
    p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
    procs.append((p, name))
    return p


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def cleanup():
    for p, _ in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def curl(url, body=None, stream=False):
    args = ["curl", "-sS", "-N", "--max-time", "60", "-w", "\n%{http_code}", url]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(args, capture_output=True, text=True)
    text, _, code = out.stdout.rpartition("\n")
    return int(code or 0), text


def wait_for(cond, what):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def metrics(port):
    code, text = curl(f"http://127.0.0.1:{port}/metrics")
    return sums(text)


def complete(url, body):
    """POST a completion: (status, body, failed leg) -- the leg from the router's X-Pdlink-Failed-Leg
    header ("prefill 127.0.0.1:PORT"), "" when absent."""
    args = ["curl", "-sS", "-N", "--max-time", "60", "-w", "\n%{http_code} %header{x-pdlink-failed-leg}", url,
            "-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(args, capture_output=True, text=True)
    text, _, tail = out.stdout.rpartition("\n")
    code, _, leg = tail.partition(" ")
    return int(code or 0), text, leg.strip()


def failure(code, text, leg):
    """A failed request as pdlink run reports it: status, which leg and worker, the body's message."""
    where = " from the %s leg (%s)" % tuple(leg.split(" ", 1)) if " " in leg else ""
    brace = text.find("{")
    try:
        e = json.loads(text[brace:]) if brace >= 0 else None
        msg = text[:brace] + (e["error"]["message"] if isinstance(e.get("error"), dict) else e["error"])
    except (ValueError, KeyError, TypeError, AttributeError):
        msg = text[:300]
    return f"HTTP {code}{where}: {msg}"


def output_text(code, text, leg, stream, chat):
    assert code == 200, failure(code, text, leg)
    if not stream:
        c = json.loads(text)["choices"][0]
        return c["message"]["content"] if chat else c["text"]
    parts = []
    assert text.rstrip().endswith("data: [DONE]"), "stream did not end with [DONE]"
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            c = json.loads(line[6:])["choices"][0]
            parts.append((c.get("delta") or {}).get("content") or "" if chat else c.get("text", ""))
    return "".join(parts)


PROMPTS = ["The quick brown fox jumps over the lazy dog",
           "Question: what is 17 times 23? Answer step by step.",
           "Once upon a time " * 12,
           "x"]


def requests_for(prompt):
    yield "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}, False, False
    yield "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 12, "stream": True}, True, False
    yield "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": prompt}],
                                   "max_tokens": 6}, False, True


class PortTaken(AssertionError):
    """A node could not bind a probed port: another process took it between the probe and the bind."""


def start_node(tp, role, disc_port, name):
    for attempt in range(5):
        try:
            return start_node_once(tp, role, disc_port, f"{name}-try{attempt}" if attempt else name)
        except PortTaken as e:
            log(f"  {e}; retrying on another range")
            last = e
    raise last


def start_node_once(tp, role, disc_port, name):
    # HTTP on port 0, read back from --port-file (the node advertises the port it bound); only the
    # connector's rank ports are configured, so only they are probed.
    pf = os.path.join(T, name + ".port")
    args = [f"{B}/pdlink-node", "--model", "tiny", "--host", "127.0.0.1", "--port", "0", "--port-file", pf,
            "--tensor-parallel-size", str(tp), "--block-size", "16", "--kv-cache-dtype", "bf16"]
    if role:
        hs = free_range(2 * tp)
        cfg = {"kv_connector": "MoRIIOConnector", "kv_role": role,
               "kv_connector_extra_config": {"host_ip": "127.0.0.1", "proxy_ip": "127.0.0.1",
                                             "proxy_ping_port": disc_port, "handshake_port": hs,
                                             "notify_port": hs + tp, "read_mode": True,
                                             "backend": "rdma", "qp_per_transfer": 4, "num_workers": 4}}
        args += ["--kv-transfer-config", json.dumps(cfg)]
    p = spawn(args, name)
    logf = os.path.join(T, name + ".log")
    def ready():
        if p.poll() is not None:
            text = open(logf).read()
            if "Address already in use" in text:
                raise PortTaken(f"{name}: {text.strip().splitlines()[-1]}")
            raise AssertionError(f"{name} exited with {p.returncode} (see {logf}):\n{text[-2000:]}")
        if not os.path.exists(pf):
            return False
        return curl(f"http://127.0.0.1:{open(pf).read().strip()}/health")[0] == 200
    wait_for(ready, name + " ready")
    return p, int(open(pf).read())


def run_topology(name, p_tps, d_tps, reference):
    pf = os.path.join(T, name + ".ports")
    router = spawn([f"{B}/pdlink-router", "--host", "127.0.0.1", "--port", "0", "--vllm-pd-disaggregation",
                    "--kv-connector", "moriio", "--vllm-discovery-address", "127.0.0.1:0", "--policy",
                    "round_robin", "--port-file", pf], name + "-router")
    wait_for(lambda: os.path.exists(pf), "router port file")
    ports = dict(kv.split("=") for kv in open(pf).read().split())
    rport, disc = int(ports["http"]), int(ports["discovery"])
    nodes = []
    for i, tp in enumerate(p_tps):
        nodes.append(("P",) + start_node(tp, "kv_producer", disc, f"{name}-P{i}-tp{tp}"))
    for i, tp in enumerate(d_tps):
        nodes.append(("D",) + start_node(tp, "kv_consumer", disc, f"{name}-D{i}-tp{tp}"))

    def registered():
        code, text = curl(f"http://127.0.0.1:{rport}/workers")
        if code != 200:
            return False
        w = json.loads(text)
        return len(w["prefill"]) == len(p_tps) and len(w["decode"]) == len(d_tps)
    wait_for(registered, "all instances registered")
    n = 0
    for prompt in PROMPTS:
        for path, body, stream, chat in requests_for(prompt):
            # Each pair (P, D) is exercised: round robin walks every combination over the prompts.
            got = output_text(*complete(f"http://127.0.0.1:{rport}{path}", body), stream, chat)
            want = reference[(path, json.dumps(body, sort_keys=True))]
            assert got == want, f"{name}: {path} {body}: got {got!r}, single node says {want!r}"
            n += 1
    # Every prefill block is released by the decodes' ACKs (no reaper), KV bytes all verified.
    def released():
        return all(metrics(port).get("pdlink_held_blocks", -1) == 0 for role, _, port in nodes if role == "P")
    wait_for(released, "prefill blocks released")
    verified = 0
    for role, _, port in nodes:
        m = metrics(port)
        assert m.get("pdlink_kv_bytes_mismatched_total", -1) == 0, f"{name}: {role}:{port} mismatched bytes {m}"
        assert m.get("pdlink_expired_total", -1) == 0, f"{name}: {role}:{port} reaped transfers"
        if role == "D":
            verified += m.get("pdlink_kv_bytes_verified_total", 0)
    assert verified > 0, f"{name}: the decodes verified no KV bytes"
    rm = metrics(rport)
    assert rm.get("vllm_router_pd_errors_total", -1) == 0, f"{name}: router errors {rm}"
    assert rm.get("vllm_router_pd_requests_total") == n
    code, text = curl(f"http://127.0.0.1:{rport}/metrics")
    excerpt = [l for l in text.splitlines() if l.startswith(("vllm_router_pd_prefill_requests_total",
                                                              "vllm_router_pd_decode_requests_total",
                                                              "vllm_router_pd_requests_total"))]
    for _, p, _ in nodes:
        assert stop(p) == 0, f"{name}: a node did not exit cleanly"
    assert stop(router) == 0, f"{name}: the router did not exit cleanly"
    log(f"ok {name}: {n} requests equal the single node, {int(verified)} KV bytes verified, 0 mismatched, "
        f"0 held, 0 expired")
    for l in excerpt:
        log("   " + l)


def main():
    ref, ref_port = start_node(8, None, 0, "reference")
    reference = {}
    for prompt in PROMPTS:
        for path, body, stream, chat in requests_for(prompt):
            want = output_text(*complete(f"http://127.0.0.1:{ref_port}{path}", body), stream, chat)
            assert want, f"the reference node generated nothing for {body}"
            reference[(path, json.dumps(body, sort_keys=True))] = want
    for name, p_tps, d_tps in [("1P1D-tp8-tp8", [8], [8]), ("2P1D-tp4x2-tp8", [4, 4], [8]),
                               ("1P2D-tp8-tp4x2", [8], [4, 4]), ("P4-D8", [4], [8]), ("P8-D4", [8], [4])]:
        run_topology(name, p_tps, d_tps, reference)
    assert stop(ref) == 0
    log("all topologies ok")


try:
    main()
    rc = 0
except Exception as e:  # report, keep the logs
    log(f"FAIL: {e}")
    log(f"logs kept in {T}")
    rc = 1
finally:
    cleanup()
if rc == 0:
    shutil.rmtree(T, ignore_errors=True)
sys.exit(rc)
PYEOF
