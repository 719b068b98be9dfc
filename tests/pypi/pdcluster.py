"""pdcluster.py -- start pdlink-nodes behind pdlink-router or the real vllm-router, for the tests of
tests/pypi/ (those that need PyPI packages from the project venv).

Not a test itself. Every process it starts is recorded and stopped by Cluster.close() (the tests use
it as a context manager). Ports: routers and relays bind port 0 where they can and report the port;
a node's HTTP/handshake/notify range and vllm-router's ports (it cannot report them) are probed free
just before use, below the kernel's ephemeral range, and a start that lost its ports to a parallel
test is retried on another range. Registration is waited for on what each router exposes:
pdlink-router's GET /workers, vllm-router's "Add Prefill/Decode [HTTP:addr" log lines (it lists
discovered instances nowhere else, and its /health is 200 before anything registered).
"""
import json
import os
import shutil
import signal
import socket
import sys
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from free_ports import free_range  # noqa: E402 (the tests' one port rule: outside the ephemeral range)
from prom_text import sums  # noqa: E402

SRC = os.environ.get("PDLINK_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("PDLINK_BUILD_DIR") or os.path.join(SRC, "build")
VLLM_ROUTER = os.environ.get("PDLINK_VLLM_ROUTER") or os.path.join(SRC, ".venv", "bin", "vllm-router")
DEADLINE = 60.0

# The seed's router flags (README.md, the router command): MoRIIO P/D with consistent_hash everywhere.
SEED_POLICY = ["--policy", "consistent_hash", "--prefill-policy", "consistent_hash",
               "--decode-policy", "consistent_hash"]




def http(method, url, body=None, headers=None, timeout=60):
    """(status, body text) of one request; a connection failure is status 0."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
        return 0, str(e)


def wait_for(cond, what, deadline=DEADLINE):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def metrics(url):
    code, text = http("GET", url)
    return sums(text)


class Router:
    def __init__(self, kind, url, disc_port, log_path, proc, metrics_url):
        self.kind, self.url, self.disc_port, self.log_path, self.proc = kind, url, disc_port, log_path, proc
        self.metrics_url = metrics_url

    def registered(self):
        """(prefill, decode) counts the router has registered."""
        if self.kind == "pdlink":
            code, text = http("GET", self.url + "/workers")
            if code != 200:
                return (-1, -1)
            w = json.loads(text)
            return (len(w["prefill"]), len(w["decode"]))
        seen = {"Prefill": set(), "Decode": set()}
        with open(self.log_path, errors="replace") as f:
            for line in f:
                for role in seen:
                    i = line.find(f"Add {role} [HTTP:")
                    if i >= 0:
                        seen[role].add(line[i:].split(",", 1)[0])
        return (len(seen["Prefill"]), len(seen["Decode"]))


class Cluster:
    """A set of processes: routers, an optional registration relay, and pdlink-nodes."""

    def __init__(self, name):
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix=f"pdl-venv-{name}-")
        self.procs = []
        self.nodes = []   # (role, tp, http_port, proc)
        self.failed = False

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.close(keep_logs=et is not None)

    def spawn(self, args, name):
        log = os.path.join(self.tmp, name + ".log")
        f = open(log, "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        f.close()
        self.procs.append((p, name))
        return p, log

    def close(self, keep_logs=False):
        for p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        unclean = []
        for p, name in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            # pdlink's own programs exit 0 on SIGTERM (a sanitizer report at exit makes that non-zero).
            if os.path.basename(p.args[0]).startswith("pdlink-") and p.returncode != 0:
                unclean.append(f"{name} exited with {p.returncode}")
        if unclean and not keep_logs:
            print(f"logs kept in {self.tmp}")
            raise AssertionError("; ".join(unclean))
        if keep_logs:
            print(f"logs kept in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- routers
    def pdlink_router(self, policy="consistent_hash"):
        pf = os.path.join(self.tmp, "pdlink-router.ports")
        p, log = self.spawn([os.path.join(BUILD, "pdlink-router"), "--host", "127.0.0.1", "--port", "0",
                             "--vllm-pd-disaggregation", "--kv-connector", "moriio", "--vllm-discovery-address",
                             "127.0.0.1:0", "--policy", policy, "--port-file", pf], "pdlink-router")
        wait_for(lambda: os.path.exists(pf) or p.poll() is not None, "pdlink-router port file")
        assert p.poll() is None, f"pdlink-router exited (see {log})"
        ports = dict(kv.split("=") for kv in open(pf).read().split())
        url = f"http://127.0.0.1:{ports['http']}"
        return Router("pdlink", url, int(ports["discovery"]), log, p, url + "/metrics")

    def vllm_router(self):
        """The real vllm-router with the seed's exact flags; it cannot bind port 0 and report it, so its
        three ports are probed free, and a start that lost them is retried."""
        assert os.access(VLLM_ROUTER, os.X_OK), f"{VLLM_ROUTER} missing (scripts/install-deps makes the venv)"
        for attempt in range(5):
            base = free_range(3)
            name = "vllm-router" + (f"-try{attempt}" if attempt else "")
            p, log = self.spawn([VLLM_ROUTER, "--host", "127.0.0.1", "--port", str(base),
                                 "--vllm-pd-disaggregation", "--kv-connector", "moriio",
                                 "--vllm-discovery-address", f"127.0.0.1:{base + 1}"] + SEED_POLICY +
                                ["--prometheus-port", str(base + 2), "--log-level", "info"], name)
            url = f"http://127.0.0.1:{base}"

            def up():
                if p.poll() is not None:
                    return True
                text = open(log, errors="replace").read()
                return "ZMQ service discovery bound" in text and http("GET", url + "/liveness", timeout=2)[0] == 200
            wait_for(up, "vllm-router up")
            if p.poll() is None:
                return Router("vllm", url, base + 1, log, p, f"http://127.0.0.1:{base + 2}/metrics")
        raise AssertionError(f"vllm-router did not start (see {log})")

    def relay(self, targets):
        """A registration relay (zmq_relay.py on Debian's python3-zmq); returns the port to ping."""
        pf = os.path.join(self.tmp, "relay.port")
        args = ["/usr/bin/python3", os.path.join(os.path.dirname(__file__), "zmq_relay.py"),
                "--bind", "127.0.0.1:0", "--port-file", pf]
        for r in targets:
            args += ["--to", f"127.0.0.1:{r.disc_port}"]
        p, log = self.spawn(args, "relay")
        wait_for(lambda: os.path.exists(pf) or p.poll() is not None, "relay port file")
        assert p.poll() is None, f"relay exited (see {log})"
        return int(open(pf).read())

    # -- nodes
    def node(self, tp, role, disc_port, name=None, model="tiny"):
        """A pdlink-node (role kv_producer / kv_consumer, or None for a node serving alone)."""
        name = name or f"{role or 'single'}-{len(self.nodes)}-tp{tp}"
        last = None
        for attempt in range(5):
            base = free_range(2 * tp + 1)
            http_port, hs, nt = base, base + 1, base + 1 + tp
            args = [os.path.join(BUILD, "pdlink-node"), "--model", model, "--host", "127.0.0.1", "--port",
                    str(http_port), "--tensor-parallel-size", str(tp), "--block-size", "16",
                    "--kv-cache-dtype", "bf16"]
            if role:
                cfg = {"kv_connector": "MoRIIOConnector", "kv_role": role,
                       "kv_connector_extra_config": {"host_ip": "127.0.0.1", "proxy_ip": "127.0.0.1",
                                                     "proxy_ping_port": disc_port, "http_port": http_port,
                                                     "handshake_port": hs, "notify_port": nt, "read_mode": True,
                                                     "backend": "rdma", "qp_per_transfer": 4, "num_workers": 4}}
                args += ["--kv-transfer-config", json.dumps(cfg)]
            n = f"{name}-try{attempt}" if attempt else name
            p, log = self.spawn(args, n)

            def ready():
                if p.poll() is not None:
                    return True
                return http("GET", f"http://127.0.0.1:{http_port}/health", timeout=2)[0] == 200
            wait_for(ready, n + " ready")
            if p.poll() is None:
                self.nodes.append((role, tp, http_port, p))
                return f"http://127.0.0.1:{http_port}"
            last = f"{n} exited with {p.returncode} (see {log})"
        raise AssertionError(last)

    def pd(self, routers, p_tps, d_tps):
        """Nodes for routers (all of them see all nodes: through a relay when there are several)."""
        disc = routers[0].disc_port if len(routers) == 1 else self.relay(routers)
        for tp in p_tps:
            self.node(tp, "kv_producer", disc)
        for tp in d_tps:
            self.node(tp, "kv_consumer", disc)
        for r in routers:
            wait_for(lambda: r.registered() == (len(p_tps), len(d_tps)),
                     f"{r.kind} router to register {len(p_tps)} prefill and {len(d_tps)} decode instances")

    def kv_checks(self):
        """Every prefill block released, nothing reaped, every KV byte the decodes pulled verified."""
        def released():
            return all(metrics(f"http://127.0.0.1:{port}/metrics").get("pdlink_held_blocks", -1) == 0
                       for role, _, port, _ in self.nodes if role == "kv_producer")
        wait_for(released, "prefill blocks released")
        verified = 0
        for role, _, port, _ in self.nodes:
            m = metrics(f"http://127.0.0.1:{port}/metrics")
            assert m.get("pdlink_kv_bytes_mismatched_total", -1) == 0, f"node {port}: mismatched KV bytes"
            assert m.get("pdlink_expired_total", -1) == 0, f"node {port}: transfers reaped"
            if role == "kv_consumer":
                verified += m.get("pdlink_kv_bytes_verified_total", 0)
        return verified


def pair_of(response_id):
    """(prefill zmq address, decode zmq address) from a response id built on vllm-router's request id
    (cmpl-___prefill_addr_{P}___decode_addr_{D}_{32 hex})."""
    rest = response_id.split("___prefill_addr_", 1)[1]
    p, rest = rest.split("___decode_addr_", 1)
    return p, rest.rsplit("_", 1)[0]
