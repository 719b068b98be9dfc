"""test_peer_tp_precedence.py -- the peer's TP as upstream MoRIIO takes it: tp_size, else remote_tp_size.

A P4 -> D8 pair driven leg by leg as a router does. The decode leg carries the prefill's returned params
exactly as vllm-router 0.1.17 forwards them (tp_size 4, no remote_tp_size: checked on the prefill's
answer), plus a stale remote_tp_size 8 as a router copying the decode's own TP would add. Before, pdlink
took remote_tp_size and dialled producer ranks 4..7, where nothing listens, failing after the handshake
timeout; now the transfer succeeds, every byte verifies, and the disagreement is logged once for the
node's lifetime, not once per request.
"""
import json
import uuid

import pdcluster

PROMPT = "Natalia sold clips to 48 of her friends in April and then half as many in May"


def test_stale_remote_tp_size_is_ignored_and_warned_once():
    with pdcluster.Cluster("peer-tp") as c:
        r = c.pdlink_router()
        c.pd([r], [4], [8])
        (_, _, pport, _), (_, _, dport, _) = c.nodes
        single = c.node(2, None, 0, "single")
        want = json.loads(pdcluster.http("POST", single + "/v1/completions",
                                         {"model": "tiny", "prompt": PROMPT, "max_tokens": 6})[1])["choices"][0]["text"]
        for i in range(2):
            tid = "tx-" + uuid.uuid4().hex
            rid = {"X-Request-Id": f"stale-tp-{i}-" + uuid.uuid4().hex}
            code, text = pdcluster.http(
                "POST", f"http://127.0.0.1:{pport}/v1/completions",
                {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "stream": False, "min_tokens": 1,
                 "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                        "remote_engine_id": None, "remote_block_ids": None, "transfer_id": tid,
                                        "remote_dp_size": 1}}, rid)
            assert code == 200, text
            params = json.loads(text)["kv_transfer_params"]
            assert params["tp_size"] == 4 and "remote_tp_size" not in params, params
            params["remote_tp_size"] = 8  # stale: the decode's own TP
            code, text = pdcluster.http("POST", f"http://127.0.0.1:{dport}/v1/completions",
                                        {"model": "tiny", "prompt": PROMPT, "max_tokens": 6,
                                         "kv_transfer_params": params}, rid, timeout=30)
            assert code == 200, text
            assert json.loads(text)["choices"][0]["text"] == want
        assert c.kv_checks() > 0
        logs = [open(f"{c.tmp}/{name}.log").read() for _, name in c.procs if name.startswith("kv_consumer")]
        warned = sum(l.count("disagree") for l in logs)
        assert warned == 1, f"{warned} disagreement warnings, want exactly 1"
        assert "using tp_size 4" in "".join(logs)
