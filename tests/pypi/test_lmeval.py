"""test_lmeval.py -- lm-eval as the seed ran it (`lm_eval --model local-completions`, greedy) on the
repository's own task (tests/lmeval/pdlink_arith.yaml + the JSON lines make_pdlink_arith.py writes; no
hub, no tokenizer download: tokenizer_backend=None, tokenized_requests=False), against a single
pdlink-node and against P/D clusters behind pdlink-router and behind the real vllm-router.

The synthetic model does no arithmetic, so half of the targets are set to the single node's own greedy
first word (asked here with the exact prompt lm-eval sends, 0-shot) and the other half to a word it never
says: the single node must score exactly 0.5, and every P/D run must score exactly what the single
node scored, 0-shot and 3-shot (few-shot prompts are lm-eval's own, so that run only compares).
"""
import json
import os
import shutil
import subprocess
import sys

import pdcluster

HERE = os.path.dirname(os.path.abspath(__file__))
TASK_DIR = os.path.join(HERE, "..", "lmeval")
LM_EVAL = os.path.join(os.path.dirname(sys.executable), "lm_eval")
NEVER = "pdlink-never-says-this"


def make_task(tmp, answers):
    d = os.path.join(tmp, "task")
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(TASK_DIR, "pdlink_arith.yaml"), d)
    ans = os.path.join(tmp, "answers.json")
    json.dump(answers, open(ans, "w"))
    subprocess.run([sys.executable, os.path.join(TASK_DIR, "make_pdlink_arith.py"),
                    os.path.join(d, "pdlink_arith.jsonl"), "--answers", ans], check=True)
    return d


def lm_eval(task_dir, base_url, out, fewshot=None):
    """Run the lm_eval command line; returns (exact_match, the printed table, {doc_id: raw responses})."""
    args = [LM_EVAL, "--model", "local-completions", "--model_args",
            f"model=tiny,base_url={base_url}/v1/completions,num_concurrent=4,max_retries=3,"
            "tokenized_requests=False,tokenizer_backend=None",
            "--tasks", "pdlink_arith", "--include_path", task_dir, "--output_path", out, "--log_samples"]
    if fewshot is not None:
        args += ["--num_fewshot", str(fewshot)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HOME=os.path.join(out, "hf"), TOKENIZERS_PARALLELISM="false")
    p = subprocess.run(args, cwd=task_dir, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, f"lm_eval failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    files = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs if f.startswith("results_")]
    assert len(files) == 1, files
    res = json.load(open(files[0]))["results"]["pdlink_arith"]
    table = "\n".join(l for l in p.stdout.splitlines() if l.startswith("|"))
    samples = {}
    for r, _, fs in os.walk(out):
        for f in fs:
            if f.startswith("samples_"):
                for line in open(os.path.join(r, f)):
                    s = json.loads(line)
                    samples[s["doc_id"]] = s["resps"]
    assert len(samples) == 24, len(samples)
    return res["exact_match,first-word"], table, samples


def first_words(base_url, docs):
    """The model's greedy first word for each question, with the prompt lm-eval sends (0-shot)."""
    out = {}
    for d in docs:
        body = {"model": "tiny", "prompt": [f"Question: {d['question']}\nAnswer:"], "max_tokens": 8,
                "temperature": 0, "stop": ["\n\n", "Question:"], "seed": 1234}
        code, text = pdcluster.http("POST", base_url + "/v1/completions", body)
        assert code == 200, text
        out[d["id"]] = json.loads(text)["choices"][0]["text"].split()[0]
    return out


def test_lmeval_pd_equals_single_node():
    sys.path.insert(0, TASK_DIR)
    import make_pdlink_arith
    docs = make_pdlink_arith.questions()
    scores, samples, tables = {}, {}, []
    runs = {"single": (0, 3), "pdlink": (0,), "vllm": (0, 3)}
    with pdcluster.Cluster("lmeval-single") as c:
        single = c.node(2, None, 0, "single")
        words = first_words(single, docs)
        answers = {d["id"]: (words[d["id"]] if i % 2 == 0 else NEVER) for i, d in enumerate(docs)}
        task = make_task(c.tmp + "-task", answers)
        for shots in runs["single"]:
            scores[("single", shots)], t, samples[("single", shots)] = lm_eval(
                task, single, os.path.join(c.tmp, f"out{shots}"), shots)
            tables.append(f"single node (TP2), {shots}-shot\n{t}")
    assert scores[("single", 0)] == 0.5, scores
    for kind, p_tps, d_tps in (("pdlink", [4], [8]), ("vllm", [4, 4], [8])):
        with pdcluster.Cluster(f"lmeval-{kind}") as c:
            r = c.pdlink_router("consistent_hash") if kind == "pdlink" else c.vllm_router()
            c.pd([r], p_tps, d_tps)
            for shots in runs[kind]:
                scores[(kind, shots)], t, samples[(kind, shots)] = lm_eval(
                    task, r.url, os.path.join(c.tmp, f"out{shots}"), shots)
                tables.append(f"P/D TP{'+TP'.join(map(str, p_tps))} -> TP{d_tps[0]} behind {kind}-router, "
                              f"{shots}-shot\n{t}")
            assert c.kv_checks() > 0
    shutil.rmtree(os.path.dirname(task), ignore_errors=True)
    print("\n\n".join(tables))
    for kind, shots_list in runs.items():
        for shots in shots_list:
            assert scores[(kind, shots)] == scores[("single", shots)], scores
            assert samples[(kind, shots)] == samples[("single", shots)], (kind, shots)
