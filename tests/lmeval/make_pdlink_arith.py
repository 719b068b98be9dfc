#!/usr/bin/env python3
"""make_pdlink_arith.py -- write the pdlink_arith task's questions as JSON lines (stdlib only).

    make_pdlink_arith.py OUT.jsonl [--answers ANSWERS.json]

Each line is {"id", "question", "answer"}: a one-step word problem and its answer as a number word.
The synthetic model of pdlink-node does not do arithmetic (it answers words from a hash of the prompt's
KV), so a test that wants a score other than 0 passes --answers: a JSON object {id: word} that replaces
the answer of those ids (tests/pypi/test_lmeval.py gives half the ids the single node's own greedy first
word). The set is deterministic: the same file every time.
"""
import json
import sys

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
THINGS = [("Janet", "apples"), ("Tom", "miles"), ("Ana", "dollars"), ("Lee", "hours"), ("Sam", "trains")]


def questions(n=24):
    out = []
    for i in range(n):
        who, what = THINGS[i % len(THINGS)]
        a, b = 1 + (i * 7) % 5, (i * 3) % 5
        if i % 2:
            q = f"{who} has {NUMBERS[a + b]} {what} and gives away {NUMBERS[b]}. How many {what} are left?"
            ans = NUMBERS[a]
        else:
            q = f"{who} has {NUMBERS[a]} {what} and gets {NUMBERS[b]} more. How many {what} now?"
            ans = NUMBERS[a + b]
        out.append({"id": f"q{i:02d}", "question": q, "answer": ans})
    return out


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--answers"):
        sys.exit(__doc__)
    override = json.load(open(argv[3])) if len(argv) == 4 else {}
    with open(argv[1], "w") as f:
        for q in questions():
            if q["id"] in override:
                q["answer"] = override[q["id"]]
            f.write(json.dumps(q) + "\n")


if __name__ == "__main__":
    main(sys.argv)
