"""test_hash_parity.py -- pdlink-router and the real vllm-router pick the same workers (consistent_hash).

Both routers stand in front of the same pdlink-nodes (3 prefills, 2 decodes; every registration is
copied to both by zmq_relay.py), run consistent_hash for both roles, and get the same requests: plain
and streamed completions, chats, token-id prompts, prompt arrays, float sampling fields that serde
widens from f32, unknown keys, and user/session fields that become the hash key. For each request the
(prefill, decode) pair each router chose is read from the response id, which carries the request id
the router built (___prefill_addr_{P}___decode_addr_{D}_…): the pairs must be equal, request by request.
The answers must be equal too, and the workload must have used more than one prefill and one decode, so
that agreement is not trivial.
"""
import json

import pdcluster


def workload():
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    out = []
    for i in range(24):
        prompt = " ".join(words[(i + j) % len(words)] for j in range(3 + i % 7)) + f" #{i}"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 4 + i % 3}
        if i % 4 == 1:
            body["temperature"] = 0.7
            body["top_p"] = 0.95
        if i % 4 == 2:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if i % 6 == 3:
            body["stop"] = ["\n"]
            body["seed"] = 1234
        out.append(("/v1/completions", body))
        out.append(("/v1/chat/completions",
                    {"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                                   {"role": "user", "content": prompt}],
                     "max_tokens": 3, "temperature": 0}))
    out.append(("/v1/completions", {"model": "tiny", "prompt": [1, 2, 3, 4], "max_tokens": 2}))
    out.append(("/v1/completions", {"model": "tiny", "prompt": ["one two three"], "max_tokens": 2,
                                    "x_custom": {"b": 1, "a": [0.5, 1e-6]}}))
    for u in ("alice", "bob", "carol", "dave"):
        out.append(("/v1/completions", {"model": "tiny", "prompt": "same prompt", "max_tokens": 2, "user": u}))
        out.append(("/v1/completions", {"model": "tiny", "prompt": "same prompt", "max_tokens": 2,
                                        "session_params": {"session_id": "s-" + u}}))
    return out


def answer(code, text, stream):
    assert code == 200, f"status {code}: {text[:300]}"
    if not stream:
        j = json.loads(text)
        c = j["choices"][0]
        return j["id"], c.get("text", (c.get("message") or {}).get("content"))
    rid, parts = None, []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            j = json.loads(line[6:])
            rid = rid or j["id"]
            for c in j["choices"]:
                parts.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
    return rid, "".join(parts)


def test_same_workers_as_vllm_router():
    with pdcluster.Cluster("hash-parity") as c:
        ours = c.pdlink_router("consistent_hash")
        real = c.vllm_router()
        c.pd([ours, real], [2, 2, 2], [2, 2])
        prefills, decodes = set(), set()
        for path, body in workload():
            stream = bool(body.get("stream"))
            rid_o, text_o = answer(*pdcluster.http("POST", ours.url + path, body), stream)
            rid_r, text_r = answer(*pdcluster.http("POST", real.url + path, body), stream)
            pair_o, pair_r = pdcluster.pair_of(rid_o), pdcluster.pair_of(rid_r)
            assert pair_o == pair_r, f"{path} {body}: pdlink-router chose {pair_o}, vllm-router {pair_r}"
            assert text_o == text_r, f"{path} {body}: answers differ: {text_o!r} vs {text_r!r}"
            prefills.add(pair_o[0])
            decodes.add(pair_o[1])
        assert len(prefills) >= 2 and len(decodes) >= 2, (prefills, decodes)
        assert c.kv_checks() > 0
