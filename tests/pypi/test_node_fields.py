"""test_node_fields.py -- the request fields lm-eval and the OpenAI clients send, on pdlink-node, as vLLM
answers them, and identical through a P/D pair (behind pdlink-router and behind the real vllm-router)
and on a single node: stop strings (finish_reason "stop", stop_reason, the text cut before the stop),
seed, echo, completions and chat logprobs, token-id prompts; on a single node also batched prompts and
n > 1. A stop string hit by the prefill's one token ends that leg without kv_transfer_params (vLLM's
producer only returns them for a length-capped request), and the decode then serves the request alone.
"""
import json

import pdcluster

# The synthetic tokenizer (src/node/synth.c): BOS is 1, a word is 100 + fnv1a64(word) % 50000.
BOS = 1


def word_token(w):
    h = 0xcbf29ce484222325
    for b in w.encode():
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return 100 + h % 50000


def strip(text):
    """A response without what legitimately differs (id, created, kv_transfer_params)."""
    if text.lstrip().startswith("data: "):
        chunks = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ") and l != "data: [DONE]"]
        for c in chunks:
            c.pop("id", None)
            c.pop("created", None)
            c.pop("kv_transfer_params", None)
        assert text.rstrip().endswith("data: [DONE]")
        return chunks
    j = json.loads(text)
    for k in ("id", "created", "kv_transfer_params"):
        j.pop(k, None)
    return j


PROMPT = "Natalia sold clips to 48 of her friends in April and then she sold half as many clips in May"


def cases(free_words):
    # A stop string that the free output contains (its third word), one that the first generated word
    # hits (the prefill stops), and one that never occurs.
    third, first = " " + free_words[2], free_words[0]
    base = {"model": "tiny", "prompt": PROMPT, "max_tokens": 8}
    return [
        dict(base, stop=[third], seed=1234, temperature=0),
        dict(base, stop=third),
        dict(base, stop=[first, "\n\n"]),
        dict(base, stop=["Question:"], seed=7),
        dict(base, stop=[third], min_tokens=5),
        dict(base, logprobs=3),
        dict(base, logprobs=1, echo=True, max_tokens=1),
        dict(base, echo=True),
        dict(base, stream=True, stop=[third]),
        dict(base, stream=True, logprobs=2),
        dict(base, stream=True, echo=True),
        {"model": "tiny", "prompt": [BOS] + [word_token(w) for w in PROMPT.split()], "max_tokens": 6},
        {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5, "logprobs": True,
         "top_logprobs": 2},
        {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6, "stop": [third]},
    ]


def path_of(body):
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def test_fields_pd_equals_single_node():
    with pdcluster.Cluster("node-fields") as c:
        single = c.node(2, None, 0, "single")
        code, text = pdcluster.http("POST", single + "/v1/completions",
                                    {"model": "tiny", "prompt": PROMPT, "max_tokens": 8})
        assert code == 200, text
        free = json.loads(text)["choices"][0]["text"]
        words = free.split()

        # Stop semantics on the single node, as vLLM has them.
        third = " " + words[2]
        j = json.loads(pdcluster.http("POST", single + "/v1/completions",
                                      {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "stop": [third]})[1])
        ch = j["choices"][0]
        assert ch["text"] == free[:free.index(third)] and ch["finish_reason"] == "stop", ch
        assert ch["stop_reason"] == third and j["usage"]["completion_tokens"] == 3, j
        # A token-id prompt of BOS + the words' ids is the text prompt.
        ids = {"model": "tiny", "prompt": [BOS] + [word_token(w) for w in PROMPT.split()], "max_tokens": 8}
        assert json.loads(pdcluster.http("POST", single + "/v1/completions", ids)[1])["choices"][0]["text"] == free
        # Batched prompts and n: choices prompt_index*n + j, identical greedy copies, usage summed.
        j = json.loads(pdcluster.http("POST", single + "/v1/completions",
                                      {"model": "tiny", "prompt": [PROMPT, "x y"], "max_tokens": 4, "n": 2})[1])
        assert [ch["index"] for ch in j["choices"]] == [0, 1, 2, 3], j
        assert j["choices"][0]["text"] == j["choices"][1]["text"] == " ".join([""] + words[:4])
        assert j["choices"][2]["text"] == j["choices"][3]["text"] != j["choices"][0]["text"]
        assert j["usage"]["completion_tokens"] == 16, j["usage"]
        # Echo and logprobs shapes.
        j = json.loads(pdcluster.http("POST", single + "/v1/completions",
                                      {"model": "tiny", "prompt": "a b", "max_tokens": 2, "echo": True,
                                       "logprobs": 2})[1])
        lp = j["choices"][0]["logprobs"]
        assert j["choices"][0]["text"].startswith("a b ")
        assert lp["tokens"][:3] == ["", "a", " b"] and lp["token_logprobs"][0] is None
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
        for tok, v, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
            assert v <= 0 and top[tok] == v and max(top.values()) == v and len(top) == 2

        reference = {}
        for body in cases(words):
            code, text = pdcluster.http("POST", single + path_of(body), body)
            assert code == 200, (body, text)
            reference[json.dumps(body, sort_keys=True)] = strip(text)

        for kind in ("pdlink", "vllm"):
            with pdcluster.Cluster(f"node-fields-{kind}") as pd:
                r = pd.pdlink_router("round_robin") if kind == "pdlink" else pd.vllm_router()
                pd.pd([r], [4], [8])
                for body in cases(words):
                    code, text = pdcluster.http("POST", r.url + path_of(body), body)
                    assert code == 200, (kind, body, text)
                    want = reference[json.dumps(body, sort_keys=True)]
                    assert strip(text) == want, f"{kind}: {body}:\n got  {strip(text)}\n want {want}"
                assert pd.kv_checks() > 0
