"""The CPUs pdlink's threads run on inside a vLLM worker: its parent's rather than the OpenMP binding of
the worker's main thread, which every thread started from it would inherit."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Set


def thread_cpus() -> Optional[Set[int]]:
    """The CPUs pdlink's threads may use in a vLLM worker: its parent's (vLLM's engine process, which
    vLLM does not bind, so what the user's taskset or cgroup allows) when they are more than this
    thread's, else None (nothing to widen, or no affinity calls on this platform)."""
    try:
        mine, parent = os.sched_getaffinity(0), os.sched_getaffinity(os.getppid())
    except (AttributeError, OSError):
        return None
    return set(parent) if parent > mine else None


@contextlib.contextmanager
def threads_unpinned(cpus: Optional[Set[int]]) -> Iterator[None]:
    """Run the body with this thread's CPU affinity widened to ``cpus`` (None: unchanged), then restore
    it. A thread starts with the affinity of the thread that creates it, and vLLM's CPU backend pins a
    worker's main thread -- the one calling the connector -- to its first OpenMP CPU (libgomp's binding
    under VLLM_CPU_OMP_THREADS_BIND, "auto" by default). pdlink's service, data and transfer threads
    started from it would all share that CPU with the forward passes and never move to an idle one or
    to the CPUs vLLM reserves for a KV connector (seen on a 2-vCPU VM: a prefill's data thread pinned
    so, a 256 KiB read waited 0.4-0.6 s for it)."""
    if not cpus:
        yield
        return
    mine = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:        # a cpuset that shrank since: keep the binding rather than fail a transfer
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)
