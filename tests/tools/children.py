#!/usr/bin/python3
"""children.py -- the tests' child processes that report back on a queue, the parent's wait, and the
parent's cleanup.

A child's body wrapped by `reporting` sends ("error", traceback) to the parent instead of dying
silently, so the parent's `get` fails at once with the child's own traceback; `get` also fails when a
child exited non-zero, and after `wait_s` with nothing (a generous bound for a condition, never asserted
as a duration). `reaped` ends every child whatever happens, and requires that each exited 0.
"""
import contextlib
import time
import traceback
from typing import Any, Iterator, List


def reporting(fn: Any) -> Any:
    """Run a child's body fn(q_out, *args); an exception goes to the parent as ("error", traceback)."""
    def run(q_out: Any, *args: Any) -> None:
        try:
            fn(q_out, *args)
        except BaseException:
            q_out.put(("error", traceback.format_exc()))
            raise
    run.__name__ = fn.__name__
    return run


def get(q: Any, procs: List[Any], what: str, wait_s: float) -> Any:
    """The next message on q; fails at once with the child's traceback, or when a child died."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            msg = q.get(timeout=0.2)
        except Exception:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"waiting for {what}: a child exited with {dead}"
            assert time.monotonic() < deadline, f"waiting for {what}: nothing after {wait_s} s"
            continue
        assert msg[0] != "error", f"{what}: child failed:\n{msg[1]}"
        return msg


@contextlib.contextmanager
def reaped(procs: List[Any], wait_s: float) -> Iterator[None]:
    """Runs the parent's body; kills every child if it raises. Then joins each child (killing one still
    alive after wait_s) and, when the body succeeded, asserts that every child exited 0."""
    try:
        yield
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.join(timeout=wait_s)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * len(procs)
